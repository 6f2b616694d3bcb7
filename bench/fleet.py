"""Scale: the out-of-core fit over a fleet of trace shards, the in-memory fit by size, trace input and output.

Subcommands (each prints a table and ends with one JSON line):

    python bench/fleet.py fleet [ARGS]
    python bench/fleet.py fit-scale [ARGS]
    python bench/fleet.py trace-io [ARGS]
    python bench/fleet.py spark [ARGS]

``python bench/fleet.py SUBCOMMAND --help`` lists a subcommand's arguments.
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

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib import exit_code, measured_line, run_subcommand  # noqa: E402


# --- fleet -----------------------------------------------------------------------------------------------------------

BYTES_PER_ROW = 40  # tokens + rounds + requests files per token row, zstd (measured: ~35)


def generate(out: Path, *, runs: int, rows: int, tokens: tuple[int, int], requests_per_shard: int, seed: int,
             subset_rows: int) -> dict:
    """The fleet under ``out``: the first runs, up to ``subset_rows`` token rows, in ``out/subset`` (the in-memory
    comparison), the others in ``out/rest``."""
    from entropy_law.analysis.simulate import simulate_traces
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
    from entropy_law.outofcore import fit_law_out_of_core
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
    cmd = [sys.executable, __file__, "fleet", "--child", mode, "--family", args.family, *(["--threads", str(args.threads)]
           if args.threads else []), *(["--memory-limit", args.memory_limit] if args.memory_limit else []), "--",
           str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} fit failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fleet_arguments(parser) -> None:
    """The arguments of ``fleet``."""
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


def run_fleet(args, parser) -> int:
    """Fitting the law on a fleet of runs out of core: many runs on disk, DuckDB over their shards, one fit.

    Generates ``--runs`` trace runs holding ``--rows`` token rows in all (simulated from a known law,
    ``entropy_law.analysis.simulate.simulate_traces``: one chain drafter, five categories, ``--tokens`` output tokens
    per request; written through ``TraceRecorder.log_columns`` in shards of ``--requests-per-shard`` requests,
    request ids unique across the fleet; all runs one arm), then times, each in a fresh child process so that
    its peak RSS is its own:

    - **out of core**: ``entropy_law.outofcore.fit_law_out_of_core`` (the SQL of ``docs/out-of-core.md`` run
      by DuckDB over groups of shards, the cells to temporary Parquet files, then statsmodels' IRLS and CR1 sandwich
      streamed over the cells in batches); rows/s = token rows on disk / wall seconds;
    - **in memory** on a subset of whole runs of at most ``--subset-rows`` rows: ``fit_law(load_traces(...))``,
      and the same subset out of core; their estimates and standard errors must agree within 1e-6;
    - with ``--report``: the out-of-core report of the whole fleet (``jobs.report.write_report_out_of_core``, what
      ``entropy-law report --out-of-core`` writes: per-category summaries by DuckDB, the law, the acceptance figure).

    The goal: 10^8 token rows in >= 100 runs fitted in <= 5 min with <= 4 GB peak RSS, equal to the
    in-memory fit on a 10^7-row subset within 1e-6:

        python bench/fleet.py fleet --runs 100 --rows 100000000 --subset-rows 10000000 --out /data/fleet   # ~4 GB disk
        python bench/fleet.py fleet --runs 100 --rows 2000000                                               # a quick look

    The fleet goes to ``--out`` (default: a temporary folder, removed at the end unless ``--keep``); the free
    disk is checked first (about 40 bytes per token row for the fleet; the out-of-core fit writes its cells and
    design to the temporary folder too, about 60 bytes per token row more). Wall and CPU seconds (CPU: every
    thread of the child process) and the load average are printed: the machine is shared. Ends with ONE JSON line.
    """
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
    print(f"goal (1e8 rows in >= 100 runs, <= 300 s, <= 4 GB): {total:,} rows in {len(run_dirs)} runs, "
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


# --- fit-scale -------------------------------------------------------------------------------------------------------


K_TRUE = 0.8
LAMBDA_TRUE = np.array([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])
CHUNK = 1_000_000


def one_size(n_rows: int, seed: int) -> dict:
    from entropy_law.law import atrisk
    from entropy_law.law.fit import fit_law

    rng = np.random.default_rng(seed)
    cpu0 = time.process_time()
    n_requests = max(200, n_rows // 5000)
    t_gen = t_agg = 0.0
    parts = []
    done = 0
    while done < n_rows:
        m = min(CHUNK, n_rows - done)
        t0 = time.perf_counter()
        request = rng.integers(0, n_requests, m)
        depth = np.minimum(rng.geometric(0.35, m), len(LAMBDA_TRUE))
        low = rng.random(m) < 0.55
        h = np.where(low, 0.01 * np.exp(1.2 * rng.standard_normal(m)), np.exp(0.7 * rng.standard_normal(m)))
        accept = rng.random(m) < np.exp(-LAMBDA_TRUE[depth - 1] * (h + 1e-3) ** K_TRUE)
        rows = pd.DataFrame({"drafter_id": 0, "category": request % 5, "request_id": request, "depth": depth,
                             "accepted": accept.astype(np.int8), "target_entropy_nats": h,
                             "log_entropy": np.log(h + 1e-3)})
        t1 = time.perf_counter()
        parts.append(atrisk.aggregate_at_risk(rows))
        if len(parts) > 1:  # keep memory flat: fold each chunk into the running aggregate
            parts = [atrisk.combine_aggregates(parts)]
        t2 = time.perf_counter()
        t_gen += t1 - t0
        t_agg += t2 - t1
        done += m
        del rows
    agg = parts[0]
    t3 = time.perf_counter()
    law = fit_law(agg, "law_exp")
    t_fit = time.perf_counter() - t3
    cpu = time.process_time() - cpu0
    s = law.summary
    return dict(rows=n_rows, requests=n_requests, cells=len(agg), generate_s=round(t_gen, 2),
                aggregate_s=round(t_agg, 2), fit_s=round(t_fit, 2), aggregate_plus_fit_s=round(t_agg + t_fit, 2),
                cpu_s_all=round(cpu, 2),
                peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
                k=round(float(s.loc["k", "estimate"]), 4), k_se=round(float(s.loc["k", "std_err"]), 5),
                lambda_1=round(float(s.loc["lambda[d=1]", "estimate"]), 4))


def fit_scale_arguments(parser) -> None:
    """The arguments of ``fit-scale``."""
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)


def run_fit_scale(args, parser) -> None:
    """Fit the primary law (law_exp) on 1e5, 1e6 and 1e7 at-risk rows via streaming aggregation.

    Rows are drawn directly from the known law a = exp(-lambda_d (H + eps)^k) in chunks of 1e6 (bursty
    per-request entropy is irrelevant to the cost of fitting, so each row's H is drawn from a two-state
    lognormal mixture); each chunk is aggregated (request x depth x log-spaced H bin), the aggregates are
    combined and the law is fitted with request-clustered errors. Each size runs in its own process so
    that its peak memory (ru_maxrss) is its own. ``cpu_s_all`` is the process CPU time of everything
    (generation included): on a shared machine wall times overstate the cost, CPU time does not. Prints a table and ends with one JSON line.

        python bench/fleet.py fit-scale [--sizes 100000 1000000 10000000] [--seed 0]
    """
    if args.one:
        print(json.dumps(one_size(args.one, args.seed)))
        return
    results = []
    for n in args.sizes:
        out = subprocess.run([sys.executable, __file__, "fit-scale", "--one", str(n), "--seed", str(args.seed)], check=True,
                             capture_output=True, text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = pd.DataFrame(results)
    print(f"law_exp on simulated at-risk rows (true k = {K_TRUE}, lambda_1 = {LAMBDA_TRUE[0]}), chunk {CHUNK:,} rows")
    print(table.to_string(index=False))
    big = table.iloc[-1]
    print(json.dumps({"bench": "fit_scale", "results": results,
                      "goal_met": bool(big["aggregate_plus_fit_s"] <= 60 and big["peak_rss_gb"] <= 4)}))


# --- trace-io --------------------------------------------------------------------------------------------------------

GOALS = {"write_s": 20.0, "read_s": 5.0, "peak_rss_gb": 2.0, "log_round_ms": 0.2}
BLOCK_SIZE = 8
ROUNDS_PER_REQUEST = 64
CATEGORIES = np.array(["writing", "roleplay", "reasoning", "math", "coding"])


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return usage.ru_utime + usage.ru_stime


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def synthetic_shard(rows: int, first_request: int, seed: int):
    """Consistent columns for about ``rows`` token rows (whole rounds and requests)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    n_rounds = int(rows / ((BLOCK_SIZE + 1) / 2)) // ROUNDS_PER_REQUEST * ROUNDS_PER_REQUEST
    committed = rng.integers(1, BLOCK_SIZE + 1, size=n_rounds).astype(np.int16)
    n_tok = int(committed.sum())
    n_req = n_rounds // ROUNDS_PER_REQUEST
    req_of_round = np.repeat(np.arange(n_req, dtype=np.int32), ROUNDS_PER_REQUEST)
    round_index = np.tile(np.arange(ROUNDS_PER_REQUEST, dtype=np.int32), n_req)
    ends = np.cumsum(committed.astype(np.int64))
    starts_global = ends - committed
    req_first_token = starts_global[::ROUNDS_PER_REQUEST]
    start_position = (starts_global - np.repeat(req_first_token, ROUNDS_PER_REQUEST)).astype(np.int32)
    ids = pa.array([f"req-{first_request + i:07d}" for i in range(n_req)])
    cats = pa.array(CATEGORIES[(first_request + np.arange(n_req)) % len(CATEGORIES)])
    round_of_token = np.repeat(np.arange(n_rounds), committed)
    depth = (np.arange(n_tok) - starts_global[round_of_token] + 1).astype(np.int16)
    accepted = (committed - 1).astype(np.int16)
    tree_depth = np.full(n_rounds, BLOCK_SIZE - 1, np.int16)
    role_codes = np.zeros(n_tok, np.int8)
    last = ends - 1
    role_codes[last] = np.where(accepted == tree_depth, 2, 1)
    entropy = rng.exponential(0.8, n_tok).astype(np.float32)
    top1 = np.exp(-entropy).astype(np.float32)
    req_of_token = req_of_round[round_of_token]
    draft_prob = rng.random(n_tok).astype(np.float32)
    draft_prob[depth >= BLOCK_SIZE] = np.nan  # no draft row for a bonus after a full block
    tokens = {
        "request_id": pa.DictionaryArray.from_arrays(req_of_token, ids),
        "category": pa.DictionaryArray.from_arrays(req_of_token, cats),
        "round_index": round_index[round_of_token],
        "position": (start_position[round_of_token] + depth - 1).astype(np.int32),
        "depth": depth,
        "token_id": rng.integers(0, 49152, n_tok, dtype=np.int32),
        "role": pa.DictionaryArray.from_arrays(role_codes, pa.array(["accepted", "correction", "bonus"])),
        "target_entropy_nats": entropy,
        "target_renyi2_nats": (entropy * 0.8).astype(np.float32),
        "target_top1_prob": top1,
        "target_top2_prob": (top1 * (1 - top1)).astype(np.float32),
        "target_logit_gap": rng.exponential(2.0, n_tok).astype(np.float32),
        "draft_prob": draft_prob,
        "draft_rank": np.where(np.isnan(draft_prob), np.nan, rng.integers(-1, 10, n_tok)),
        "draft_entropy_nats": np.where(np.isnan(draft_prob), np.nan, entropy * 1.1).astype(np.float32),
    }
    rounds = {
        "request_id": pa.DictionaryArray.from_arrays(req_of_round, ids),
        "round_index": round_index, "start_position": start_position,
        "context_len": (start_position + 100).astype(np.int32),
        "block_size": np.full(n_rounds, BLOCK_SIZE, np.int16),
        "tree_nodes": np.full(n_rounds, 32, np.int32), "tree_depth": tree_depth,
        "accepted": accepted, "committed": committed,
        "draft_ms": rng.random(n_rounds).astype(np.float32),
        "verify_ms": rng.random(n_rounds).astype(np.float32),
        "overhead_ms": rng.random(n_rounds).astype(np.float32),
    }
    new_tokens = np.diff(np.append(req_first_token, n_tok)).astype(np.int32)
    requests = {
        "request_id": ids, "category": cats, "dataset": "spec_bench",
        "question_id": ids, "prompt_tokens": np.full(n_req, 100, np.int32),
        "image_tokens": np.zeros(n_req, np.int32), "new_tokens": new_tokens,
        "rounds": np.full(n_req, ROUNDS_PER_REQUEST, np.int32), "stop_reason": "max_new_tokens",
        "prefill_ms": np.ones(n_req, np.float32), "decode_ms": np.ones(n_req, np.float32),
    }
    return tokens, rounds, requests, n_tok, n_req


def phase_write(path: Path, rows: int, shards: int) -> dict:
    from entropy_law import TraceRecorder

    seconds = cpu = 0.0
    total = 0
    first_request = 0
    with TraceRecorder(path, overwrite=True, model_id="synthetic", drafter_id="bench", seed=0) as rec:
        for shard in range(shards):
            tokens, rounds, requests, n_tok, n_req = synthetic_shard(rows // shards, first_request, seed=shard)
            t0, c0 = time.perf_counter(), _cpu_s()
            rec.log_columns(tokens=tokens, rounds=rounds, requests=requests)
            seconds += time.perf_counter() - t0
            cpu += _cpu_s() - c0
            total += n_tok
            first_request += n_req
            del tokens, rounds, requests
        t0, c0 = time.perf_counter(), _cpu_s()
    seconds += time.perf_counter() - t0  # finish()
    cpu += _cpu_s() - c0
    size = sum(f.stat().st_size for f in path.rglob("*.parquet"))
    return {"rows": total, "seconds": seconds, "cpu_s": cpu, "peak_rss_gb": _peak_rss_gb(), "bytes_on_disk": size}


def phase_read(path: Path, validate: bool = True) -> dict:
    from entropy_law import load_traces

    t0, c0 = time.perf_counter(), _cpu_s()
    traces = load_traces(path, validate=validate)
    tokens = traces.tokens
    seconds = time.perf_counter() - t0
    return {"rows": len(tokens), "seconds": seconds, "cpu_s": _cpu_s() - c0, "peak_rss_gb": _peak_rss_gb(),
            "pandas_bytes": int(tokens.memory_usage(deep=True).sum())}


def phase_round(path: Path, n_rounds: int) -> dict:
    from entropy_law import TraceRecorder

    rng = np.random.default_rng(1)
    committed = rng.integers(1, BLOCK_SIZE + 1, size=n_rounds)
    stats = []
    for c in committed:  # precomputed, as an engine would pass them (not timed)
        h = rng.exponential(0.8, c).astype(np.float32)
        p1 = np.exp(-h)
        stats.append({"entropy_nats": h, "renyi2_nats": h * 0.8, "top1_prob": p1,
                      "top2_prob": p1 * (1 - p1), "logit_gap": np.ones(c, np.float32)})
    token_ids = [rng.integers(0, 49152, c) for c in committed]
    per_request = 64
    log_s = other_s = 0.0
    with TraceRecorder(path, overwrite=True, model_id="synthetic", drafter_id="bench") as rec:
        pos = 0
        for i in range(n_rounds):
            r = i % per_request
            request_id = f"req-{i // per_request}"
            if r == 0:
                t0 = time.perf_counter()
                rec.begin_request(request_id, category="math")
                other_s += time.perf_counter() - t0
                pos = 0
            c = int(committed[i])
            t0 = time.perf_counter()
            rec.log_round(request_id, round_index=r, start_position=pos, context_len=100 + pos,
                          block_size=BLOCK_SIZE, tree_nodes=32, tree_depth=BLOCK_SIZE - 1, accepted=c - 1,
                          token_ids=token_ids[i], ends_at_leaf=c == BLOCK_SIZE, target_stats=stats[i],
                          draft_ms=0.1, verify_ms=1.0)
            log_s += time.perf_counter() - t0
            pos += c
            if r == per_request - 1 or i == n_rounds - 1:
                t0 = time.perf_counter()
                rec.end_request(request_id, new_tokens=pos, stop_reason="max_new_tokens")  # may flush
                other_s += time.perf_counter() - t0
        t0 = time.perf_counter()
    other_s += time.perf_counter() - t0
    return {"rounds": n_rounds, "log_round_ms": 1e3 * log_s / n_rounds,
            "with_flush_ms": 1e3 * (log_s + other_s) / n_rounds, "peak_rss_gb": _peak_rss_gb()}


def _child(phase: str, args) -> dict:
    cmd = [sys.executable, __file__, "trace-io", "--phase", phase, "--dir", str(args.dir), "--rows", str(args.rows),
           "--shards", str(args.shards), "--rounds", str(args.rounds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def trace_io_arguments(parser) -> None:
    """The arguments of ``trace-io``."""
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--phase", choices=["write", "read", "read_unvalidated", "round"], help=argparse.SUPPRESS)


def run_trace_io(args, parser) -> None:
    """Benchmark of the trace layer: write and read 10 million token rows, and the per-round logging cost.

    Phases run in separate child processes so that each one's peak memory (ru_maxrss) is its own:
      write  synthetic, self-consistent tables (tokens, rounds, requests) via TraceRecorder.log_columns,
             in a few big shards (generation time excluded, validation + Parquet writing included);
      read   load_traces(path) (validates every table and the cross-table rules) then .tokens (pandas);
             also once with validate=False, for reference;
      round  log_round with precomputed target statistics on many small rounds (no entropy computation),
             plus the amortised cost of end_request and shard flushes.
    Prints a table and ends with one JSON line holding the numbers, the goals and whether each was met.

        python bench/fleet.py trace-io [--rows 10000000] [--shards 4] [--rounds 20000] [--dir DIR]
    """
    sys.path.insert(0, str(ROOT))
    if args.phase:
        run_dir = args.dir / ("bulk" if args.phase != "round" else "rounds")
        result = {"write": lambda: phase_write(run_dir, args.rows, args.shards),
                  "read": lambda: phase_read(run_dir),
                  "read_unvalidated": lambda: phase_read(run_dir, validate=False),
                  "round": lambda: phase_round(run_dir, args.rounds)}[args.phase]()
        print(json.dumps(result))
        return
    load_before = os.getloadavg()[0]
    own_dir = args.dir is None
    args.dir = Path(tempfile.mkdtemp(prefix="trace-io-")) if own_dir else args.dir
    try:
        write = _child("write", args)
        read = _child("read", args)
        read_raw = _child("read_unvalidated", args)
        per_round = _child("round", args)
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    peak = max(write["peak_rss_gb"], read["peak_rss_gb"], read_raw["peak_rss_gb"], per_round["peak_rss_gb"])
    load_after = os.getloadavg()[0]
    print(f"{'phase':<10}{'rows':>12}{'wall s':>10}{'CPU s':>10}{'rows/s':>14}{'peak RSS GB':>13}")
    for name, r in (("write", write), ("read", read), ("read*", read_raw)):
        print(f"{name:<10}{r['rows']:>12,}{r['seconds']:>10.2f}{r['cpu_s']:>10.2f}"
              f"{r['rows'] / r['seconds']:>14,.0f}{r['peak_rss_gb']:>13.2f}")
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before:.1f} before / {load_after:.1f} after "
          "(wall times grow with other processes; CPU s counts this process's threads only)")
    print("read* = load_traces(validate=False).tokens (no value or cross-table checks), for reference")
    print(f"on disk: {write['bytes_on_disk'] / 1e6:.0f} MB; pandas tokens frame: {read['pandas_bytes'] / 1e6:.0f} MB")
    print(f"log_round: {per_round['log_round_ms']:.4f} ms/round over {per_round['rounds']:,} rounds "
          f"({per_round['with_flush_ms']:.4f} ms with begin/end_request and flushes amortised)")
    result = {
        "rows": write["rows"], "write_s": round(write["seconds"], 3), "read_s": round(read["seconds"], 3),
        "write_cpu_s": round(write["cpu_s"], 3), "read_cpu_s": round(read["cpu_s"], 3),
        "read_unvalidated_s": round(read_raw["seconds"], 3), "read_unvalidated_cpu_s": round(read_raw["cpu_s"], 3),
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "write_rows_per_s": round(write["rows"] / write["seconds"]),
        "read_rows_per_s": round(read["rows"] / read["seconds"]),
        "peak_rss_gb": round(peak, 3), "log_round_ms": round(per_round["log_round_ms"], 5),
        "log_round_with_flush_ms": round(per_round["with_flush_ms"], 5), "goals": GOALS,
        "met": {"write_s": write["seconds"] <= GOALS["write_s"], "read_s": read["seconds"] <= GOALS["read_s"],
                "peak_rss_gb": peak <= GOALS["peak_rss_gb"],
                "log_round_ms": per_round["log_round_ms"] <= GOALS["log_round_ms"]},
    }
    print(json.dumps(result))


# --- spark -----------------------------------------------------------------------------------------------------------

SPARK_RESULTS = ROOT / "bench" / "results" / "fleet-spark.txt"


def spark_arguments(parser) -> None:
    """The arguments of ``spark``."""
    parser.add_argument("--rows", type=float, default=1e7, help="token rows in all (default: %(default)g)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--simulated-runs", type=int, default=4,
                        help="runs simulated; the others are copies under new run and request ids (clone_runs)")
    parser.add_argument("--tokens", type=int, nargs=2, default=(300, 700), help="output tokens per request")
    parser.add_argument("--requests-per-shard", type=int, default=50)
    parser.add_argument("--family", default="law_exp")
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N] and DuckDB threads (default: %(default)s)")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--out", default=None, help="where the fleet goes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the fleet (and reuse one already in --out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=str(SPARK_RESULTS), help="table file (default: %(default)s)")


def _relative_gap(a: pd.DataFrame, b: pd.DataFrame, columns) -> float:
    x, y = a[columns].to_numpy(float), b[columns].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(x - y) / np.maximum(np.abs(x), np.finfo(float).tiny)
    return float(np.nanmax(gap)) if gap.size else 0.0


def run_spark(args, parser) -> int:
    """The at-risk aggregation and the report's summaries on Spark (local mode) against DuckDB, on one fleet.

    Generates a fleet as ``fleet`` does (``--runs`` runs, ``--rows`` token rows; ``--simulated-runs`` simulated, the
    rest copies), then times on ``--cores`` cores: DuckDB (``outofcore.aggregate_at_risk_sql`` and
    ``report_summaries_sql``) and Spark in local mode (``outofcore.spark``: the same SQL text through Spark SQL; the
    session's start timed apart). Checks: cell keys and counts identical, float means within 1e-12 relative, the
    summaries equal, and ``fit_law`` on either cell table: coefficients within 1e-9. The table goes to
    ``--results`` with date, commit and machine.

        python bench/fleet.py spark                       # 1e7 rows, 20 runs, 2 cores
    Ends with ONE JSON line.
    """
    import warnings

    from entropy_law.law.fit import fit_law
    from entropy_law.outofcore import aggregate_at_risk_sql, report_summaries_sql
    from entropy_law.outofcore.spark import aggregate_at_risk_spark, local_session, report_summaries_spark

    rows = int(args.rows)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fleet-spark-"))
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    try:
        start = time.perf_counter()
        if not (args.keep and sorted(out.glob("*/*/run.json"))):
            simulated = min(args.simulated_runs, args.runs)
            generate(out, runs=simulated, rows=int(rows * simulated / args.runs), tokens=tuple(args.tokens),
                     requests_per_shard=args.requests_per_shard, seed=args.seed, subset_rows=0)
            clone_runs(out, runs=args.runs)
        times["generate"] = time.perf_counter() - start
        import pyarrow.parquet as pq

        total = sum(pq.ParquetFile(f).metadata.num_rows for f in out.glob("*/*/shards/*/tokens.parquet"))
        n_runs = len(list(out.glob("*/*/run.json")))

        def timed(name, fn):
            start = time.perf_counter()
            value = fn()
            times[name] = time.perf_counter() - start
            print(f"{name}: {times[name]:.1f} s, process CPU {time.process_time():.0f} s, peak RSS "
                  f"{_peak_rss_gb():.2f} GB", flush=True)  # what a run that dies later reached
            return value

        duck = timed("duckdb_cells", lambda: aggregate_at_risk_sql(out, args.family, threads=args.cores))
        duck_summary, duck_curve = timed("duckdb_summaries", lambda: report_summaries_sql(out, threads=args.cores))
        spark = timed("spark_start", lambda: local_session(args.cores, driver_memory=args.driver_memory))
        cells = timed("spark_cells", lambda: aggregate_at_risk_spark(out, args.family, spark=spark))
        summary, curve = timed("spark_summaries", lambda: report_summaries_spark(out, spark=spark))
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    keys = [*duck.attrs["keys"], *[f"bin_{c}" for c in duck.attrs["bin_columns"]]]
    counts = [*keys, "n_acc", "n", "n_rej"]
    means = [c for c in duck.columns if c not in counts]
    same_counts = len(cells) == len(duck) and cells[counts].reset_index(drop=True).equals(duck[counts].reset_index(drop=True))
    mean_gap = _relative_gap(duck, cells, means)
    summary_floats = [c for c in duck_summary.columns if duck_summary[c].dtype == float]
    same_summary = (summary.drop(columns=summary_floats).equals(duck_summary.drop(columns=summary_floats))
                    and curve[["drafter_id", "category", "bin", "n", "accepted"]].equals(
                        duck_curve[["drafter_id", "category", "bin", "n", "accepted"]]))
    summary_gap = max(_relative_gap(duck_summary, summary, summary_floats),
                      _relative_gap(duck_curve, curve, ["rate", "ci_low", "ci_high", "entropy_nats"]))
    print(f"{len(duck):,} cells; counts identical: {same_counts}; float means max relative gap {mean_gap:.1e}; summaries "
          f"equal: {same_summary} (floats within {summary_gap:.1e})", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law_duck = timed("fit_duckdb_cells", lambda: fit_law(duck, args.family).coefficients)
        law_spark = fit_law(cells, args.family).coefficients
    coef_gap = float((law_duck["estimate"] - law_spark["estimate"]).abs().max())
    se_gap = float(((law_duck["std_err"] - law_spark["std_err"]).abs() / law_duck["std_err"]).max())
    ok = same_counts and same_summary and mean_gap <= 1e-12 and summary_gap <= 1e-12 and coef_gap <= 1e-9
    lines = [f"# fleet-spark.txt: python bench/fleet.py spark --rows {args.rows:g} --runs {args.runs} --cores {args.cores} "
             f"--family {args.family}",
             measured_line(), "",
             f"fleet: {n_runs} runs, {total:,} token rows ({args.simulated_runs} simulated, the others copies; generated in "
             f"{times['generate']:.0f} s), {len(duck):,} cells of {args.family}",
             f"{'engine, on ' + str(args.cores) + ' cores':<34}{'cells (s)':>12}{'summaries (s)':>15}{'rows/s (cells)':>16}",
             f"{'DuckDB':<34}{times['duckdb_cells']:>12.1f}{times['duckdb_summaries']:>15.1f}"
             f"{total / times['duckdb_cells']:>16,.0f}",
             f"{'Spark local[' + str(args.cores) + '] (start ' + format(times['spark_start'], '.0f') + ' s apart)':<34}"
             f"{times['spark_cells']:>12.1f}{times['spark_summaries']:>15.1f}{total / times['spark_cells']:>16,.0f}",
             f"agreement: cell keys and counts {'identical' if same_counts else 'DIFFER'}; float means max relative gap "
             f"{mean_gap:.1e}; summaries {'equal' if same_summary else 'DIFFER'} (floats within {summary_gap:.1e}); "
             f"{args.family} on either table: max |d coefficient| {coef_gap:.1e}, max relative d SE {se_gap:.1e}",
             f"goal (counts identical, float sums within 1e-12 relative, coefficients within 1e-9): "
             f"{'met' if ok else 'NOT met'} on {total:,} rows"]
    payload = json.dumps({"bench": "fleet_spark", "runs": n_runs, "token_rows": total, "cells": len(duck),
                          "family": args.family, "cores": args.cores, "seconds": times, "same_counts": same_counts,
                          "max_relative_mean_gap": mean_gap, "same_summaries": same_summary,
                          "max_relative_summary_gap": summary_gap, "max_abs_coefficient_gap": coef_gap,
                          "max_relative_se_gap": se_gap, "goal_met": ok, "load_average": os.getloadavg()})
    print("\n".join(lines))
    print(payload)
    Path(args.results).write_text("\n".join(lines) + "\n" + payload + "\n")
    return 0 if ok else 1


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "fleet": (fleet_arguments, run_fleet),
    "fit-scale": (fit_scale_arguments, run_fit_scale),
    "trace-io": (trace_io_arguments, run_trace_io),
    "spark": (spark_arguments, run_spark),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
