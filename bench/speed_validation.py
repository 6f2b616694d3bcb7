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
  one scale the workload break-even (each request priced on its own entropy sequence: ``law.workload``) against
  the same log-speedup line through the measured per-request speedups, with paired bootstrap intervals.

Prints tables and ends with ONE JSON line. The timings come from the machine the traces were recorded on
(run.json: device, cpu count); say whether it was shared.

    OMP_NUM_THREADS=1 python bench/speed_validation.py --record data/traces_timed --per-category 8 --seed 1   # ~25 min
    python bench/speed_validation.py data/traces_timed | tee bench/results/speed_validation.txt

``--record`` only records (then run the check). Record on an otherwise idle machine: the predicted speedup prices
rounds by the CPU clock (``law.cost.cpu_scaled_timings``), which a busy machine inflates unevenly
(``bench/results/speed_validation_shared.txt``: the same check on a recording made at load 4-10).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECORD_ARMS = ("ar", "ngram", "ngram-ddtree16", "block-ddtree16")


def record(out: Path, per_category: int, max_new_tokens: int, seed: int, within: int | None = None,
           break_lock: bool = False) -> None:
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.record import record_timed
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    tasks = load_tasks("spec_bench")
    if within is not None:  # a seeded subsample of a seeded sample of `within` per category: still random
        tasks = sample_per_category(tasks, within, seed=seed)
    tasks = sample_per_category(tasks, per_category, seed=seed)
    print(f"{per_category} per category, seed {seed}", flush=True)
    # per_category: the seeded sample drawn from (a resumed, shortened recording keeps its first value)
    record_timed(tasks, RECORD_ARMS, out, load_target("smollm2-135m"), max_new_tokens=max_new_tokens,
                 break_lock=break_lock, log=lambda m: print(m, flush=True),
                 metadata={"seed": seed, "tasks": "spec_bench", "per_category": within or per_category})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="?", default="data/traces_timed", help="trace folder with an AR arm")
    p.add_argument("--record", metavar="OUT", default=None, help="record the timed trace set into OUT first")
    p.add_argument("--per-category", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--within", type=int, default=None, metavar="K",
                   help="draw --per-category prompts from a seeded sample of K per category (a resumed, shortened "
                        "recording keeps the prompts it has)")
    p.add_argument("--n-boot", type=int, default=100)
    p.add_argument("--break-lock", action="store_true", help="--record: take over runs a killed recording left locked")
    p.add_argument("--replayed", action="store_true",
                   help="also predict with each arm's drafter replayed over its own outputs (proposals.parquet beside "
                        "the arm's run.json) and law_exp_obs_ceil_drafttop fitted on --law-traces")
    p.add_argument("--law-traces", default="data/traces",
                   help="with --replayed: traces of the same arms and target that recorded draft_top1_prob, with "
                        "replayed proposals (default data/traces)")
    args = p.parse_args(argv)
    if args.record:
        record(Path(args.record), args.per_category, args.max_new_tokens, args.seed, args.within, args.break_lock)
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

    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.workload import REPLAYED_FAMILY
    from entropy_law.traces.proposals import read_proposals
    from entropy_law.traces.reader import load_traces

    proposals, law_proposals = read_proposals(path), read_proposals(law_traces)
    if proposals is None or law_proposals is None:
        raise SystemExit(f"--replayed needs proposals.parquet in {path} and in {law_traces} "
                         "(bench/replayed_proposals.py --write)")
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
    from entropy_law.law.analysis import TraceAnalysis
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


if __name__ == "__main__":
    sys.exit(main())
