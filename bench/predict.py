"""Predicting speedups of workloads: against timed runs, on unseen categories, on open-ended prompts, and the
fidelity of the verify-cost curve the predictions price with.

Subcommands (each prints a table and ends with one JSON line):

    python bench/predict.py speed-validation [ARGS]
    python bench/predict.py unseen [ARGS]
    python bench/predict.py open-ended [ARGS]
    python bench/predict.py verify-cost [ARGS]

``python bench/predict.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, run_subcommand  # noqa: E402

from entropy_law.analysis import TraceAnalysis  # noqa: E402
from entropy_law.payoff.workload import DOES_NOT_PAY, PAYS, REPLAYED_FAMILY, verdict_right  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402


# --- speed-validation ------------------------------------------------------------------------------------------------

RECORD_ARMS = ("ar", "ngram", "ngram-ddtree16", "block-ddtree16")


def record(out: Path, per_category: int, seed: int, max_new_tokens: int, *, tasks_name: str, arms=RECORD_ARMS,
           within: int | None = None, break_lock: bool = False, policies: dict | None = None,
           gate: str | None = None, metadata: dict | None = None) -> None:
    """A timed recording of ``arms`` (``jobs.record.record_timed``, SmolLM2-135M) into ``out``: ``per_category``
    prompts of each category of ``tasks_name``, a seeded sample (of a seeded sample of ``within`` per category, where
    given: still random); ``policies``: each drafter's law policy file; ``metadata``: added to every run's."""
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.plan import Drafting, Limits
    from entropy_law.jobs.record import record_timed
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    tasks = load_tasks(tasks_name)
    if within is not None:
        tasks = sample_per_category(tasks, within, seed=seed)
    tasks = sample_per_category(tasks, per_category, seed=seed)
    print(f"{per_category} per category, seed {seed}", flush=True)
    policy = None
    if policies:
        from entropy_law.payoff.policy import load_policy
        loaded = {drafter: load_policy(path) for drafter, path in policies.items()}

        def policy(spec):  # the drafter's law policy, None for AR
            return loaded.get(spec.drafter)
    if gate is None:  # the ratio gate; the cost gate with a policy (which prices trees with its curve)
        gate = "ratio" if policy is None else "cost"
    record_timed(tasks, arms, out, load_target("smollm2-135m"), limits=Limits(max_new_tokens, warm_up_tokens=16),
                 break_lock=break_lock, log=lambda m: print(m, flush=True),
                 metadata={"seed": seed, "tasks": tasks_name, **(metadata or {})},
                 drafting=Drafting(gate=gate, policy=policy))


def speed_validation_arguments(parser) -> None:
    """The arguments of ``speed-validation``."""
    parser.add_argument("traces", nargs="?", default="data/traces_timed", help="trace folder with an AR arm")
    parser.add_argument("--record", metavar="OUT", default=None, help="record the timed trace set into OUT first")
    parser.add_argument("--per-category", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--within", type=int, default=None, metavar="K",
                   help="draw --per-category prompts from a seeded sample of K per category (a resumed, shortened "
                        "recording keeps the prompts it has)")
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--break-lock", action="store_true", help="--record: take over runs a killed recording left locked")
    parser.add_argument("--replayed", action="store_true",
                   help="also predict with each arm's drafter replayed over its own outputs (proposals.parquet beside "
                        "the arm's run.json) and law_exp_obs_ceil_drafttop fitted on --law-traces")
    parser.add_argument("--law-traces", default="data/traces",
                   help="with --replayed: traces of the same arms and target that recorded draft_top1_prob, with "
                        "replayed proposals (default data/traces)")


def run_speed_validation(args, parser) -> int:
    """Predicted vs measured decode speedup, and the break-even entropy vs where measured speedups cross 1.

    Two steps (``--record`` first, once; then the check, as often as wanted):

    - ``--record OUT``: decode a seeded sample of ``--per-category`` Spec-Bench prompts per category (not the
      first ones) with the AR baseline, the n-gram chain, n-gram DDTree16 and block DDTree16 arms through the
      one recording loop (``jobs.record.record_arms``: warm-up, arms interleaved per prompt in rotating order,
      every ``generate`` call timed by the CPU and the wall clock), one trace run per arm under ``OUT`` (each
      request's CPU-clock decode time is in the trace: ``requests.decode_cpu_ms``), and the per-call timings in
      ``OUT/timings.csv``. Set ``OMP_NUM_THREADS=1``: the CPU clock then counts one core's work.
    - the check (``TRACES``): ``TraceAnalysis.speedup_validation()`` per arm x category: the predicted speedup
      (the law and the cost model fitted on these traces, applied to each request's own entropies) next to the
      measured paired speedup (CPU clock where the trace has it), whether the prediction lies within +-10% of
      the measurement and inside its interval; then per arm the break-even entropy (interval) against the entropy
      where a logistic fit of "measured per-request speedup > 1" on the request's mean entropy crosses 0.5, and on
      one scale the workload break-even (each request priced on its own entropy sequence: ``payoff.workload``) against
      the same log-speedup line through the measured per-request speedups, with paired bootstrap intervals.

    Prints tables and ends with ONE JSON line. The timings come from the machine the traces were recorded on
    (run.json: device, cpu count); say whether it was shared.

        OMP_NUM_THREADS=1 python bench/predict.py speed-validation --record data/traces_timed --per-category 8 --seed 1   # ~25 min
        python bench/predict.py speed-validation data/traces_timed

    ``--record`` only records (then run the check). Record on an otherwise idle machine: the predicted speedup prices
    rounds by the CPU clock (``payoff.cost.cpu_scaled_timings``), which a busy machine inflates unevenly
    (``bench/results/predict-speed-validation.txt``: the same check on a recording made at load 4-10).
    """
    if args.record:
        # per_category: the seeded sample drawn from (a resumed, shortened recording keeps its first value)
        record(Path(args.record), args.per_category, args.seed, args.max_new_tokens, tasks_name="spec_bench",
               within=args.within, break_lock=args.break_lock,
               metadata={"per_category": args.within or args.per_category})
        return 0
    return validate(Path(args.traces), n_boot=args.n_boot, seed=args.seed,
                    law_traces=Path(args.law_traces) if args.replayed else None)


def replayed_validation(analysis, path: Path, law_traces: Path, *, n_boot: int, seed: int) -> dict:
    """Per timed arm, the prediction made from the drafter's replayed proposals over the arm's own outputs and the
    law in its confidence (``law_exp_obs_ceil_drafttop``, fitted on ``law_traces``: the arm's runs there recorded
    ``draft_top1_prob``): per category the predicted speedup (``TraceAnalysis.predict`` on the arm's own requests,
    in-sample) against the measured one, and the workload break-even priced the same way
    (``TraceAnalysis.workload(arm, law=, proposals=)``) against the measured crossing."""
    import numpy as np
    import pandas as pd

    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.workload import REPLAYED_FAMILY
    from entropy_law.traces.proposals import read_proposals
    from entropy_law.traces.reader import load_traces

    proposals, law_proposals = read_proposals(path), read_proposals(law_traces)
    if proposals is None or law_proposals is None:
        raise SystemExit(f"--replayed needs proposals.parquet in {path} and in {law_traces} "
                         "(bench/law.py proposals --write)")
    ref = TraceAnalysis(load_traces(law_traces), n_boot=n_boot, seed=seed, family=REPLAYED_FAMILY,
                        proposals=law_proposals)
    print(f"\nreplayed: each arm's drafter replayed over its own outputs ({path}/*/proposals.parquet), priced by "
          f"{REPLAYED_FAMILY} fitted on {law_traces} (all its categories; the same prompts may be among them)")
    cells, crossings = [], []
    for arm in analysis.arms:
        if arm not in ref.arms or not bool(analysis.runs.loc[analysis.runs["arm"] == arm, "timed"].any()):
            print(f"  {arm}: skipped (not in {law_traces}, or no timings)")
            continue
        law = ref.law(arm)
        runs = set(analysis.runs.loc[analysis.runs["arm"] == arm, "run_id"].astype(str))
        own = proposals.loc[proposals["run_id"].astype(str).isin(runs)]
        pred = analysis.predict(arm, analysis.arm_view(arm), law=law, proposals=own, transfer_error=float("nan"))
        measured = analysis.speedup(arm).set_index("category")
        for cat in analysis.categories:
            if cat not in pred.summary.index or cat not in measured.index:
                continue
            p, m = pred.summary.loc[cat], measured.loc[cat]
            err = float(p["predicted_speedup"]) / float(m["speedup"]) - 1
            cells.append(dict(arm=arm, category=cat, requests=int(m["requests"]), measured=float(m["speedup"]),
                              lo=float(m["lo"]), hi=float(m["hi"]), predicted=float(p["predicted_speedup"]),
                              predicted_lo=float(p["ci_low"]), predicted_hi=float(p["ci_high"]),
                              relative_error=err, within_10pct=bool(abs(err) <= 0.10),
                              inside_interval=bool(m["lo"] <= p["predicted_speedup"] <= m["hi"]),
                              predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                              observed_tokens_per_round=float(m["tokens_per_round"])))
        work = analysis.workload(arm, law=law, proposals=own).summary
        crossings.append(dict(arm=arm, workload_breakeven=float(work.loc["workload_breakeven_nats", "estimate"]),
                              workload_low=float(work.loc["workload_breakeven_nats", "ci_low"]),
                              workload_high=float(work.loc["workload_breakeven_nats", "ci_high"]),
                              measured_line=float(work.loc["measured_crossing_nats", "estimate"]),
                              measured_line_low=float(work.loc["measured_crossing_nats", "ci_low"]),
                              measured_line_high=float(work.loc["measured_crossing_nats", "ci_high"]),
                              predicted_slope=float(work.loc["predicted_slope", "estimate"]),
                              measured_slope=float(work.loc["measured_slope", "estimate"])))

    table = pd.DataFrame(cells)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    rated = table.loc[table["requests"] >= 5]
    tokens_error = rated["predicted_tokens_per_round"] / rated["observed_tokens_per_round"] - 1
    print(f"\nreplayed, >= 5 prompts: predicted within +-10% of measured in {int(rated['within_10pct'].sum())} of "
          f"{len(rated)} cells; inside the measured 95% interval in {int(rated['inside_interval'].sum())} of "
          f"{len(rated)}; median |relative error| {float(rated['relative_error'].abs().median()):.3f}; tokens per "
          f"round predicted {float(tokens_error.mean()):+.1%} against observed on average")
    for c in crossings:
        c["inside"] = bool(c["workload_low"] <= c["measured_line"] <= c["workload_high"])
        print(f"  {c['arm']}: predicted workload break-even {c['workload_breakeven']:.2f} [{c['workload_low']:.2f}, "
              f"{c['workload_high']:.2f}], measured line crosses 1 at {c['measured_line']:.2f} "
              f"[{c['measured_line_low']:.2f}, {c['measured_line_high']:.2f}]: "
              f"{'inside' if c['inside'] else 'outside'} the predicted interval; slope of log speedup per nat "
              f"predicted {c['predicted_slope']:.3f}, measured {c['measured_slope']:.3f}")

    def clean(v):  # JSON: no NaN / inf
        return v if not isinstance(v, float) or np.isfinite(v) else None

    return {"law_traces": str(law_traces), "family": REPLAYED_FAMILY, "cells_rated": len(rated),
            "within_10pct": int(rated["within_10pct"].sum()),
            "inside_measured_interval": int(rated["inside_interval"].sum()),
            "median_abs_relative_error": float(rated["relative_error"].abs().median()),
            "cells": [{k: clean(v) for k, v in r.items()} for r in cells],
            "crossing": [{k: clean(v) for k, v in r.items()} for r in crossings]}


def validate(path: Path, *, n_boot: int, seed: int, law_traces: Path | None = None) -> int:
    import numpy as np
    import pandas as pd

    from entropy_law.jobs.report import answer_lines, crossing_sentence
    from entropy_law.jobs.speed import format_speedup, paired_speedups
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.traces.reader import load_traces

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    traces = load_traces(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = TraceAnalysis(traces, n_boot=n_boot, seed=seed)
        check = analysis.speedup_validation()
        crossing = analysis.attempt("crossing_table")
        answer = answer_lines(analysis)
    runs = analysis.runs
    meta = [f"{r['arm']}: device {r.get('device')}, cpu_count {r.get('cpu_count')}, OMP_NUM_THREADS "
            f"{r.get('omp_num_threads')}, timed {r['timed']}, status {r.get('status')}" for _, r in runs.iterrows()]
    print(f"traces: {path}; {traces.requests['request_id'].nunique()} prompts; load average now {os.getloadavg()} "
          "(a shared machine: timings by the CPU clock of one thread)")
    print("\n".join(meta))
    print("\nthe answer:")
    print("\n".join(f"  {line}" for line in answer))
    print("\npredicted vs measured per arm x category (TraceAnalysis.speedup_validation; measured: paired, "
          f"{', '.join(sorted(set(check['clock'].dropna())))} clock of the rounds):")
    cols = ["arm", "category", "status", "requests", "measured", "lo", "hi", "verdict", "predicted",
            "relative_error", "within_10pct", "inside_interval", "cost_only_error"]
    print(check[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    rated = check.loc[check["measured"].notna() & check["predicted"].notna() & (check["requests"] >= 5)]
    within = int(rated["within_10pct"].astype(bool).sum())
    inside = int(rated["inside_interval"].astype(bool).sum())
    print(f"\n>= 5 prompts: predicted within +-10% of measured in {within} of {len(rated)} arm x category cells; "
          f"inside the measured 95% interval in {inside} of {len(rated)}; median |relative error| "
          f"{float(rated['relative_error'].abs().median()) if len(rated) else float('nan'):.3f}")
    cost_err = rated["cost_only_error"].abs()
    print(f"the cost model alone (each request's recorded rounds priced: TraceAnalysis.cost_error): max |error| "
          f"{cost_err.max():.3f}, "
          f"within +-10% in {int((cost_err <= 0.10).sum())} of {len(rated)} cells: the rest of the error is the law's")
    across = []  # one arm's cost model pricing another arm of the same drafter (entropy-law predict --budgets)
    for arm in analysis.arms:
        for other in analysis.same_drafter_arms(arm):
            got = analysis.attempt("cost_error", arm, other)
            if got.ok:
                across.append({"cost_model": arm, "rounds_of": other, "max_abs_error": got.value.attrs["max_abs_error"],
                               "mean_abs_error": float(got.value["relative_error"].abs().mean())})
    if across:
        print("\none arm's cost model pricing the recorded rounds of another arm of the same drafter (per category, "
              "against that arm's measured speedup; TraceAnalysis.cost_error(arm, rounds_of=)):")
        for r in across:
            print(f"  {r['rounds_of']} priced by {r['cost_model']}'s model: mean |error| {r['mean_abs_error']:.3f}, "
                  f"max {r['max_abs_error']:.3f}")
    cross_rows = []
    if crossing.ok:
        print("\nbreak-even vs the crossing of measured per-request speedups (logistic fit on mean entropy; the "
              "workload break-even and the measured log-speedup line on one scale):")
        for r in crossing.value.to_dict("records"):
            print(f"  {r['arm']}: {crossing_sentence(r)}")
            cross_rows.append({k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                               for k, v in r.items() if k in ("arm", "crossing_nats", "breakeven", "breakeven_low",
                                                               "breakeven_high", "inside", "requests",
                                                               "share_above_1", "reason", "workload_breakeven",
                                                               "workload_low", "workload_high", "measured_line",
                                                               "measured_line_low", "measured_line_high",
                                                               "workload_inside", "workload_agree")})
        print("\nper arm, the log-speedup lines on the request's mean entropy (TraceAnalysis.workload):")
        for arm in analysis.arms:
            work = analysis.attempt("workload", arm)
            if work.ok:
                s = work.value.summary
                print(f"  {arm}: predicted slope {s.loc['predicted_slope', 'estimate']:.3f} "
                      f"[{s.loc['predicted_slope', 'ci_low']:.3f}, {s.loc['predicted_slope', 'ci_high']:.3f}]"
                      + (f", measured {s.loc['measured_slope', 'estimate']:.3f} [{s.loc['measured_slope', 'ci_low']:.3f}, "
                         f"{s.loc['measured_slope', 'ci_high']:.3f}]; requests above 1: predicted "
                         f"{s.loc['predicted_share_paying', 'estimate']:.0%}, measured "
                         f"{s.loc['measured_share_paying', 'estimate']:.0%}" if "measured_slope" in s.index else ""))
    else:
        print(f"\ncrossing: {crossing.error}")
    timings_file = path / "timings.csv"
    whole = None
    if timings_file.is_file():  # the one speed routine on whole generate calls (prefill included), CPU clock
        timings = pd.read_csv(timings_file)
        whole = paired_speedups(timings, reference="ar", clock="cpu", seed=seed)
        print("\njobs.speed.paired_speedups on the recorded generate calls (CPU clock, prefill included):")
        for r in whole.to_dict("records"):
            print(f"  {r['arm']:<16}{r['category']:<16}{format_speedup(r)}; tokens/round {r['tokens_per_round']:.2f}, "
                  f"mismatches {r['mismatches']}")
    replayed = None
    if law_traces is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SmallSampleWarning et al.: the tables say it
            replayed = replayed_validation(analysis, path, law_traces, n_boot=n_boot, seed=seed)
    notes = sorted({str(w.message) for w in caught if "another machine" in str(w.message)})
    for n in notes:
        print(f"WARNING: {n}")
    print(json.dumps({
        "bench": "speed_validation", "traces": str(path), "prompts": int(traces.requests["request_id"].nunique()),
        "clock": sorted(set(check["clock"].dropna())), "cells_rated": len(rated), "within_10pct": within,
        "inside_measured_interval": inside,
        "median_abs_relative_error": float(rated["relative_error"].abs().median()) if len(rated) else None,
        "cost_only_max_abs_error": float(cost_err.max()) if len(rated) else None,
        "cells": [{k: (v if not isinstance(v, float) or np.isfinite(v) else None) for k, v in r.items()}
                  for r in check[cols].to_dict("records")],
        "crossing": cross_rows, "machine_warnings": notes, "replayed": replayed, "cost_model_across_arms": across,
        "load_average": os.getloadavg()}, default=str))
    return 0


# --- unseen ----------------------------------------------------------------------------------------------------------

right = verdict_right  # whether a verdict agrees with the measured interval (payoff.workload, shared with other benches)


def subset(traces, keep) -> SimpleNamespace:
    """The four tables restricted to the requests whose category ``keep(category)`` accepts (runs kept)."""
    out = {}
    for name in ("tokens", "rounds", "requests"):
        table = getattr(traces, name)
        if name == "rounds":  # rounds carry no category: by request
            ids = set(traces.requests.loc[keep(traces.requests["category"].astype(str)), "request_id"].astype(str))
            out[name] = table.loc[table["request_id"].astype(str).isin(ids)].reset_index(drop=True)
        else:
            out[name] = table.loc[keep(table["category"].astype(str))].reset_index(drop=True)
    return SimpleNamespace(runs=traces.runs, **out)


def unseen_arguments(parser) -> None:
    """The arguments of ``unseen``."""
    parser.add_argument("traces", nargs="?", default="data/traces_timed")
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replayed", action="store_true",
                        help="also predict with the drafter's replayed proposals and law_exp_obs_ceil_drafttop")
    parser.add_argument("--law-traces", default="data/traces",
                        help="with --replayed: traces of the same arms with recorded draft_top1_prob and replayed "
                             "proposals, for the law in the drafter's confidence (default data/traces)")
    parser.add_argument("--rounds", action="store_true",
                        help="also predict from the arm's rounds replayed exactly over the AR outputs (no law)")
    parser.add_argument("--context-match", action="store_true",
                        help="attach the context's copyability (rebuilt from the prompts with the runs' target's "
                             "tokenizer where not recorded): the drafted-depth model then reads it")
    parser.add_argument("--family", default=None,
                        help="the law that prices the workloads (default: the primary law, analysis."
                             "DEFAULT_FAMILY); e.g. law_exp_obs_ceil_top1, whose DP reads the target's top-1 "
                             "probability at every position of the AR run")


def run_unseen(args, parser) -> dict:
    """Will drafting pay on a category the tool never saw? Predicted from target entropies alone, against measured.

    For every drafting arm of a timed trace set (``data/traces_timed``: AR, n-gram chain, n-gram DDTree16 and block
    DDTree16 decoding the same 40 Spec-Bench prompts, interleaved, CPU clock) and every category c:

    1. hold c out of every run (the arm's and AR's): the law, the drafted-depth model, the cost model and t_AR are
       fitted on the other categories only;
    2. predict the arm's speedup on c from the AR run's target entropies of c (``TraceAnalysis.predict``: what a
       researcher has before drafting: an AR run of the new workload). Its verdict interval is widened by the
       transfer error, the largest leave-one-category-out |error| of tokens per round among the other categories;
    3. compare with the arm's measured paired speedup on c (all runs, CPU clock; ``TraceAnalysis.speedup``).

    With ``--replayed`` each prediction is made a second way, as ``entropy-law predict --replay`` makes it: the arm's
    drafter replayed over the AR run's outputs of the held-out category with the arm's ratio gate
    (``jobs.reference.workload_proposals``; loads the default target) gives the drafted depth at every position and,
    through ``law_exp_obs_ceil_drafttop``, the drafter's confidence; that law is fitted on ``--law-traces`` (recorded
    ``draft_top1_prob`` and replayed proposals; default ``data/traces``) without the held-out category, and the transfer
    error is its LOCO error with replayed depths there.

    With ``--rounds`` a third way, as ``entropy-law predict --replay-rounds`` makes it: the arm's rounds replayed
    exactly over the AR run's outputs of the held-out category (``jobs.reference.workload_rounds``: its tree, budget and
    gate; a drafter that proposes from the context decodes the same rounds on the same greedy output), priced by the
    cost model and t_AR fitted on the other categories, no law; the verdict's interval is widened by the cost model's
    largest error on the other categories given their recorded rounds (``TraceAnalysis.cost_error``).

    Reports per arm x category the predicted speedup, its interval and verdict, the measured speedup and interval,
    the relative error, and whether the verdict was right: "pays" is right where the measured interval lies above 1
    (wrong where it lies below), "does not pay" the reverse; "unclear" is never wrong, and is counted as no answer.
    Ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/predict.py unseen data/traces_timed
    """
    warnings.simplefilter("ignore")  # SmallSampleWarning et al.: the notes and the table say it
    family = {} if args.family is None else {"family": args.family}
    t0 = time.process_time()
    traces = load_traces(args.traces)
    if args.context_match:
        from entropy_law.jobs.reference import ensure_context_matches

        traces, rebuilt = ensure_context_matches(traces)
        source = f"rebuilt from the prompts with {rebuilt}'s tokenizer" if rebuilt else "as recorded"
        print(f"context's copyability {source}: the drafted-depth model reads it", flush=True)
    full = TraceAnalysis(traces, n_boot=args.n_boot, seed=args.seed, **family)
    ar_runs = set(full.runs.loc[full.runs["is_ar"], "run_id"])
    if not ar_runs:
        raise SystemExit(f"{args.traces} has no AR run: the workload's entropies come from one")
    print(f"traces {args.traces}: arms {full.arms}; categories {full.categories}; law {full.family}; "
          f"{args.n_boot} replicates (seed {args.seed})")
    replays, replayed_rounds = {}, {}
    if (args.replayed or args.rounds) and len(ar_runs) != 1:
        raise SystemExit("--replayed / --rounds replay the drafters over one AR run: the traces hold several")
    if args.replayed or args.rounds:
        import torch

        from entropy_law.decoding.loading import load_target
        from entropy_law.jobs.reference import workload_proposals, workload_rounds
        from entropy_law.traces.proposals import read_proposals

        torch.set_num_threads(1)
        target = load_target("smollm2-135m")
        ar_path = full.runs.loc[full.runs["is_ar"], "path"].iloc[0]
        if args.replayed:
            law_traces, law_proposals = load_traces(args.law_traces), read_proposals(args.law_traces)
            if law_proposals is None:
                raise SystemExit(f"--replayed: no proposals.parquet in {args.law_traces}")
        for arm in full.arms:  # the arm's drafter over the AR run's outputs, with the arm's gate
            arm_meta = json.loads((Path(full.runs.loc[full.runs["arm"] == arm, "path"].iloc[0]) / "run.json")
                                  .read_text())
            if args.replayed:
                replays[arm] = workload_proposals(ar_path, arm_meta, target)
                print(f"  {arm}: proposals replayed over {ar_path} with {replays[arm].attrs['gate']}", flush=True)
            if args.rounds:
                replayed_rounds[arm] = workload_rounds(ar_path, arm_meta, target)
                print(f"  {arm}: rounds replayed over {ar_path} with {replayed_rounds[arm].attrs['gate']}", flush=True)
    modes = ["entropy"] + (["replayed"] if args.replayed else []) + (["rounds"] if args.rounds else [])
    rows = []
    for mode, arm in [(m, a) for m in modes for a in full.arms]:
        measured = full.speedup(arm).set_index("category")
        for category in full.categories:
            train_traces = subset(traces, lambda c, held=category: c != held)
            held = subset(traces, lambda c, held=category: c == held)
            workload = SimpleNamespace(runs=held.runs.loc[held.runs["run_id"].isin(ar_runs)],
                                       tokens=held.tokens.loc[held.tokens["run_id"].isin(ar_runs)],
                                       rounds=held.rounds, requests=held.requests)
            held_ids = set(held.requests["request_id"].astype(str))
            if mode == "entropy":
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                pred = train.predict(arm, workload)
            elif mode == "rounds":  # the arm's rounds replayed over the held-out AR outputs, priced without a law
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                table = replayed_rounds[arm]
                pred = train.predict(arm, workload, rounds=table.loc[table["request_id"].astype(str).isin(held_ids)])
            else:  # the arm's drafter replayed over the held-out AR outputs
                # the law in the drafter's confidence needs recorded draft_top1_prob: from the law traces (the
                # same arm, without the held-out category), with its LOCO error there (replayed depths)
                ref = TraceAnalysis(subset(law_traces, lambda c, held=category: c != held), n_boot=args.n_boot,
                                    seed=args.seed, family=REPLAYED_FAMILY, proposals=law_proposals)
                accuracy = ref.loco(arm, "replayed").accuracy.loc["tokens_per_round"]
                train = TraceAnalysis(train_traces, n_boot=args.n_boot, seed=args.seed, **family)
                pred = train.predict(arm, workload, law=ref.law(arm),
                                     transfer_error=float(accuracy["max_abs_relative_error"]),
                                     proposals=replays[arm].loc[replays[arm]["request_id"].isin(held_ids)])
            p = pred.summary.loc[category]
            m = measured.loc[category] if category in measured.index else None
            m_speed, m_lo, m_hi = ((float(m["speedup"]), float(m["lo"]), float(m["hi"])) if m is not None
                                   else (np.nan, np.nan, np.nan))
            rows.append(dict(mode=mode, arm=arm, category=category, predicted=float(p["predicted_speedup"]),
                             ci_low=float(p["ci_low"]), ci_high=float(p["ci_high"]), low=float(p["low"]),
                             high=float(p["high"]), transfer_error=pred.transfer_error, verdict=p["verdict"],
                             predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                             measured=m_speed, measured_lo=m_lo, measured_hi=m_hi,
                             measured_tokens_per_round=float(m["tokens_per_round"]) if m is not None else np.nan,
                             relative_error=float(p["predicted_speedup"]) / m_speed - 1,
                             inside_widened=bool(p["low"] <= m_speed <= p["high"]),
                             inside_measured=bool(m_lo <= p["predicted_speedup"] <= m_hi),
                             right=right(p["verdict"], m_lo, m_hi)))
            print(f"  {mode:<8} {arm:<36} {category:<15} predicted {p['predicted_speedup']:.2f}x [{p['low']:.2f}, "
                  f"{p['high']:.2f}] {p['verdict']:<12} measured {m_speed:.2f}x [{m_lo:.2f}, {m_hi:.2f}]", flush=True)
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print()
        print(table.round(3).to_string(index=False))
    out = {"bench": "predict_unseen", "traces": str(args.traces), "family": full.family, "n_boot": args.n_boot,
           "seed": args.seed, "cpu_s": round(time.process_time() - t0, 1), "arms": {}}
    print()
    for (mode, arm), g in table.groupby(["mode", "arm"], sort=False):
        answered = g["verdict"].isin([PAYS, DOES_NOT_PAY])
        judged = g["right"].notna()
        summary = {"categories": len(g), "speedup_mean_abs_error": float(g["relative_error"].abs().mean()),
                   "speedup_max_abs_error": float(g["relative_error"].abs().max()),
                   "inside_widened": int(g["inside_widened"].sum()), "inside_measured": int(g["inside_measured"].sum()),
                   "answered": int(answered.sum()),
                   "right": int((g["right"] == True).sum()), "wrong": int((g["right"] == False).sum()),  # noqa: E712
                   "judged": int(judged.sum()), "transfer_error_mean": float(g["transfer_error"].mean()),
                   "tokens_per_round_mean_error": float((g["predicted_tokens_per_round"]
                                                         / g["measured_tokens_per_round"] - 1).mean())}
        out["arms"][arm if mode == "entropy" else f"{arm} ({mode})"] = summary
        print(f"{arm} ({mode}): speedup |error| mean {summary['speedup_mean_abs_error']:.1%} (max "
              f"{summary['speedup_max_abs_error']:.1%}); measured inside the widened interval in "
              f"{summary['inside_widened']} of {len(g)}, predicted inside the measured interval in "
              f"{summary['inside_measured']} of {len(g)}; verdicts given {summary['answered']} of {len(g)}, right "
              f"{summary['right']}, wrong {summary['wrong']} (judged where the measured interval excludes 1); "
              f"transfer error used {summary['transfer_error_mean']:.1%} on average; tokens/round predicted "
              f"{summary['tokens_per_round_mean_error']:+.1%} against the timed run on average")
    print(json.dumps(out))
    return out


# --- open-ended ------------------------------------------------------------------------------------------------------

def fit_reference_policy(drafter: str, out: Path, arm_traces: Path, context_match: bool = False) -> None:
    """Law policy parameters for ``drafter`` ("ngram" or "block") from its runs in ``data/traces`` (Spec-Bench, none
    of the open-ended prompts), its draft cost (one-token forwards per round) from ``arm_traces``' timed DDTree16 arm
    of the drafter: ``entropy_law.payoff.policy.fit_policy`` with its defaults; ``context_match``: with the copyability
    input (``jobs.reference.context_matches`` of each run, the prompts rebuilt from Spec-Bench)."""
    import warnings

    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.policy import fit_policy, save_policy
    from entropy_law.traces.reader import load_traces

    warnings.simplefilter("ignore")
    timed = TraceAnalysis(load_traces(arm_traces), n_boot=0)
    arm = next(a for a in timed.arms if a.startswith(drafter) and a.endswith("ddtree16"))
    cost = timed.cost_model(arm)
    draft_cost = cost.draft_ms / cost.ar_ms_per_token
    traces = load_traces(Path(__file__).resolve().parents[1] / "data" / "traces")
    runs = traces.runs
    ids = list(runs.loc[runs["drafter_id"].astype(str).str.startswith(drafter) & (runs["tree_policy"] == "ddtree"),
                        "run_id"])
    lengths = None
    if context_match:
        from entropy_law.decoding.loading import load_target
        from entropy_law.jobs.reference import context_matches

        lengths = context_matches(list(runs.loc[runs["run_id"].isin(ids), "path"]), load_target("smollm2-135m"),
                                  tasks="spec_bench")
    params = fit_policy(traces.filter(run_id=ids), draft_cost=draft_cost, context_match=lengths)
    params["notes"].append(f"draft_cost {draft_cost:.4f}: {arm}'s draft_ms / t_AR in {arm_traces} ({cost.clock} clock)")
    save_policy(params, out)
    print(f"{drafter} policy from {len(ids)} run(s) of data/traces ({params['fitted_on']['requests']} requests), "
          f"draft cost {draft_cost:.4f} forwards: {out}")


def law_check(arm_traces: Path, ar_path: Path, source, table, law_from: str, law_tasks: str | None, tasks: str | None,
              n_boot: int, seed: int, law_borrow: bool = False) -> dict:
    """The law's answer (``entropy-law predict --replay --law-from LAW_FROM``: the drafter's proposals replayed, the
    acceptance from a law fitted on ``law_from``) against the measured speedups of ``table``: with the law in the
    drafter's confidence alone (``REPLAYED_FAMILY``) and with the one the command now picks (``replayed_family``: +
    the context's copyability and the target's top-1 probability), each without and with the law's residual b on
    ``law_from``'s categories (``law.transfer.calibrated_transfer``; the command applies it)."""
    from types import SimpleNamespace

    import pandas as pd

    from entropy_law.commands.predict import replayed_laws
    from entropy_law.payoff.workload import REPLAYED_FAMILY, verdict_right
    from entropy_law.traces.reader import load_traces

    args = SimpleNamespace(workload=str(ar_path), arm_traces=str(arm_traces), law_from=law_from, law_tasks=law_tasks,
                           tasks=tasks, model=None, checkpoint=None, transfer_error=None, n_boot=n_boot, seed=seed,
                           law_borrow=law_borrow)
    arms = [a for a in source.arms if a in set(table["arm"])]
    rows, families = [], {}
    for forced in (REPLAYED_FAMILY, None):
        laws, workload = replayed_laws(args, source, arms, load_traces(ar_path), family=forced)
        for arm, (law, error, proposals, notes, calibration) in laws.items():
            families[forced or "picked"] = law.family.name
            for calibrated in (False, True):  # without and with the law's residual b (predict --replay: with)
                bias = calibration["bias"] if calibrated else 0.0
                band = error if calibrated else calibration["uncalibrated_error"]
                pred = source.predict(arm, workload, law=law, transfer_error=band, proposals=proposals,
                                      bias=bias).summary
                name = law.family.name + (" + b" if calibrated else "")
                for category, p in pred.iterrows():
                    m = table.loc[(table["arm"] == arm) & (table["category"] == category)]
                    if m.empty:
                        continue
                    m = m.iloc[0]
                    rows.append(dict(law=name, arm=arm, category=category, b=bias,
                                     predicted=float(p["predicted_speedup"]), low=float(p["low"]),
                                     high=float(p["high"]), verdict=p["verdict"], measured=float(m["measured"]),
                                     measured_lo=float(m["measured_lo"]), measured_hi=float(m["measured_hi"]),
                                     transfer_error=band,
                                     predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                                     measured_tokens_per_round=float(m["measured_tokens_per_round"])))
    law_table = pd.DataFrame(rows)
    law_table["relative_error"] = law_table["predicted"] / law_table["measured"] - 1
    law_table["tokens_per_round_error"] = (law_table["predicted_tokens_per_round"]
                                           / law_table["measured_tokens_per_round"] - 1)
    law_table["measured_inside_predicted"] = (law_table["measured"] >= law_table["low"]) & (
        law_table["measured"] <= law_table["high"])
    law_table["right"] = [verdict_right(v, lo, hi) for v, lo, hi in
                          zip(law_table["verdict"], law_table["measured_lo"], law_table["measured_hi"])]
    print(f"\nthe law's answer (entropy-law predict --replay --law-from {law_from}"
          + (f" --law-tasks {law_tasks}" if law_tasks else "") + "), against the same measured speedups:")
    with pd.option_context("display.width", 240, "display.max_columns", 30):
        print(law_table.drop(columns=["measured_lo", "measured_hi"]).round(3).to_string(index=False))
    out = {}
    for family, part in law_table.groupby("law", sort=False):
        cats = part.loc[part["category"] != "all"]
        out[family] = {"mean_abs_error": float(cats["relative_error"].abs().mean()),
                       "max_abs_error": float(cats["relative_error"].abs().max()),
                       "mean_signed_error": float(cats["relative_error"].mean()),
                       "tokens_per_round_mean_abs_error": float(cats["tokens_per_round_error"].abs().mean()),
                       "measured_inside_predicted": int(part["measured_inside_predicted"].sum()), "cells": len(part),
                       "right": int((part["right"] == True).sum()),  # noqa: E712
                       "wrong": int((part["right"] == False).sum())}  # noqa: E712
        o = out[family]
        print(f"{family}: per category speedup |error| mean {o['mean_abs_error']:.1%} (max {o['max_abs_error']:.1%}, "
              f"signed mean {o['mean_signed_error']:+.1%}), tokens per round |error| mean "
              f"{o['tokens_per_round_mean_abs_error']:.1%}; measured inside the widened interval in "
              f"{o['measured_inside_predicted']} of {o['cells']} cells (categories and overall); verdicts judged right "
              f"{o['right']}, wrong {o['wrong']}")
    return {"families": families, **out}


def replay_meta(mine: dict, source_meta: dict, measured, arm: str, arm_traces: Path, priced_by: str) -> dict:
    """The run.json whose rounds are replayed for the measured ``arm``: its own (``mine``: the drafter checkpoint,
    tree, budget and gate it was timed with), once it is checked that ``priced_by``'s cost model (``source_meta``:
    its run.json in ``arm_traces``) can price it: the same drafter configured alike but for its checkpoint (one
    checkpoint costs what another of the same shape does, the verify cost depends on the nodes verified; another
    shape costs otherwise), one checkpoint in the measured arm's runs, and a gate the replay can play (a cost gate
    with its stored curve: ``jobs.reference.arm_round_options``). Says where the checkpoint or the gate differ from
    ``priced_by``'s. Replaying ``priced_by``'s run.json instead would price rounds that were never timed."""
    from entropy_law.jobs.reference import arm_round_options
    from entropy_law.law.arms import run_checkpoints

    if mine.get("drafter_id") != source_meta.get("drafter_id"):
        raise SystemExit(f"{arm} ran drafter {mine.get('drafter_id')!r}, {priced_by} of {arm_traces} "
                         f"{source_meta.get('drafter_id')!r}: that arm's cost model does not price it")
    theirs = run_checkpoints(measured.runs.loc[measured.runs["arm"] == arm])
    if len(theirs) > 1:
        raise SystemExit(f"{arm} ran several drafter checkpoints ({theirs}): replay one run at a time")
    config, base = mine.get("drafter_config") or {}, source_meta.get("drafter_config") or {}
    differ = sorted(k for k in set(config) | set(base)
                    if k not in ("checkpoint", "checkpoint_sha256") and config.get(k) != base.get(k))
    if differ:
        raise SystemExit(f"{arm}: its drafter is configured otherwise than {priced_by} of {arm_traces} ({differ}), "
                         "not only another checkpoint: that arm's cost model does not price it; time it with AR")
    try:
        arm_round_options(mine)
    except ValueError as e:
        raise SystemExit(f"{arm}: {e}") from None
    if config.get("checkpoint_sha256") != base.get("checkpoint_sha256"):
        print(f"  {arm}: measured with the drafter checkpoint sha256:{str(config.get('checkpoint_sha256'))[:8]}, "
              f"{priced_by} of {arm_traces} ran sha256:{str(base.get('checkpoint_sha256'))[:8]}: the measured "
              f"checkpoint's rounds are replayed, priced by {priced_by}'s cost model (the same drafter shape)")

    def gate(meta):  # what the replay decides by, as arm_round_options reads it from the run.json
        options = arm_round_options(meta)[0]
        return ("the cost gate" if "verify_cost" in options
                else f"the ratio gate at {options['min_expected_accepted']} expected accepted drafts")

    if not mine.get("policy") and gate(mine) != gate(source_meta):
        print(f"  {arm}: ran {gate(mine)}, {priced_by} {gate(source_meta)}: replayed with its own")
    return mine


def check(path: Path, arm_traces: Path, n_boot: int, seed: int, law_from: str | None = None,
          law_tasks: str | None = None, tasks: str | None = None, law_borrow: bool = False) -> dict:
    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.analysis import SPEEDUP_BOOT, TraceAnalysis
    from entropy_law.payoff.cost import paired_speedup, paired_speedup_interval
    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import measure_verify_cost
    from entropy_law.payoff.policy import policy_arm_meta
    from entropy_law.payoff.workload import verdict_right
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.reader import load_traces

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # SmallSampleWarning: 3 prompts per category; the table says it
    t0 = time.process_time()
    traces = load_traces(path)
    measured = TraceAnalysis(traces, n_boot=n_boot, seed=seed)
    source = TraceAnalysis(load_traces(arm_traces), n_boot=n_boot, seed=seed)
    ar_runs = measured.runs.loc[measured.runs["is_ar"], "path"]
    if len(ar_runs) != 1:
        raise SystemExit(f"{path} needs exactly one AR run (the workload the prediction reads)")
    ar_path = Path(ar_runs.iloc[0])
    workload = load_traces(ar_path)
    target = load_target("smollm2-135m")
    print(f"workload: the AR run {ar_path} ({workload.requests['request_id'].nunique()} prompts, categories "
          f"{sorted(set(workload.requests['category']))}); arms and costs from {arm_traces}")
    rows = []
    meta_of = {a: read_run_json(Path(source.runs.loc[source.runs["arm"] == a, "path"].iloc[0]) / RUN_FILE)
               for a in source.arms}
    plans = []  # (arm measured in TRACES, the source arm whose cost model prices it, its run.json for the replay)
    measured_curve = None  # this machine's verify-cost curve, for a law policy's replay
    for arm in measured.arms:
        mine = read_run_json(Path(measured.runs.loc[measured.runs["arm"] == arm, "path"].iloc[0]) / RUN_FILE)
        if mine.get("policy"):  # a law policy: priced by --from's arm of its drafter, tree and budget
            same = [a for a, m in meta_of.items() if not m.get("policy") and all(
                m.get(k) == mine.get(k) for k in ("drafter_id", "tree_policy", "tree_budget"))]
            if not same:
                print(f"  {arm}: no arm of its drafter, tree and budget in {arm_traces} to price its policy, skipped")
                continue
            replay_meta(mine, meta_of[same[0]], measured, arm, arm_traces, same[0])
            params = {k: v for k, v in mine["policy"].items() if k != "verify_cost"}  # what the user had before
            if measured_curve is None:  # once, as the online run measured its own when it started
                measured_curve = measure_verify_cost(TargetAdapter(target.model)).to_config()
            # its drafter, tree and budget with the policy as a user had it before the run (its parameters, the
            # curve measured now), not the run's own stored curve: the check is of a prediction made beforehand
            base = {k: v for k, v in mine.items() if k != "policy"}
            variant, whence = policy_arm_meta(base, params, measured=measured_curve,
                                              cost=source.cost_model(same[0]), arm=arm)
            print(f"  {arm}: its law policy replayed over the AR run in place of {same[0]}'s gate, priced by "
                  f"{same[0]}'s cost model; the policy's curve: {whence}")
            plans.append((arm, same[0], variant))
            continue
        if arm in source.arms:
            plans.append((arm, arm, replay_meta(mine, meta_of[arm], measured, arm, arm_traces, arm)))
            continue
        # another budget of a DDTree arm of --from (entropy-law predict --budgets): replayed at the budget it ran
        same = [a for a, m in meta_of.items() if m.get("drafter_id") == mine.get("drafter_id")
                and m.get("tree_policy") == "ddtree" == mine.get("tree_policy")]
        if same:
            plans.append((arm, same[0], replay_meta(mine, meta_of[same[0]], measured, arm, arm_traces, same[0])))
        else:
            print(f"  {arm}: no arm of its drafter and tree in {arm_traces} to price it, skipped")
    for arm in source.arms:
        if arm not in measured.arms:
            print(f"  {arm}: not decoded in {path}, skipped")
    for arm, priced_by, meta in plans:
        rounds = workload_rounds(ar_path, meta, target)
        error = None if priced_by == arm and not meta.get("policy") else source.variant_error(priced_by)[0]
        pred = source.predict(priced_by, workload, rounds=rounds, transfer_error=error).summary
        got = measured.speedup(arm).set_index("category")
        paired = measured.paired_requests(arm)  # all its requests: the per-category cells' estimator, pooled
        times = (paired["ar_ms"].to_numpy(float), paired["ar_decoded"].to_numpy(float), paired["ms"].to_numpy(float),
                 paired["decoded"].to_numpy(float))
        lo, hi = paired_speedup_interval(*times, rng=np.random.default_rng(seed), n_boot=SPEEDUP_BOOT)
        overall = dict(speedup=float(paired_speedup(*times)), lo=float(lo), hi=float(hi), requests=len(paired),
                       tokens_per_round=float(paired["decoded"].sum() / paired["rounds"].sum()))
        for category, p in pred.iterrows():
            if category == "all":
                m = overall
            elif category in got.index:
                m = got.loc[category]
            else:
                continue
            rows.append(dict(arm=arm, priced_by=priced_by, category=category, requests=int(m["requests"]),
                             predicted=float(p["predicted_speedup"]), low=float(p["low"]), high=float(p["high"]),
                             verdict=p["verdict"], measured=float(m["speedup"]), measured_lo=float(m["lo"]),
                             measured_hi=float(m["hi"]),
                             predicted_tokens_per_round=float(p["predicted_tokens_per_round"]),
                             measured_tokens_per_round=float(m["tokens_per_round"])))
    table = pd.DataFrame(rows)
    table["relative_error"] = table["predicted"] / table["measured"] - 1
    table["predicted_inside_measured"] = (table["predicted"] >= table["measured_lo"]) & (
        table["predicted"] <= table["measured_hi"])
    table["measured_inside_predicted"] = (table["measured"] >= table["low"]) & (table["measured"] <= table["high"])
    table["right"] = [verdict_right(v, lo, hi)
                      for v, lo, hi in zip(table["verdict"], table["measured_lo"], table["measured_hi"])]
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    cats = table.loc[table["category"] != "all"]
    overall = table.loc[table["category"] == "all"]
    out = {"bench": "predict_open_ended", "traces": str(path), "from": str(arm_traces), "n_boot": n_boot, "seed": seed,
           "cpu_s": round(time.process_time() - t0, 1), "cells": len(cats),
           "mean_abs_error": float(cats["relative_error"].abs().mean()),
           "max_abs_error": float(cats["relative_error"].abs().max()),
           "predicted_inside_measured": int(cats["predicted_inside_measured"].sum()),
           "measured_inside_predicted": int(cats["measured_inside_predicted"].sum()),
           "tokens_per_round_max_abs_error": float((cats["predicted_tokens_per_round"]
                                                    / cats["measured_tokens_per_round"] - 1).abs().max()),
           "overall": {r["arm"]: {k: r[k] for k in ("predicted", "low", "high", "verdict", "measured", "measured_lo",
                                                     "measured_hi", "right")} for r in overall.to_dict("records")},
           "right": int((table["right"] == True).sum()), "wrong": int((table["right"] == False).sum())}  # noqa: E712
    print(f"\nper category: speedup |error| mean {out['mean_abs_error']:.1%} (max {out['max_abs_error']:.1%}); "
          f"predicted inside the measured interval in {out['predicted_inside_measured']} of {len(cats)}, measured "
          f"inside the predicted one in {out['measured_inside_predicted']} of {len(cats)}; tokens per round off by at "
          "most "
          f"{out['tokens_per_round_max_abs_error']:.1%}; verdicts judged right {out['right']}, wrong {out['wrong']} "
          "(per category and overall, where the measured interval excludes 1)")
    if law_from:
        out["law"] = law_check(arm_traces, ar_path, source, table, law_from, law_tasks, tasks, n_boot, seed,
                               law_borrow)
    print(json.dumps(out, default=lambda v: None if v is None else bool(v) if isinstance(v, np.bool_) else float(v)))
    return out


def open_ended_arguments(parser) -> None:
    """The arguments of ``open-ended``."""
    parser.add_argument("traces", nargs="?", default="data/traces_open_timed", help="the timed open-ended recording")
    parser.add_argument("--from", dest="arm_traces", default="data/traces_timed",
                   help="the arms whose costs price the prediction (timed with AR on this machine)")
    parser.add_argument("--record", metavar="OUT", default=None, help="record the open-ended set into OUT first")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--tasks", default="open_ended",
                   help="--record: the prompts, 'open_ended' (default) or a JSONL file of other categories (e.g. "
                        "data/probe/probe.jsonl)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--arms", default=",".join(RECORD_ARMS),
                   help="--record: the arms to record (default %(default)s); an n-gram DDTree arm at another budget "
                        "(ngram-ddtree4, ngram-ddtree8) is then priced by --from's DDTree arm of that drafter, as "
                        "entropy-law predict --budgets prices it")
    parser.add_argument("--policy", action="append", default=[], metavar="DRAFTER=FITTED.json",
                   help="--record: run the drafter's arms (ngram, block) with this law policy in place of the gate")
    parser.add_argument("--law-from", default=None, metavar="TRACES",
                   help="the check: also the law's answer (entropy-law predict --replay --law-from TRACES), with "
                        "the law in the drafter's confidence alone and with the one the command picks (+ the "
                        "copyability), each without and with the law's residual b")
    parser.add_argument("--law-tasks", default=None, help="with --law-from: the prompts its runs decoded (spec_bench for "
                                                      "data/traces, whose run.json names none)")
    parser.add_argument("--law-borrow", action="store_true",
                   help="with --law-from: apply its law to arms of another drafter checkpoint (entropy-law predict "
                        "--law-borrow; the open-ended sets' block arms ran the sixth checkpoint, data/traces' the "
                        "default one)")
    parser.add_argument("--gate", choices=("ratio", "cost"), default=None,
                   help="--record: the drafting arms' gate (cost: this machine's verify-cost curve, measured at the "
                        "start); default ratio, cost with a --policy (which needs the curve)")
    parser.add_argument("--fit-policy", choices=("ngram", "block"), default=None,
                   help="write the drafter's law policy, fitted on data/traces, to --out and stop")
    parser.add_argument("--out", default=None, help="--fit-policy: the parameters' file")
    parser.add_argument("--context-match", action="store_true",
                   help="--fit-policy: with the copyability input (the law per level of the context's suffix match)")


def run_open_ended(args, parser) -> int:
    """Will drafting pay on categories never seen? Predicted from an AR run alone, then measured on the same prompts.

    Two steps (``--record`` first, once; then the check, as often as wanted):

    - ``--record OUT``: decode ``--per-category`` seeded open-ended prompts per category (``data/open_ended``: writing,
      role-play, opinion, brainstorming, coding, explanations; none of them in the Spec-Bench traces the costs come from)
      with AR, the n-gram chain, n-gram DDTree16 and block DDTree16 through the one recording loop
      (``jobs.record.record_arms``: warm-up, arms interleaved per prompt in rotating order, CPU and wall clock), one run
      per arm under ``OUT``, per-call timings in ``OUT/timings.csv``. Set ``OMP_NUM_THREADS=1`` and record on an idle
      machine.
    - the check (``TRACES``, default ``data/traces_open_timed``): for every drafting arm of ``--from`` (default
      ``data/traces_timed``: its costs measured on other prompts, another day), the rounds of the arm as it was measured in
      ``TRACES`` (its own run.json: drafter checkpoint, tree, budget and gate; ``replay_meta`` checks that ``--from``'s arm
      can price it) replayed over the AR run of ``TRACES`` (``jobs.reference.workload_rounds``; loads the default target)
      and priced by ``--from``'s arm's cost model
      (``TraceAnalysis.predict(rounds=)``, as ``entropy-law predict --replay-rounds``), per category and overall; next
      to it the speedup the same arm measured on the same prompts in ``TRACES`` (paired with AR, decode time on the CPU
      clock, ``TraceAnalysis.speedup``; overall: the same estimator and interval over all its requests), and its
      tokens per round. A verdict is judged right or wrong only where the measured interval excludes 1. An arm of
      ``TRACES`` that ``--from`` lacks but that is a DDTree of the same drafter at another budget (``--arms
      ar,ngram-ddtree4,ngram-ddtree8``) is replayed at its budget and priced by ``--from``'s DDTree arm, widened by
      ``TraceAnalysis.variant_error``: the check of ``entropy-law predict --budgets``. An arm of ``TRACES`` recorded with
      a law policy (``--record ... --policy ngram=FITTED.json``: its parameters in its run.json) is replayed with those
      parameters over the AR run, with the verify-cost curve measured here (as the online run measured its own), and
      priced by the cost model of ``--from``'s arm of the same drafter, tree and budget
      (``payoff.policy.policy_arm_meta``), as ``entropy-law predict --policy`` prices it: the check of a policy priced before
      it ever ran (its skipped rounds without the drafter's time).

    Prints a table and ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/predict.py open-ended --record data/traces_open_timed --per-category 3 --seed 7
        OMP_NUM_THREADS=1 python bench/predict.py open-ended --record data/traces_probe --tasks data/probe/probe.jsonl
        OMP_NUM_THREADS=1 python bench/predict.py open-ended data/traces_probe --law-from data/traces --law-tasks spec_bench
        OMP_NUM_THREADS=1 python bench/predict.py open-ended
        python bench/predict.py open-ended --fit-policy ngram --out /tmp/ngram-policy.json   # from data/traces
        python bench/predict.py open-ended --fit-policy block --context-match --out /tmp/block-context.json
        OMP_NUM_THREADS=1 python bench/predict.py open-ended --record data/traces_open_policy --per-category 3         --seed 13 --arms ar,ngram-ddtree16,block-ddtree16 --policy ngram=/tmp/ngram-policy.json         --policy block=/tmp/block-policy.json
    """
    if args.fit_policy:
        if not args.out:
            raise SystemExit("--fit-policy needs --out FITTED.json")
        fit_reference_policy(args.fit_policy, Path(args.out), Path(args.arm_traces), args.context_match)
        return 0
    policies = {}
    for item in args.policy:
        drafter, _, path = item.partition("=")
        if drafter not in ("ngram", "block") or not path:
            raise SystemExit(f"--policy takes ngram=FITTED.json or block=FITTED.json, got {item!r}")
        policies[drafter] = path
    if args.record:
        record(Path(args.record), args.per_category, args.seed, args.max_new_tokens, tasks_name=args.tasks,
               arms=tuple(args.arms.split(",")), policies=policies, gate=args.gate)
        return 0
    check(Path(args.traces), Path(args.arm_traces), args.n_boot, args.seed, args.law_from, args.law_tasks,
          None if args.tasks == "open_ended" else args.tasks, args.law_borrow)
    return 0


# --- verify-cost -----------------------------------------------------------------------------------------------------

def ratio_interval(times: np.ndarray, plain: np.ndarray, rng: np.random.Generator, n_boot: int = 1000) -> tuple:
    """Median of ``times`` over the median of ``plain`` and a 95% percentile bootstrap interval (both resampled)."""
    point = float(np.median(times) / np.median(plain))
    boot = [np.median(rng.choice(times, len(times))) / np.median(rng.choice(plain, len(plain))) for _ in range(n_boot)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return point, float(lo), float(hi)


def verify_cost_arguments(parser) -> None:
    """The arguments of ``verify-cost``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])
    parser.add_argument("--limit", type=int, default=1, help="prompts per category of each set (default 1)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3, help="measurements of the curve (default 3)")
    parser.add_argument("--min-rounds", type=int, default=20, help="rounds a tree size needs to be compared")


def run_verify_cost(args, parser) -> dict:
    """Does the measured verify-cost curve say what the decoder's rounds cost? (the cost gate and the law policy
    decide by it).

    ``decoding.gate.measure_verify_cost`` times synthetic chain verifies at a fixed cache length before a run starts; the
    cost gate and the law policy then decide every round by that curve c(n) (a forward over n tokens, in one-token
    forwards). This bench compares it with what real decoding rounds cost on the same machine, in the same process:

    - real: the n-gram drafter decodes seeded prompts (``--limit`` per category of each set in ``--sets``) with DDTrees of
      budgets ``--budgets`` and every drafted node verified (no gate), so that trees of many sizes occur; for each tree
      size n (root + draft nodes) with at least ``--min-rounds`` rounds, the median of the rounds' verify times over the
      median plain step (rounds without a draft) of the same runs, with its 95% bootstrap interval (rounds resampled);
    - measured: ``measure_verify_cost`` ``--repeats`` times before decoding (its default settings and clock, as an online
      run measures it when it starts), interpolated at n as the decoder reads it; the median of the measurements and their
      range.

    Round timings are wall-clock milliseconds (``Round.verify_ms``) with one torch thread; on a shared machine run it
    while the other core is quiet. Prints a table per tree size and ends with ONE JSON line (the median and largest
    relative difference over the sizes with enough rounds).

        OMP_NUM_THREADS=1 python bench/predict.py verify-cost
    """

    import torch

    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
    from entropy_law.decoding.gate import measure_verify_cost
    from entropy_law.decoding.loading import load_target
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    t0 = time.process_time()
    target = load_target(args.model)
    tasks = [t for name in args.sets for t in sample_per_category(load_tasks(name), args.limit, seed=args.seed)]
    encoder = ARDecoder(target)
    prompts = [encoder.encode_prompt(t.messages()) for t in tasks]
    # measured before any decoding, as an online run measures it when it starts
    curves = [measure_verify_cost(TargetAdapter(target.model), seed=i) for i in range(args.repeats)]
    rows = []
    for budget in args.budgets:
        decoder = SpeculativeDecoder(target, NgramDrafter(), tree="ddtree", budget=budget,
                                     policy=RatioGate(min_expected_accepted=0.0))
        for ids in prompts:
            result = decoder.generate(ids, max_new_tokens=args.max_new_tokens)
            rows += [(budget, r.tree_nodes + 1, r.verify_ms) for r in result.rounds if r.round_index > 0]
    rounds = pd.DataFrame(rows, columns=["budget", "tokens", "verify_ms"])
    plain = rounds.loc[rounds["tokens"] == 1, "verify_ms"].to_numpy(float)
    if len(plain) < args.min_rounds:
        raise SystemExit(f"only {len(plain)} plain steps: decode more prompts (--limit)")
    rng = np.random.default_rng(0)
    table = []
    for n, part in rounds.loc[rounds["tokens"] > 1].groupby("tokens"):
        if len(part) < args.min_rounds:
            continue
        real, lo, hi = ratio_interval(part["verify_ms"].to_numpy(float), plain, rng)
        measured = [float(c(int(n))) for c in curves]
        mid = float(np.median(measured))
        table.append({"tokens": int(n), "rounds": len(part), "real": round(real, 3), "real_lo": round(lo, 3),
                      "real_hi": round(hi, 3), "measured": round(mid, 3), "measured_min": round(min(measured), 3),
                      "measured_max": round(max(measured), 3), "relative_difference": round(mid / real - 1, 3),
                      "inside": lo <= mid <= hi})
    out = pd.DataFrame(table).set_index("tokens")
    print(f"{len(tasks)} prompts ({', '.join(args.sets)}, {args.limit} per category, seed {args.seed}), "
          f"{args.max_new_tokens} new tokens, n-gram DDTree budgets {args.budgets} with every node verified; "
          f"plain step median {np.median(plain):.1f} ms over {len(plain)} rounds (wall clock, one thread)")
    for i, c in enumerate(curves):
        print(f"measured curve {i + 1} ({c.clock} clock): {c.describe()}")
    with pd.option_context("display.width", 200):
        print("\ncost of a verify over n tokens in one-token forwards: real rounds (median ratio, 95% bootstrap) "
              "against the measured curve (median of the measurements, range)")
        print(out.to_string())
    diff = out["relative_difference"].abs()
    result = {"bench": "verify_cost_fidelity", "model": args.model, "prompts": len(tasks), "seed": args.seed,
              "sizes_compared": len(out), "median_abs_difference": round(float(diff.median()), 3),
              "max_abs_difference": round(float(diff.max()), 3), "worst_size": int(diff.idxmax()),
              "inside_interval": int(out["inside"].sum()), "cpu_s": round(time.process_time() - t0, 1)}
    print(f"\nmeasured within {result['median_abs_difference']:.1%} of the real rounds' cost at the median size, at most "
          f"{result['max_abs_difference']:.1%} (n = {result['worst_size']}); inside the real interval at "
          f"{result['inside_interval']} of {len(out)} sizes")
    print(json.dumps(result))
    return result


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "speed-validation": (speed_validation_arguments, run_speed_validation),
    "unseen": (unseen_arguments, run_unseen),
    "open-ended": (open_ended_arguments, run_open_ended),
    "verify-cost": (verify_cost_arguments, run_verify_cost),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
