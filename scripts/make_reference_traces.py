#!/usr/bin/env python
"""Make the reference traces in data/traces/ (one command; resumable; sized by arguments).

    python scripts/make_reference_traces.py                        # 40 prompts per category, 256 new tokens
    python scripts/make_reference_traces.py --limit 80             # grow the same set to all 80 (resumes)
    nice python scripts/make_reference_traces.py --limit 2 --max-new-tokens 32 --out /tmp/ref   # a quick try

What it does (entropy_law/jobs/reference.py): each Spec-Bench prompt is decoded ONCE, greedily, with the
online n-gram drafter (recorded, timed) into OUT/ngram; the first --ar-limit prompts per category are
also decoded by our AR baseline (OUT/ar, timed, for measured speedups); then the other arms (n-gram
DDTree N=16, block drafter chain and DDTree N=16 if its checkpoint is present) are REPLAYED offline from
the same greedy outputs into OUT/<arm> (run metadata: replayed = true, replayed_from = the online run id;
0 ms timings). Stop it at any time and run the same command again to continue. Runs are written a shard per
prompt (a stop loses nothing finished); once the job ends, every complete run is compacted into shards of ~1,000
rounds (``entropy_law.traces.compact``: the same rows, about a quarter of the bytes; --no-compact to keep them).
Traces are zstd-compressed Parquet (trace format v1); check the size before committing them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.decoding.loading import load_target  # noqa: E402
from entropy_law.jobs.reference import (DEFAULT_REPLAY_ARMS, ReferencePlan, make_reference_traces,  # noqa: E402
                                        reference_limits)
from entropy_law.prompts.text import load_tasks  # noqa: E402
from entropy_law.traces.compact import compact_run  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "traces"),
                   help="trace folder (default: data/traces of this checkout)")
    p.add_argument("--limit", type=int, default=40, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all)")
    p.add_argument("--ar-limit", type=int, default=5,
                   help="prompts per category also decoded by AR for measured speedups; 0: none (default: %(default)s)")
    p.add_argument("--replay", nargs="*", default=list(DEFAULT_REPLAY_ARMS),
                   help="arms replayed offline (default: %(default)s)")
    p.add_argument("--verify-cost-ratio", type=float, default=2.0,
                   help="drafting gate: draft when expected accepted drafts >= this - 1 (default: %(default)s)")
    p.add_argument("--from-run", default=None,
                   help="use this complete run (recorded online by `entropy-law record --drafter ngram`) as the "
                        "greedy source instead of decoding again")
    p.add_argument("--model", default="smollm2-135m", help="target (default: %(default)s)")
    p.add_argument("--break-lock", action="store_true",
                   help="take over runs whose writer lock is stale (a killed earlier run of this job)")
    p.add_argument("--no-compact", action="store_true",
                   help="keep a shard per prompt (default: compact each complete run when the job ends)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.limit < 1:
        p.error("--limit >= 1 please")
    t0 = time.perf_counter()
    tasks = load_tasks("spec_bench", categories=args.categories, limit=args.limit)
    try:  # the plan and its rules (max_new_tokens, ar_limit, ...) before the model loads; the target after
        plan = ReferencePlan(tasks, None, args.out, reference_limits(args.max_new_tokens), replay_arms=args.replay,
                             ar_limit=args.ar_limit, verify_cost_ratio=args.verify_cost_ratio,
                             from_run=args.from_run, break_lock=args.break_lock)
    except ValueError as err:
        p.error(str(err))
    runs = make_reference_traces(replace(plan, target=load_target(args.model)), progress=not args.no_progress)
    if not args.no_compact:
        for arm, run in runs.items():
            done = compact_run(run)
            print(f"{arm}: {done['shards_before']} shards -> {done['shards_after']}")
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(f"reference traces in {args.out} ({size / 1e6:.1f} MB): {', '.join(runs)}; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
