"""Do two demo runs on one machine agree? The demo's decode and speed measurement, twice, compared (issue #17).

Runs the demo's measurement twice on the same prompts (its defaults: ``--limit`` prompts per category drawn with
``--seed`` from the whole Spec-Bench set, 128 new tokens, arms AR, n-gram chain, block DDTree16), each through
the one recording loop (``jobs.record.record_arms``: warm-up, arms interleaved per prompt in rotating order) and
the one speed routine (``jobs.speed.paired_speedups``: CPU clock, paired per request, 95% interval from the
request bootstrap widened to Student t with few requests, physical bound, verdict), then per arm x category (and
all prompts together):

- the two speedups and intervals, whether the intervals overlap and whether each run's estimate lies inside the
  other run's interval;
- whether either run prints a speedup above its physical bound as a result (it must not).

Prints a table and ends with ONE JSON line. The report and the law fit of the demo are left out (they do not
change a measured speedup). Set ``OMP_NUM_THREADS=1`` on a shared machine.

    OMP_NUM_THREADS=1 python bench/demo_repeat.py | tee bench/results/demo_repeat.txt     # ~8 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(tasks, specs, target, out: Path, max_new_tokens: int, seed: int):
    from entropy_law.jobs.record import record_arms
    from entropy_law.jobs.speed import paired_speedups

    recorded = record_arms(tasks, specs, out, target, max_new_tokens=max_new_tokens, warm_up_tokens=16,
                           progress=False, run_metadata=lambda spec: {"seed": seed, "replayed": False,
                                                                      "arm": spec.name})
    ar = next(spec.name for spec in specs if not spec.drafts)
    timings = recorded.timings(ar)
    return paired_speedups(timings, reference=ar, clock="cpu", seed=seed), timings


def main(argv=None) -> int:
    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.arms import available_arms
    from entropy_law.jobs.demo import DEFAULT_ARMS, DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS
    from entropy_law.jobs.speed import format_speedup
    from entropy_law.prompts.text import load_tasks, sample_per_category

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="prompts per category (the demo's default)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timings-out", help="CSV of every run's per-request timings (to re-derive intervals later)")
    args = p.parse_args(argv)
    if args.repeats < 2:
        raise ValueError("--repeats must be at least 2 to compare runs")
    torch.set_num_threads(1)
    tasks = sample_per_category(load_tasks("spec_bench"), args.limit, seed=args.seed)
    specs, messages = available_arms(DEFAULT_ARMS)
    for m in messages:
        print(m)
    target = load_target("smollm2-135m")
    print(f"{len(tasks)} prompts ({args.limit} per category, seed {args.seed}), arms {[s.name for s in specs]}, "
          f"{args.max_new_tokens} new tokens, {args.repeats} runs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"load average {os.getloadavg()}", flush=True)
    runs, timings = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            t0 = time.perf_counter()
            speed, timed = measure(tasks, specs, target, Path(tmp) / f"run{i}", args.max_new_tokens, args.seed)
            runs.append(speed.assign(run=i))
            timings.append(timed.assign(run=i))
            print(f"run {i}: {time.perf_counter() - t0:.0f} s wall, load average {os.getloadavg()}", flush=True)
    table = pd.concat(runs, ignore_index=True)
    if args.timings_out:
        pd.concat(timings, ignore_index=True).to_csv(args.timings_out, index=False)
    rows = []
    for (arm, category), part in table.groupby(["arm", "category"], sort=False):
        part = part.sort_values("run")
        a, b = part.iloc[0], part.iloc[1]
        overlap = bool(max(a["lo"], b["lo"]) <= min(a["hi"], b["hi"])) if np.isfinite([a["lo"], b["lo"]]).all() else None
        cross = (bool(a["lo"] <= b["speedup"] <= a["hi"] and b["lo"] <= a["speedup"] <= b["hi"])
                 if np.isfinite([a["lo"], b["lo"]]).all() else None)
        printed_above = bool(((part["verdict"] == "measured") & (part["speedup"] > part["bound"] * 1.05)).any())
        rows.append(dict(arm=arm, category=category, requests=int(a["requests"]), run0=format_speedup(a.to_dict()),
                         run1=format_speedup(b.to_dict()), speedup0=float(a["speedup"]), speedup1=float(b["speedup"]),
                         intervals_overlap=overlap, each_inside_other=cross,
                         above_bound_verdicts=int((part["verdict"] == "above the physical bound").sum()),
                         above_bound_printed_as_result=printed_above))
    out = pd.DataFrame(rows)
    with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_colwidth", 60):
        print(out.drop(columns=["speedup0", "speedup1"]).to_string(index=False))
    rated = out.loc[out["intervals_overlap"].notna()]
    print(f"\nintervals overlap in {int(rated['intervals_overlap'].sum())} of {len(rated)} arm x category cells; each "
          f"estimate inside the other run's interval in {int(rated['each_inside_other'].sum())} of {len(rated)}; "
          f"speedups above the physical bound printed as a result: {int(out['above_bound_printed_as_result'].sum())}")
    print(json.dumps({"bench": "demo_repeat", "prompts": len(tasks), "limit": args.limit, "seed": args.seed,
                      "max_new_tokens": args.max_new_tokens, "cells": len(rated),
                      "intervals_overlap": int(rated["intervals_overlap"].sum()),
                      "each_inside_other": int(rated["each_inside_other"].sum()),
                      "above_bound_printed": int(out["above_bound_printed_as_result"].sum()),
                      "rows": out.to_dict("records"), "load_average": os.getloadavg()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
