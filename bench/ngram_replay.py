"""N-gram drafter configurations compared by offline replay on real greedy outputs (Spec-Bench).

Decodes each prompt once with the autoregressive baseline (real default model, chat template), then
replays the n-gram drafter under several configurations and tree policies without touching the target
again (``entropy_law.decoding.replay``). Reports, per category: mean committed tokens per round, the
share of rounds that drafted, target forwards per token, and an estimated speed-up over AR from a linear
verify-cost model ``cost(n tokens) = 1 + slope * (n - 1)`` one-token forwards (``--slope``; the default
0.067 is this machine's 16-token verify at ~2x a 1-token forward). The estimate ignores drafting and
tree-building time (both well under 1 ms per round for the n-gram drafter). Ends with one JSON line.

    python bench/ngram_replay.py --per-category 3 --max-new-tokens 128 [--cache outputs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entropy_law.drafters.ngram import NgramDrafter  # noqa: E402
from entropy_law.decoding.replay import replay_rounds  # noqa: E402
from entropy_law.prompts.text import load_tasks  # noqa: E402

CONFIGS = [  # (label, drafter kwargs, tree, budget)
    ("chain B6", dict(block_size=6), "chain", None),
    ("chain B11", dict(block_size=11), "chain", None),
    ("chain B16", dict(block_size=16), "chain", None),
    ("chain B11 m1", dict(block_size=11, max_matches=1), "chain", None),
    ("chain B11 p0", dict(block_size=11, min_path_prob=0.0), "chain", None),
    ("ddtree B11 N8", dict(block_size=11), "ddtree", 8),
    ("ddtree B11 N16", dict(block_size=11), "ddtree", 16),
    ("ddtree B16 N16", dict(block_size=16), "ddtree", 16),
]


def greedy_outputs(args) -> list[dict]:
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        data = json.loads(cache.read_text())
        if data.get("max_new_tokens") == args.max_new_tokens and data.get("per_category") == args.per_category:
            return data["requests"]
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target

    target = load_target(args.model)
    decoder = SpeculativeDecoder(target, None)
    eos = sorted(decoder.eos_token_ids)
    requests = []
    for task in load_tasks("spec_bench", limit=args.per_category):
        t0 = time.perf_counter()
        result = decoder.generate(task.messages(), max_new_tokens=args.max_new_tokens, category=task.category,
                                  request_id=task.request_id)
        seconds = time.perf_counter() - t0
        requests.append({"request_id": task.request_id, "category": task.category, "prompt_ids": result.prompt_ids,
                         "output_ids": result.token_ids, "stop_reason": result.stop_reason, "eos": eos,
                         "max_context": decoder.adapter.max_context, "ar_seconds": seconds})
        print(f"decoded {task.request_id:<18} {task.category:<15} {len(result.token_ids):>4} tokens "
              f"in {seconds:5.1f} s", file=sys.stderr)
    if cache is not None:
        cache.write_text(json.dumps({"max_new_tokens": args.max_new_tokens, "per_category": args.per_category,
                                     "requests": requests}))
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--slope", type=float, default=0.067, help="extra verify cost per token, in forwards")
    parser.add_argument("--cache", default=None, help="JSON file to keep/reuse the greedy outputs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    requests = greedy_outputs(args)
    categories = sorted({r["category"] for r in requests})
    results = {}
    print(f"\n{'config':<16} {'category':<15} {'tok/round':>9} {'drafted':>8} {'fwd/tok':>8} {'est. x AR':>9}")
    for label, kwargs, tree, budget in CONFIGS:
        per_cat = {}
        for category in categories + ["all"]:
            tokens = rounds = drafted = 0
            cost = 0.0
            for req in requests:
                if category != "all" and req["category"] != category:
                    continue
                replay = replay_rounds(req["prompt_ids"], req["output_ids"], NgramDrafter(**kwargs), tree, budget,
                                       eos_token_ids=req["eos"], max_new_tokens=args.max_new_tokens,
                                       max_context=req["max_context"])
                decode_rounds = replay.rounds[1:]
                tokens += sum(r.committed for r in decode_rounds)
                rounds += len(decode_rounds)
                drafted += sum(r.drafted for r in decode_rounds)
                cost += sum(1.0 + args.slope * r.tree_nodes for r in decode_rounds)
            per_cat[category] = {"tokens_per_round": tokens / rounds, "drafted_share": drafted / rounds,
                                 "forwards_per_token": rounds / tokens, "estimated_speedup": tokens / cost}
            row = per_cat[category]
            print(f"{label:<16} {category:<15} {row['tokens_per_round']:9.2f} {row['drafted_share']:8.2f} "
                  f"{row['forwards_per_token']:8.3f} {row['estimated_speedup']:9.2f}")
        results[label] = per_cat
    print(json.dumps({"bench": "ngram_replay", "model": args.model, "per_category": args.per_category,
                      "max_new_tokens": args.max_new_tokens, "slope": args.slope, "results": results}))


if __name__ == "__main__":
    main()
