"""``entropy-law policy``: fit a per-round law policy for one drafting arm and write its parameters.

``entropy_law.law.policy.fit_policy`` on the arm's runs of TRACES (with the AR runs beside them, for the drafter's
cost in one-token forwards where the runs are timed; else ``--draft-cost``), saved with ``save_policy``. The file is
what ``entropy-law predict --replay-rounds --policy`` prices before the policy ever runs and what ``entropy-law record
--policy law --policy-law`` decodes with.
"""

from __future__ import annotations

from pathlib import Path

ENTROPIES = (0.1, 1.0, 3.0)  # nats at which the summary shows the fitted first-depth acceptance


def register(subparsers) -> None:
    p = subparsers.add_parser("policy", help="fit a per-round law policy for one drafting arm and save its parameters")
    p.add_argument("traces", help="trace runs of the arm (and, for its draft cost, a timed AR run on the same machine)")
    p.add_argument("--drafter", metavar="ARM",
                   help="the arm, e.g. 'ngram ddtree16' (default: the traces' only drafting arm)")
    p.add_argument("--out", required=True, metavar="FITTED.json", help="where to write the parameters")
    p.add_argument("--draft-cost", type=float, default=None, metavar="X",
                   help="the drafter's time per drafting round in one-token forwards (default: measured from the "
                        "arm's timed rounds against the AR run's)")
    p.add_argument("--window", type=int, default=4, help="committed positions averaged into the policy's entropy "
                                                          "(default %(default)s)")
    p.add_argument("--no-calibration", action="store_true",
                   help="turn off the in-request calibration of the law (default: on, 4 pseudo-drafts, half-life 16)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the law layer loads only here
    import warnings

    import numpy as np

    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.policy import fit_policy, save_policy
    from entropy_law.traces.reader import load_traces

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists: pass --overwrite to replace it, or another --out")
    if args.window < 1:
        raise ValueError(f"--window must be >= 1 committed positions, got {args.window}")
    if args.draft_cost is not None and not args.draft_cost >= 0:
        raise ValueError(f"--draft-cost must be >= 0 one-token forwards, got {args.draft_cost}")
    traces = load_traces(args.traces)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample notes of the analysis' other fits: not used here
        analysis = TraceAnalysis(traces, n_boot=0)
    arms = analysis.arms
    if args.drafter is None:
        if len(arms) != 1:
            raise ValueError(f"{args.traces} holds drafting arms {arms or 'none'}: pass --drafter, one of them")
        arm = arms[0]
    elif args.drafter in arms:
        arm = args.drafter
    else:
        raise ValueError(f"no drafting arm {args.drafter!r} in {args.traces}; arms: {', '.join(arms) or 'none'}")
    runs = analysis.runs
    ids = list(runs.loc[(runs["arm"] == arm) | runs["is_ar"], "run_id"])
    drafter = str(runs.loc[runs["arm"] == arm, "recorded_drafter_id"].iloc[0])
    try:
        params = fit_policy(traces.filter(run_id=ids), drafter=drafter, window=args.window,
                            draft_cost=args.draft_cost,
                            **({"calibration_prior": None} if args.no_calibration else {}))
    except ValueError as err:
        if args.draft_cost is None and "draft_cost" in str(err):
            raise ValueError(f"{err} (on the command line: --draft-cost X)") from err
        raise
    save_policy(params, out)
    grid = np.log(np.asarray(params["entropy_grid"]) + 1e-3)
    first = np.asarray(params["acceptance"])[:, 0]
    shown = " / ".join(f"{np.interp(np.log(h + 1e-3), grid, first):.2f}" for h in ENTROPIES)
    fitted = params["fitted_on"]
    print(f"law policy for {arm} (drafter {drafter}): law {params['family']} fitted on {fitted['requests']} requests "
          f"({fitted['at_risk_trials']} drafted tokens at risk), window {params['window']}")
    print(f"first-depth acceptance at H_w = {' / '.join(f'{h:g}' for h in ENTROPIES)} nats: {shown}")
    print(f"draft cost {params['draft_cost']:.4f} one-token forwards per drafting round"
          + (" (given)" if args.draft_cost is not None else ""))
    for note in params["notes"]:
        print(f"  note: {note}")
    print(f"written to {out}")
    print(f"price it before running it: entropy-law predict WORKLOAD --from TIMED --replay-rounds --policy {out}")
    print(f"decode with it: entropy-law record --drafter ... --policy law --policy-law {out} ...")
    return 0
