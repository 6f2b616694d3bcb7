"""Fitting the law on a fleet of runs out of core: many runs on disk, DuckDB over their shards, one fit.

Generates ``--runs`` trace runs holding ``--rows`` token rows in all (simulated from a known law,
``entropy_law.law.simulate.simulate_traces``: one chain drafter, five categories, ``--tokens`` output tokens
per request; written through ``TraceRecorder.log_columns`` in shards of ``--requests-per-shard`` requests,
request ids unique across the fleet; all runs one arm), then times, each in a fresh child process so that
its peak RSS is its own:

- **out of core**: what ``entropy_law.law.outofcore.fit_law_out_of_core`` does, in its two steps, each timed:
  the SQL of ``docs/out-of-core.md`` run by DuckDB over groups of shards (``aggregate_at_risk_sql``), then
  ``fit_law`` on the cells; rows/s = token rows on disk / seconds;
- **in memory** on a subset of whole runs of at most ``--subset-rows`` rows: ``fit_law(load_traces(...))``,
  and the same subset out of core; their estimates and standard errors must agree within 1e-6.

The issue's goal: 10^8 token rows in >= 100 runs fitted in <= 5 min with <= 4 GB peak RSS, equal to the
in-memory fit on a 10^7-row subset within 1e-6:

    python bench/fleet.py --runs 100 --rows 100000000 --subset-rows 10000000 --out /data/fleet   # ~3.5 GB disk
    python bench/fleet.py --runs 100 --rows 2000000                                               # a quick look

The fleet goes to ``--out`` (default: a temporary folder, removed at the end unless ``--keep``); the free
disk is checked first (about 40 bytes per token row). Ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BYTES_PER_ROW = 40  # tokens + rounds + requests files per token row, zstd (measured: ~35)


def generate(out: Path, *, runs: int, rows: int, tokens: tuple[int, int], requests_per_shard: int, seed: int,
             subset_rows: int) -> dict:
    """The fleet under ``out``: the first runs, up to ``subset_rows`` token rows, in ``out/subset`` (the in-memory
    comparison), the others in ``out/rest``."""
    from entropy_law.law.simulate import simulate_traces
    from entropy_law.traces.recorder import TraceRecorder

    per_run = rows / runs
    mean_tokens = sum(tokens) / 2
    per_category = max(1, int(round(per_run / mean_tokens / 5)))
    total, rest = 0, False
    for index in range(runs):
        run_id = f"fleet-{index:04d}"
        sim = simulate_traces(seed=seed + index, n_requests_per_category=per_category, tokens_per_request=tokens,
                              block_size=8, category_effects={"qa": 0.2, "math_reasoning": -0.3})
        frames = {name: getattr(sim, name).assign(run_id=run_id) for name in ("tokens", "rounds", "requests")}
        for frame in frames.values():  # unique request ids across the fleet: one cluster per request
            frame["request_id"] = f"{run_id}/" + frame["request_id"].astype(str)
        ids = frames["requests"]["request_id"].to_numpy()
        folder = "subset" if total + len(frames["tokens"]) <= subset_rows and not rest else "rest"
        rest = rest or folder == "rest"
        with TraceRecorder(out / folder / run_id, run_id=run_id, model_id="simulated", drafter_id="sim-block",
                           drafter_config={"block_size": 8}, tree_policy="chain", dtype="float32", device="none",
                           seed=seed + index) as rec:
            for start in range(0, len(ids), requests_per_shard):
                part = set(ids[start:start + requests_per_shard])
                rec.log_columns(**{name: {c: f.loc[f["request_id"].isin(part), c].to_numpy() for c in f.columns}
                                   for name, f in frames.items()})
        total += len(frames["tokens"])
    return {"token_rows": total, "runs": runs, "requests_per_category_per_run": per_category}


def child_fit(mode: str, path: str, family: str, threads: int | None, memory_limit: str | None) -> dict:
    """Run in a fresh process: one fit, its time and this process's peak RSS."""
    import warnings

    from entropy_law.law.fit import fit_law
    from entropy_law.law.outofcore import aggregate_at_risk_sql
    from entropy_law.traces.reader import load_traces

    warnings.simplefilter("ignore")  # SmallSampleWarning etc.: not what is measured here
    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB

    start = time.perf_counter()
    if mode == "out-of-core":  # fit_law_out_of_core in its two steps, each timed
        cells = aggregate_at_risk_sql(path, family, means="family", threads=threads, memory_limit=memory_limit)
    else:
        cells = load_traces(path, validate=False)
    step = {"seconds": time.perf_counter() - start, "peak_rss_bytes": peak(),
            "cells": len(cells) if mode == "out-of-core" else None}
    law = fit_law(cells, family)
    seconds = time.perf_counter() - start
    result = law.result
    return {"mode": mode, "seconds": seconds, "peak_rss_bytes": peak(), "n_rows": law.n_rows,
            "n_requests": law.n_requests, "params": result.params.to_dict(), "bse": result.bse.to_dict(),
            "first_step": step}


def run_child(args, mode: str, path: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--family", args.family, *(["--threads", str(args.threads)]
           if args.threads else []), *(["--memory-limit", args.memory_limit] if args.memory_limit else []), "--",
           str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} fit failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rows", type=float, default=2e6, help="token rows in all (default: %(default)g)")
    parser.add_argument("--tokens", type=int, nargs=2, default=(300, 700), help="output tokens per request")
    parser.add_argument("--requests-per-shard", type=int, default=50)
    parser.add_argument("--subset-rows", type=float, default=1e7, help="rows of the in-memory comparison")
    parser.add_argument("--family", default="law_exp")
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    parser.add_argument("--memory-limit", default=None, help="DuckDB memory limit, e.g. 2GB")
    parser.add_argument("--out", default=None, help="where the fleet goes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the fleet (and reuse one already in --out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("path", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child_fit(args.child, args.path, args.family, args.threads, args.memory_limit)))
        return 0

    rows = int(args.rows)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fleet-"))
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    if free < 2 * BYTES_PER_ROW * rows:
        print(f"{out}: {free / 1e9:.1f} GB free, the fleet needs about {BYTES_PER_ROW * rows / 1e9:.1f} GB (twice that "
              "free, to be safe); pass a smaller --rows or another --out", file=sys.stderr)
        return 2
    try:
        existing = sorted(out.glob("*/*/run.json"))
        start = time.perf_counter()
        if not (existing and args.keep):  # --keep with a fleet there: reuse it
            generate(out, runs=args.runs, rows=rows, tokens=tuple(args.tokens),
                            requests_per_shard=args.requests_per_shard, seed=args.seed,
                            subset_rows=int(args.subset_rows))
        generate_s = time.perf_counter() - start
        import pyarrow.parquet as pq

        def rows_under(folder: Path) -> int:
            return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*/shards/*/tokens.parquet"))

        run_dirs = sorted(p.parent for p in out.glob("*/*/run.json"))
        subset = sorted(p.parent for p in (out / "subset").glob("*/run.json"))
        disk = sum(f.stat().st_size for f in out.rglob("*.parquet"))
        total, size = rows_under(out / "subset") + rows_under(out / "rest"), rows_under(out / "subset")
        fleet = run_child(args, "out-of-core", out)
        memory = run_child(args, "in-memory", out / "subset")
        small = run_child(args, "out-of-core", out / "subset")
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    names = list(memory["params"])
    d_params = max(abs(small["params"][k] - memory["params"][k]) for k in names)
    d_bse = max(abs(small["bse"][k] - memory["bse"][k]) / abs(memory["bse"][k]) for k in names)
    print(f"fleet: {len(run_dirs)} runs, {total:,} token rows ({fleet['n_rows']:,} at risk, {fleet['n_requests']:,} "
          f"requests), {disk / 1e9:.2f} GB of Parquet; generated in {generate_s:.0f} s; {os.cpu_count()} cores, "
          "shared machine")
    print(f"{'fit':<34}{'rows':>14}{'seconds':>10}{'rows/s':>14}{'peak RSS':>12}")
    for label, res, n in ((f"out of core, all {len(run_dirs)} runs", fleet, total),
                          (f"in memory, {len(subset)} runs", memory, size),
                          (f"out of core, the same {len(subset)} runs", small, size)):
        print(f"{label:<34}{n:>14,}{res['seconds']:>10.1f}{n / res['seconds']:>14,.0f}"
              f"{res['peak_rss_bytes'] / 2**30:>10.2f} GB")
    step = fleet["first_step"]
    print(f"out of core, all runs, by step: SQL aggregation {step['seconds']:.1f} s ({total / step['seconds']:,.0f} "
          f"rows/s, {step['cells']:,} cells, peak {step['peak_rss_bytes'] / 2**30:.2f} GB), then fit_law on the cells "
          f"{fleet['seconds'] - step['seconds']:.1f} s (peak {fleet['peak_rss_bytes'] / 2**30:.2f} GB)")
    print(f"out of core vs in memory on {size:,} rows: max |d estimate| = {d_params:.1e}, max relative d SE = "
          f"{d_bse:.1e} ({'equal within 1e-6' if max(d_params, d_bse) <= 1e-6 else 'NOT equal within 1e-6'})")
    goal = total / fleet["seconds"] >= 1e8 / 300
    print(f"issue goal (1e8 rows in <= 300 s, <= 4 GB): this size runs at {total / fleet['seconds']:,.0f} rows/s "
          f"({'on pace' if goal else 'short of'} 333,333 rows/s), peak {fleet['peak_rss_bytes'] / 2**30:.2f} GB")
    print(json.dumps({"bench": "fleet", "runs": len(run_dirs), "token_rows": total, "at_risk_rows": fleet["n_rows"],
                      "parquet_bytes": disk, "family": args.family, "generate_s": generate_s,
                      "out_of_core": {k: fleet[k] for k in ("seconds", "peak_rss_bytes", "first_step")},
                      "rows_per_s": total / fleet["seconds"], "subset_rows": size,
                      "in_memory": {k: memory[k] for k in ("seconds", "peak_rss_bytes")},
                      "subset_out_of_core": {k: small[k] for k in ("seconds", "peak_rss_bytes")},
                      "max_abs_param_diff": d_params, "max_rel_se_diff": d_bse}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
