"""Benchmark of the trace layer: write and read 10 million token rows, and the per-round logging cost.

Phases run in separate child processes so that each one's peak memory (ru_maxrss) is its own:
  write  synthetic, self-consistent tables (tokens, rounds, requests) via TraceRecorder.log_columns,
         in a few big shards (generation time excluded, validation + Parquet writing included);
  read   load_traces(path) (validates every table and the cross-table rules) then .tokens (pandas);
  round  log_round with precomputed target statistics on many small rounds (no entropy computation),
         plus the amortised cost of end_request and shard flushes.
Prints a table and ends with one JSON line holding the numbers, the goals and whether each was met.

    python bench/trace_io.py [--rows 10000000] [--shards 4] [--rounds 20000] [--dir DIR]
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

ROOT = Path(__file__).resolve().parent.parent
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


def phase_read(path: Path) -> dict:
    from entropy_law import load_traces

    t0, c0 = time.perf_counter(), _cpu_s()
    traces = load_traces(path)
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
    cmd = [sys.executable, __file__, "--phase", phase, "--dir", str(args.dir), "--rows", str(args.rows),
           "--shards", str(args.shards), "--rounds", str(args.rounds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--phase", choices=["write", "read", "round"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.phase:
        run_dir = args.dir / ("bulk" if args.phase != "round" else "rounds")
        result = {"write": lambda: phase_write(run_dir, args.rows, args.shards),
                  "read": lambda: phase_read(run_dir),
                  "round": lambda: phase_round(run_dir, args.rounds)}[args.phase]()
        print(json.dumps(result))
        return
    load_before = os.getloadavg()[0]
    own_dir = args.dir is None
    args.dir = Path(tempfile.mkdtemp(prefix="trace-io-")) if own_dir else args.dir
    try:
        write = _child("write", args)
        read = _child("read", args)
        per_round = _child("round", args)
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    peak = max(write["peak_rss_gb"], read["peak_rss_gb"], per_round["peak_rss_gb"])
    load_after = os.getloadavg()[0]
    print(f"{'phase':<10}{'rows':>12}{'wall s':>10}{'CPU s':>10}{'rows/s':>14}{'peak RSS GB':>13}")
    for name, r in (("write", write), ("read", read)):
        print(f"{name:<10}{r['rows']:>12,}{r['seconds']:>10.2f}{r['cpu_s']:>10.2f}"
              f"{r['rows'] / r['seconds']:>14,.0f}{r['peak_rss_gb']:>13.2f}")
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before:.1f} before / {load_after:.1f} after "
          "(wall times grow with other processes; CPU s counts this process's threads only)")
    print(f"on disk: {write['bytes_on_disk'] / 1e6:.0f} MB; pandas tokens frame: {read['pandas_bytes'] / 1e6:.0f} MB")
    print(f"log_round: {per_round['log_round_ms']:.4f} ms/round over {per_round['rounds']:,} rounds "
          f"({per_round['with_flush_ms']:.4f} ms with begin/end_request and flushes amortised)")
    result = {
        "rows": write["rows"], "write_s": round(write["seconds"], 3), "read_s": round(read["seconds"], 3),
        "write_cpu_s": round(write["cpu_s"], 3), "read_cpu_s": round(read["cpu_s"], 3),
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


if __name__ == "__main__":
    main()
