"""``entropy-law policy``: fit a per-round law policy for one drafting arm (``payoff.policy.fit_policy``, with the
AR runs beside it for the drafter's cost where timed) and save it, or combine two with ``--hybrid``. The file is what
``predict --replay-rounds --policy`` prices and ``record --policy law --policy-law`` decodes with.
"""

from __future__ import annotations

from pathlib import Path

ENTROPIES = (0.1, 1.0, 3.0)  # nats at which the summary shows the fitted first-depth acceptance
WINDOW = 4  # --window's default


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "policy", help="fit a per-round law policy for one drafting arm and save its parameters",
        description="Fit a per-round law policy for one drafting arm (or combine two with --hybrid) and write its "
                    "parameters for record --policy law and predict --policy. Details: docs/cli.md.")
    p.add_argument("traces", nargs="?", help="trace runs of the arm (and a timed AR run, for its draft cost)")
    p.add_argument("--hybrid", nargs=2, metavar=("NGRAM.json", "BLOCK.json"),
                   help="instead of fitting: combine the n-gram and block policies into the hybrid's (docs/cli.md)")
    p.add_argument("--drafter", metavar="ARM", help="the arm, e.g. 'ngram ddtree16' (default: the only drafting arm)")
    p.add_argument("--out", required=True, metavar="FITTED.json", help="where to write the parameters")
    p.add_argument("--draft-cost", type=float, metavar="X",
                   help="drafter time per drafting round in one-token forwards (default: measured against AR)")
    p.add_argument("--window", type=int, help=f"committed positions averaged into the entropy (default {WINDOW})")
    p.add_argument("--no-calibration", action="store_true", help="turn off the in-request calibration of the law")
    p.add_argument("--context-match", action="store_true",
                   help="fit per level of the context's copyability; rebuilds prompts with --model (docs/cli.md)")
    p.add_argument("--max-context-match", type=int, metavar="K", help="--context-match: match length cap (default 8)")
    p.add_argument("--min-level-trials", type=int, metavar="N", help="--context-match: trials per level (default 200)")
    p.add_argument("--model", help="--context-match: the target that decoded the runs (default: their model_id)")
    p.add_argument("--tasks", help="--context-match: the prompts' task file, where run.json names none")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the law layer loads only here
    import warnings

    import numpy as np

    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.policy import fit_policy, save_policy
    from entropy_law.traces.reader import load_traces

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists: pass --overwrite to replace it, or another --out")
    if args.hybrid is not None:
        return _combine(args, out)
    if args.traces is None:
        raise ValueError("give the TRACES to fit on (or --hybrid NGRAM.json BLOCK.json to combine two fitted policies)")
    window = WINDOW if args.window is None else args.window
    if window < 1:
        raise ValueError(f"--window must be >= 1 committed positions, got {window}")
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
    options = {"calibration_prior": None} if args.no_calibration else {}
    if args.context_match:
        options.update(context_match=_context_matches(traces, runs.loc[runs["arm"] == arm], args),
                       **({} if args.max_context_match is None else {"max_context_match": args.max_context_match}),
                       **({} if args.min_level_trials is None else {"min_level_trials": args.min_level_trials}))
    elif (args.max_context_match, args.min_level_trials, args.model, args.tasks) != (None, None, None, None):
        raise ValueError("--max-context-match, --min-level-trials, --model and --tasks go with --context-match")
    try:
        params = fit_policy(traces.filter(run_id=ids), drafter=drafter, window=window,
                            draft_cost=args.draft_cost, **options)
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
          f"({fitted['at_risk_trials']} drafted tokens at risk), window {params['window']}; decides in the information "
          f"set {params['information_set'].replace('_', ' ')}")
    print(f"first-depth acceptance at H_w = {' / '.join(f'{h:g}' for h in ENTROPIES)} nats: {shown}")
    print(f"draft cost {params['draft_cost']:.4f} one-token forwards per drafting round"
          + (" (given)" if args.draft_cost is not None else ""))
    if "context_match" in params:
        spec = params["context_match"]
        cell = int(np.argmin(np.abs(np.asarray(params["entropy_grid"]) - 1.0)))
        shown = ", ".join(f"{level}: {table[cell][0]:.2f}" for level, table in zip(spec["levels"], spec["acceptance"]))
        print(f"copyability (suffix-match length at the round start) levels {spec['levels']}; first-depth acceptance "
              f"at H_w = {params['entropy_grid'][cell]:.2g} nats by level: {shown}")
    for note in params["notes"]:
        print(f"  note: {note}")
    print(f"written to {out}")
    print(f"price it before running it: entropy-law predict WORKLOAD --from TIMED --replay-rounds --policy {out}")
    print(f"decode with it: entropy-law record --drafter ... --policy law --policy-law {out} ...")
    return 0


def _combine(args, out: Path) -> int:
    """``--hybrid``: the two drafters' law policies as the hybrid drafter's (``payoff.policy.hybrid_policy``)."""
    from entropy_law.payoff.policy import hybrid_policy, load_policy, save_policy

    fitting = (args.traces, args.drafter, args.draft_cost, args.window, args.max_context_match, args.min_level_trials,
               args.model, args.tasks)
    if any(value is not None for value in fitting) or args.context_match or args.no_calibration:
        raise ValueError("--hybrid combines two fitted policies: fit each with this command first (TRACES, --drafter, "
                         "--draft-cost, --window, --context-match, ... go there)")
    laws = [load_policy(path) for path in args.hybrid]
    for route, law, path in zip(("ngram", "block"), laws, args.hybrid):
        drafter = str(law.get("drafter_id"))
        if not drafter.startswith(route):
            raise ValueError(f"{path} is a law policy of drafter {drafter!r}; --hybrid takes the n-gram drafter's "
                             "first, then the block drafter's")
    params = hybrid_policy(*laws)
    save_policy(params, out)
    for route, law, path in zip(("n-gram", "block"), laws, args.hybrid):
        print(f"{route} drafter: {path} (drafter {law['drafter_id']}, law {law.get('family', 'as given')}, draft cost "
              f"{law['draft_cost']:.4f} one-token forwards per round)")
    print(f"hybrid drafter's policy written to {out}")
    print("decode with it: entropy-law record --drafter hybrid --tree ddtree --budget 32 --policy law "
          f"--policy-law {out} ...")
    return 0


def _context_matches(traces, arm_runs, args):
    """The copyability lengths at every output position of the arm's runs: their recorded ``context_match`` where
    every position has one, else (or with --model, --tasks or a longer --max-context-match) rebuilt from their
    prompts by ``jobs.reference.context_matches``."""
    from entropy_law.traces.stats import CONTEXT_MATCH_MAX

    tokens = traces.filter(run_id=list(arm_runs["run_id"])).tokens
    recorded = tokens[["run_id", "request_id", "position", "context_match"]]
    if (recorded["context_match"].notna().all() and len(recorded) and args.model is None and args.tasks is None
            and (args.max_context_match is None or args.max_context_match <= CONTEXT_MATCH_MAX)):
        print(f"copyability: the runs' recorded context_match column ({len(recorded)} positions)")
        return recorded.astype({"run_id": str, "request_id": str, "context_match": int})
    from entropy_law.jobs.reference import context_matches, runs_target

    target = runs_target(arm_runs, args.model)
    return context_matches(list(arm_runs["path"]), target, tasks=args.tasks, max_length=args.max_context_match)
