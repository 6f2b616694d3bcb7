"""Does the measured verify-cost curve say what the decoder's rounds cost? (issue #19; the cost gate and the law policy
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

    OMP_NUM_THREADS=1 python bench/verify_cost_fidelity.py | tee bench/results/verify_cost_fidelity.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def ratio_interval(times: np.ndarray, plain: np.ndarray, rng: np.random.Generator, n_boot: int = 1000) -> tuple:
    """Median of ``times`` over the median of ``plain`` and a 95% percentile bootstrap interval (both resampled)."""
    point = float(np.median(times) / np.median(plain))
    boot = [np.median(rng.choice(times, len(times))) / np.median(rng.choice(plain, len(plain))) for _ in range(n_boot)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return point, float(lo), float(hi)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])
    parser.add_argument("--limit", type=int, default=1, help="prompts per category of each set (default 1)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3, help="measurements of the curve (default 3)")
    parser.add_argument("--min-rounds", type=int, default=20, help="rounds a tree size needs to be compared")
    args = parser.parse_args(argv)

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
        decoder = SpeculativeDecoder(target, NgramDrafter(), tree="ddtree", budget=budget, min_expected_accepted=0.0)
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


if __name__ == "__main__":
    main()
