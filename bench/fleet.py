"""Fitting the law on a fleet of runs out of core: many runs on disk, DuckDB over their shards, one fit.

Generates ``--runs`` trace runs holding ``--rows`` token rows in all (simulated from a known law,
``entropy_law.law.simulate.simulate_traces``: one chain drafter, five categories, ``--tokens`` output tokens
per request; written through ``TraceRecorder.log_columns`` in shards of ``--requests-per-shard`` requests,
request ids unique across the fleet; all runs one arm), then times, each in a fresh child process so that
its peak RSS is its own:

- **out of core**: ``entropy_law.law.outofcore.fit_law_out_of_core`` (the SQL of ``docs/out-of-core.md`` run
  by DuckDB over groups of shards, the cells to temporary Parquet files, then statsmodels' IRLS and CR1 sandwich
  streamed over the cells in batches); rows/s = token rows on disk / wall seconds;
- **in memory** on a subset of whole runs of at most ``--subset-rows`` rows: ``fit_law(load_traces(...))``,
  and the same subset out of core; their estimates and standard errors must agree within 1e-6;
- with ``--report``: the out-of-core report of the whole fleet (``jobs.report.write_report_out_of_core``, what
  ``entropy-law report --out-of-core`` writes: per-category summaries by DuckDB, the law, the acceptance figure).

The issue's goal: 10^8 token rows in >= 100 runs fitted in <= 5 min with <= 4 GB peak RSS, equal to the
in-memory fit on a 10^7-row subset within 1e-6:

    python bench/fleet.py --runs 100 --rows 100000000 --subset-rows 10000000 --out /data/fleet   # ~4 GB disk
    python bench/fleet.py --runs 100 --rows 2000000                                               # a quick look

The fleet goes to ``--out`` (default: a temporary folder, removed at the end unless ``--keep``); the free
disk is checked first (about 40 bytes per token row for the fleet; the out-of-core fit writes its cells and
design to the temporary folder too, about 60 bytes per token row more). Wall and CPU seconds (CPU: every
thread of the child process) and the load average are printed: the machine is shared. Ends with ONE JSON line.
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


def clone_runs(out: Path, *, runs: int) -> int:
    """Fill the fleet up to ``runs`` runs by copying its finished runs under new run ids (``out/rest``): every
    Parquet table rewritten with the new ``run_id`` and request ids ``<new run>/<request>`` (new clusters),
    ``run.json`` with the new ``run_id``. The copies hold the same rows as their sources, so the fit's work
    (rows, cells, requests) is that of distinct runs, but their draws are not independent. Returns the
    number of runs made. (``simulate_traces`` makes about 70,000 rows/s here; copies are ~10x faster.)"""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    sources = sorted(p.parent for p in out.glob("*/*/run.json")
                     if json.loads(p.read_text()).get("status") == "complete")
    if not sources:
        raise ValueError(f"{out}: no finished run to copy")
    made = 0
    for index in range(len(sources), runs):
        source = sources[index % len(sources)]
        old_id, run_id = json.loads((source / "run.json").read_text())["run_id"], f"fleet-{index:04d}"
        target = out / "rest" / run_id
        if (target / "run.json").is_file():
            continue
        for shard in sorted((source / "shards").iterdir()):
            if not shard.name.isdigit():
                continue
            tmp = target / "shards" / f".tmp-{shard.name}"
            tmp.mkdir(parents=True, exist_ok=True)
            for file in sorted(shard.glob("*.parquet")):
                table = pq.read_table(file)
                for name in ("run_id", "request_id"):
                    i = table.schema.get_field_index(name)
                    column = table.column(i)
                    if name == "run_id":
                        new = pa.array([run_id] * len(table), type=column.type)
                    else:
                        new = pc.replace_substring(column, f"{old_id}/", f"{run_id}/", max_replacements=1)
                    table = table.set_column(i, table.schema.field(i), new)
                pq.write_table(table, tmp / file.name, compression="zstd")
            tmp.rename(target / "shards" / shard.name)
        meta = json.loads((source / "run.json").read_text())
        meta.update(run_id=run_id, seed=int(meta.get("seed", 0)) + 100_000)
        (target / "run.json").write_text(json.dumps(meta, indent=2))
        made += 1
    return made


def child_fit(mode: str, path: str, family: str, threads: int | None, memory_limit: str | None) -> dict:
    """Run in a fresh process: one fit, its wall and CPU time (all threads of the process: DuckDB's too) and
    this process's peak RSS (``getrusage``: the high-water mark of resident memory, not counting the page
    cache of the files read)."""
    import warnings

    from entropy_law.law.fit import fit_law
    from entropy_law.law.outofcore import fit_law_out_of_core
    from entropy_law.traces.reader import load_traces

    warnings.simplefilter("ignore")  # SmallSampleWarning etc.: not what is measured here
    start, cpu = time.perf_counter(), time.process_time()
    if mode == "report":  # the whole out-of-core report: summaries, the law per arm, the figure, the page
        import matplotlib

        matplotlib.use("Agg")
        from entropy_law.jobs.report import write_report_out_of_core

        with tempfile.TemporaryDirectory(prefix="fleet-report-") as folder:
            page = write_report_out_of_core(path, folder, fmt="md", family=family, threads=threads,
                                            memory_limit=memory_limit)
            text = page.read_text()
        return {"mode": mode, "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "law_rows": [line for line in text.splitlines() if f"| {family} |" in line]}
    if mode == "out-of-core":
        law = fit_law_out_of_core(path, family, threads=threads, memory_limit=memory_limit)
    else:
        law = fit_law(load_traces(path, validate=False), family)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    result = law.result
    return {"mode": mode, "seconds": seconds, "cpu_seconds": cpu,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: kB
            "n_rows": law.n_rows, "n_requests": law.n_requests, "cells": int(result.nobs),
            "converged": bool(result.converged), "params": result.params.to_dict(), "bse": result.bse.to_dict(),
            "llf": float(result.llf), "eps": float(law.eps)}


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
    parser.add_argument("--simulated-runs", type=int, default=None,
                        help="simulate only this many runs (of the same size) and fill the fleet up to --runs with "
                             "copies under new run and request ids (clone_runs; default: simulate every run)")
    parser.add_argument("--report", action="store_true",
                        help="also time the out-of-core report (entropy-law report --out-of-core) of the whole fleet")
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
        reused = bool(existing and args.keep)
        simulated = min(args.simulated_runs or args.runs, args.runs)
        if not reused:  # --keep with a fleet there: reuse it
            generate(out, runs=simulated, rows=int(rows * simulated / args.runs), tokens=tuple(args.tokens),
                     requests_per_shard=args.requests_per_shard, seed=args.seed, subset_rows=int(args.subset_rows))
            if simulated < args.runs:
                clone_runs(out, runs=args.runs)
        generate_s = time.perf_counter() - start
        import pyarrow.parquet as pq

        def rows_under(folder: Path) -> int:
            return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*/shards/*/tokens.parquet"))

        run_dirs = sorted(p.parent for p in out.glob("*/*/run.json"))
        subset = sorted(p.parent for p in (out / "subset").glob("*/run.json"))
        disk = sum(f.stat().st_size for f in out.rglob("*.parquet"))
        total, size = rows_under(out / "subset") + rows_under(out / "rest"), rows_under(out / "subset")
        load_before = os.getloadavg()
        fleet = run_child(args, "out-of-core", out)
        memory = run_child(args, "in-memory", out / "subset")
        small = run_child(args, "out-of-core", out / "subset")
        report = run_child(args, "report", out) if args.report else None
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    names = list(memory["params"])
    d_params = max(abs(small["params"][k] - memory["params"][k]) for k in names)
    d_bse = max(abs(small["bse"][k] - memory["bse"][k]) / abs(memory["bse"][k]) for k in names)
    load = os.getloadavg()
    print(f"fleet: {len(run_dirs)} runs, {total:,} token rows ({fleet['n_rows']:,} at risk, {fleet['n_requests']:,} "
          f"requests, {fleet['cells']:,} cells), {disk / 1e9:.2f} GB of Parquet; "
          f"{'reused (--keep)' if reused else f'generated in {generate_s:.0f} s'}"
          f"{f' ({simulated} simulated, the others copies)' if simulated < len(run_dirs) and not reused else ''}; "
          f"{os.cpu_count()} cores, shared machine (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the "
          f"end; before the fits {load_before[0]:.1f})")
    print(f"{'fit':<36}{'rows':>14}{'seconds':>10}{'CPU s':>8}{'rows/s':>14}{'peak RSS':>12}")
    for label, res, n in ((f"out of core, all {len(run_dirs)} runs", fleet, total),
                          (f"in memory, {len(subset)} runs", memory, size),
                          (f"out of core, the same {len(subset)} runs", small, size)):
        print(f"{label:<36}{n:>14,}{res['seconds']:>10.1f}{res['cpu_seconds']:>8.0f}{n / res['seconds']:>14,.0f}"
              f"{res['peak_rss_bytes'] / 2**30:>10.2f} GB")
    d_llf = abs(small["llf"] - memory["llf"]) / abs(memory["llf"])
    same = max(d_params, d_bse, d_llf) <= 1e-6 and small["eps"] == memory["eps"]
    print(f"out of core vs in memory on {size:,} rows ({args.family}): max |d estimate| = {d_params:.1e}, max "
          f"relative d SE = {d_bse:.1e}, relative d llf = {d_llf:.1e}, offset c {small['eps']:g} vs {memory['eps']:g} "
          f"({'equal within 1e-6' if same else 'NOT equal within 1e-6'})")
    met = fleet["seconds"] <= 300 and fleet["peak_rss_bytes"] <= 4e9
    print(f"issue goal (1e8 rows in >= 100 runs, <= 300 s, <= 4 GB): {total:,} rows in {len(run_dirs)} runs, "
          f"{fleet['seconds']:.0f} s, {fleet['peak_rss_bytes'] / 1e9:.2f} GB: "
          f"{'met' if met and total >= 1e8 and len(run_dirs) >= 100 else 'NOT met'} at this size")
    if report is not None:
        print(f"out-of-core report of all {len(run_dirs)} runs (write_report_out_of_core: per-category summaries, the "
              f"law, the acceptance figure): {report['seconds']:.1f} s wall, {report['cpu_seconds']:.0f} CPU s, "
              f"peak RSS {report['peak_rss_bytes'] / 2**30:.2f} GB; {total / report['seconds']:,.0f} rows/s")
        for line in report["law_rows"]:
            print(f"  its law row: {line}")
    print(json.dumps({"bench": "fleet", "runs": len(run_dirs), "token_rows": total, "at_risk_rows": fleet["n_rows"],
                      "requests": fleet["n_requests"], "cells": fleet["cells"], "parquet_bytes": disk,
                      "family": args.family, "generate_s": generate_s, "load_average_before": load_before,
                      "load_average_after": load,
                      "out_of_core": {k: fleet[k] for k in ("seconds", "cpu_seconds", "peak_rss_bytes", "converged")},
                      "rows_per_s": total / fleet["seconds"], "subset_rows": size,
                      "in_memory": {k: memory[k] for k in ("seconds", "cpu_seconds", "peak_rss_bytes", "converged")},
                      "subset_out_of_core": {k: small[k] for k in ("seconds", "cpu_seconds", "peak_rss_bytes")},
                      "max_abs_param_diff": d_params, "max_rel_se_diff": d_bse, "rel_llf_diff": d_llf,
                      "eps": {"out_of_core": small["eps"], "in_memory": memory["eps"]},
                      "report": report and {k: report[k] for k in ("seconds", "cpu_seconds", "peak_rss_bytes")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
