"""Fit the primary law (law_exp) on 1e5, 1e6 and 1e7 at-risk rows via streaming aggregation.

Rows are drawn directly from the known law a = exp(-lambda_d (H + eps)^k) in chunks of 1e6 (bursty
per-request entropy is irrelevant to the cost of fitting, so each row's H is drawn from a two-state
lognormal mixture); each chunk is aggregated (request x depth x log-spaced H bin), the aggregates are
combined and the law is fitted with request-clustered errors. Each size runs in its own process so
that its peak memory (ru_maxrss) is its own. Prints a table and ends with one JSON line.

    python bench/fit_scale.py [--sizes 100000 1000000 10000000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K_TRUE = 0.8
LAMBDA_TRUE = np.array([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])
CHUNK = 1_000_000


def one_size(n_rows: int, seed: int) -> dict:
    from entropy_law.law import atrisk
    from entropy_law.law.fit import fit_law

    rng = np.random.default_rng(seed)
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
    s = law.summary
    return dict(rows=n_rows, requests=n_requests, cells=len(agg), generate_s=round(t_gen, 2),
                aggregate_s=round(t_agg, 2), fit_s=round(t_fit, 2), aggregate_plus_fit_s=round(t_agg + t_fit, 2),
                peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
                k=round(float(s.loc["k", "estimate"]), 4), k_se=round(float(s.loc["k", "std_err"]), 5),
                lambda_1=round(float(s.loc["lambda[d=1]", "estimate"]), 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_size(args.one, args.seed)))
        return
    results = []
    for n in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--seed", str(args.seed)], check=True,
                             capture_output=True, text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = pd.DataFrame(results)
    print(f"law_exp on simulated at-risk rows (true k = {K_TRUE}, lambda_1 = {LAMBDA_TRUE[0]}), chunk {CHUNK:,} rows")
    print(table.to_string(index=False))
    big = table.iloc[-1]
    print(json.dumps({"bench": "fit_scale", "results": results,
                      "goal_met": bool(big["aggregate_plus_fit_s"] <= 60 and big["peak_rss_gb"] <= 4)}))


if __name__ == "__main__":
    main()
