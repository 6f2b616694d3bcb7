"""The noise floor of a measured speedup: our AR timed against itself (an A/A test), issues #17 and #19.

Two arms that do identical work, ``AR`` and ``AR again`` (two ``ARDecoder`` instances of one target), go
through the one speed routine every speed bench uses (``jobs.speed.time_arms``: a warm-up, arms interleaved per
prompt in rotating order, the CPU clock of this process; ``jobs.speed.paired_speedups``: the paired ratio per
category with its request-bootstrap interval widened to Student t). Their true speedup is exactly 1, so what
the routine reports is noise alone:

- per category and overall: the A/A "speedup" and its interval (does it cover 1? is the point below 1.00?);
- the spread of the per-request log ratios (CPU clock, and wall clock for comparison), and from it the
  half-width of a 95% interval for a category of n requests, n in {2, 5, 10, 20} (t quantile x SD / sqrt(n));
- how often a point estimate of an arm no faster than AR falls below 1.00 / 0.97 / 0.95 in a category.

What it is for: a goal such as "at least 1.00x our AR in every category" (#19's "never loses"), read on point
estimates of a few requests per category, fails by chance alone for a policy that does exactly what AR does
(drafts nothing): about half of its categories fall below 1.00. Such a goal can only be checked against this
floor: a category is a loss only when its interval lies below 1.

Prompts: ``--limit`` per category of each set in ``--sets`` (a seeded sample of the whole set, not the first
ones). Prints a table and ends with ONE JSON line.

    OMP_NUM_THREADS=1 python bench/aa_noise.py --limit 3 --max-new-tokens 128 | tee bench/results/aa_noise.txt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

AR, AGAIN = "AR", "AR again"
HALF_WIDTH_N = (2, 5, 10, 20)
THRESHOLDS = (1.00, 0.97, 0.95)


def log_ratios(timings, column: str) -> np.ndarray:
    """Per request: log(AR's time per token / AR again's time per token) on ``column`` (cpu_s or wall_s)."""
    ref = timings.loc[timings["arm"] == AR].set_index("request_id")
    other = timings.loc[timings["arm"] == AGAIN].set_index("request_id").loc[ref.index]
    mine = (ref[column] / ref["new_tokens"]).to_numpy(float)
    again = (other[column] / other["new_tokens"]).to_numpy(float)
    return np.log(mine / again)


def half_width(sd: float, n: int) -> float:
    """Relative half-width of a 95% t interval of a mean of ``n`` per-request log ratios of spread ``sd``."""
    return float(np.expm1(stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=3, help="prompts per category (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])
    args = parser.parse_args(argv)
    if args.limit < 2:
        raise SystemExit("--limit must be >= 2 (a spread needs two requests per category)")

    import torch

    from entropy_law.decoding.decoder import ARDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.speed import ALL, decoder_arm, paired_speedups, print_progress, time_arms
    from entropy_law.prompts.text import load_tasks, sample_per_category

    torch.set_num_threads(1)
    started = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    target = load_target(args.model)
    tasks = [t for name in args.sets for t in sample_per_category(load_tasks(name), args.limit, seed=args.seed)]
    encoder = ARDecoder(target)
    prompt_of = {t.request_id: encoder.encode_prompt(t.messages()) for t in tasks}

    t0 = time.perf_counter()
    arms = {AR: decoder_arm(ARDecoder(target)), AGAIN: decoder_arm(ARDecoder(target))}
    timings = time_arms(tasks, arms, lambda task: prompt_of[task.request_id], max_new_tokens=args.max_new_tokens,
                        reference=AR, warm_up_tokens=16, progress=print_progress)
    elapsed = time.perf_counter() - t0
    speed = paired_speedups(timings, reference=AR, clock="cpu", seed=args.seed)
    mismatches = int((~timings.loc[timings["arm"] == AGAIN, "matches_reference"]).sum())

    print(f"# python bench/aa_noise.py --limit {args.limit} --max-new-tokens {args.max_new_tokens} --seed {args.seed} "
          f"--sets {' '.join(args.sets)}   (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; {started}; "
          f"{elapsed / 60:.0f} min; load average at the end {os.getloadavg()[0]:.1f})")
    print(f"A/A: '{AGAIN}' against '{AR}', identical work (true speedup 1), {len(tasks)} prompts, one torch thread, "
          "CPU clock, the speed routine of every bench (jobs.speed)")
    categories = [c for c in dict.fromkeys(t.category for t in tasks)]
    print(f"\n{'category':<16}{'requests':>9}  {'A/A speedup [95%]':<24}{'covers 1':>9}  verdict")
    rows = []
    for category in [*categories, ALL]:
        r = speed.loc[(speed["arm"] == AGAIN) & (speed["category"] == category)].iloc[0]
        covers = bool(r["lo"] <= 1.0 <= r["hi"]) if np.isfinite(r["lo"]) else None
        rows.append(dict(category=category, requests=int(r["requests"]), speedup=float(r["speedup"]),
                         lo=float(r["lo"]), hi=float(r["hi"]), covers_1=covers, verdict=str(r["verdict"])))
        interval = f"{r['speedup']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"
        print(f"{category:<16}{int(r['requests']):>9}  {interval:<24}{str(covers):>9}  {r['verdict']}")

    spread = {}
    print("\nper-request log ratio (AR / AR again, time per token):")
    for clock in ("cpu_s", "wall_s"):
        x = log_ratios(timings, clock)
        sd = float(np.std(x, ddof=1))
        spread[clock] = {"sd": sd, "mean": float(np.mean(x)), "min": float(np.min(x)), "max": float(np.max(x)),
                         "half_width": {n: half_width(sd, n) for n in HALF_WIDTH_N}}
        print(f"  {clock[:-2]:<5} SD {sd:.4f} (mean {np.mean(x):+.4f}, range {np.min(x):+.3f} to {np.max(x):+.3f}); "
              "95% half-width of a category mean: "
              + ", ".join(f"n={n}: ±{spread[clock]['half_width'][n]:.1%}" for n in HALF_WIDTH_N))

    per_category = [r for r in rows if r["category"] != ALL]
    below = {f"{t:.2f}": sum(r["speedup"] < t for r in per_category) for t in THRESHOLDS}
    print("\ncategories whose A/A point estimate falls below: "
          + ", ".join(f"{t}: {n} of {len(per_category)}" for t, n in below.items()))
    k = len(per_category)
    print(f"so a goal 'at least 1.00x in every one of {k} categories' on point estimates fails for an arm identical "
          f"to AR with probability about 1 - 0.5^{k} = {1 - 0.5 ** k:.4g}; a category is a loss only where its "
          "interval lies below 1")
    print(f"outputs different between the two AR arms: {mismatches}")
    result = {"bench": "aa_noise", "model": args.model, "prompts_per_category": args.limit, "seed": args.seed,
              "max_new_tokens": args.max_new_tokens, "sets": args.sets, "torch_threads": 1, "clock": "cpu",
              "minutes": elapsed / 60, "load_average_end": os.getloadavg()[0], "categories": rows,
              "log_ratio": spread, "below": below, "mismatches": mismatches}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
