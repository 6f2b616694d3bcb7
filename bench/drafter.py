"""Drafters compared by replay: the block drafter against the n-gram drafter, the n-gram drafter's settings.

Subcommands (each prints a table and ends with one JSON line):

    python bench/drafter.py block-vs-ngram [ARGS]
    python bench/drafter.py ngram-replay [ARGS]

``python bench/drafter.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, run_subcommand  # noqa: E402

from entropy_law.decoding.replay import PrecomputedBlockDrafter  # noqa: E402
from entropy_law.decoding.replay import replay_rounds  # noqa: E402
from entropy_law.drafters.block import BlockDrafter, default_drafter_path  # noqa: E402
from entropy_law.drafters.hybrid import HybridDrafter  # noqa: E402
from entropy_law.drafters.ngram import NgramDrafter  # noqa: E402
from entropy_law.drafters.training.data import chat_ids, greedy_generate_with_features  # noqa: E402
from entropy_law.prompts.text import load_tasks, sample_per_category  # noqa: E402


# --- block-vs-ngram --------------------------------------------------------------------------------------------------

ARMS = [("block chain", "block", "chain", None), ("block ddtree16", "block", "ddtree", 16),
        ("ngram chain", "ngram", "chain", None), ("ngram ddtree16", "ngram", "ddtree", 16),
        ("hybrid ddtree16", "hybrid", "ddtree", 16)]


def read_cache(args) -> list[dict] | None:
    """Greedy outputs + features saved by an earlier run with the same settings (``--cache``), or None."""
    from safetensors.torch import load_file

    cache = Path(args.cache) if args.cache else None
    meta_path = cache.with_suffix(".json") if cache else None
    if not (cache and cache.is_file() and meta_path.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    if (meta["max_new_tokens"] != args.max_new_tokens or meta["per_category"] < args.per_category
            or meta.get("greedy_from_traces") != args.greedy_from_traces or meta.get("offset", 0) != args.offset
            or meta.get("tasks", "spec_bench") != args.tasks or meta.get("seed") != args.seed
            or (args.seed is not None and meta["per_category"] != args.per_category)):
        return None
    tensors = load_file(str(cache))
    return [{**r, "features": tensors[f"{i}.features"]} for i, r in enumerate(meta["requests"])
            if r["rank"] < args.per_category]


def write_cache(args, reqs: list[dict]) -> None:
    from safetensors.torch import save_file

    if not args.cache:
        return
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    save_file({f"{i}.features": r["features"].contiguous() for i, r in enumerate(reqs)}, str(cache))
    cache.with_suffix(".json").write_text(json.dumps(
        {"max_new_tokens": args.max_new_tokens, "per_category": args.per_category, "offset": args.offset,
         "greedy_from_traces": args.greedy_from_traces, "tasks": args.tasks, "seed": args.seed,
         "requests": [{k: v for k, v in r.items() if k != "features"} for r in reqs]}))


def chosen_ids(args, tasks) -> dict[str, list[str]]:
    """Request ids per category, in order: ``--offset``/``--per-category`` of the file order, or (``--seed``) a
    seeded sample of ``--per-category`` from the whole category (``sample_per_category``)."""
    if args.seed is not None:
        tasks = sample_per_category(tasks, args.per_category, seed=args.seed)
    by_cat: dict[str, list[str]] = {}
    for t in tasks:
        by_cat.setdefault(t.category, []).append(t.request_id)
    if args.seed is None:
        return {c: ids[args.offset: args.offset + args.per_category] for c, ids in by_cat.items()}
    return by_cat


def greedy_generated(args, target, layers) -> list[dict]:
    tok = target.tokenizer
    eos = int(target.config.eos_token_id)
    tasks = load_tasks(args.tasks)
    by_id = {t.request_id: t for t in tasks}
    by_cat = {c: [by_id[i] for i in ids] for c, ids in chosen_ids(args, tasks).items()}
    reqs = []
    for cat, items in by_cat.items():
        t0 = time.time()
        ids = [chat_ids(tok, t.prompt) for t in items]
        out = greedy_generate_with_features(target.model, ids, feature_layers=layers,
                                            max_new_tokens=args.max_new_tokens, eos_id=eos, pad_id=eos)
        for rank, (t, p, o) in enumerate(zip(items, ids, out)):
            reqs.append({"request_id": t.request_id, "category": cat, "rank": rank, "prompt_ids": p,
                         "output_ids": o["response_ids"], "features": o["features"].half(), "eos": [eos]})
        print(f"greedy {cat:<15} {len(items)} prompts in {time.time() - t0:6.1f} s", file=sys.stderr, flush=True)
    return reqs


def greedy_from_traces(args, target, layers) -> list[dict]:
    """Greedy outputs recorded by ``entropy-law record`` (lossless decoding, batch 1: exact greedy), plus
    teacher-forced target features (one forward per request)."""
    import glob

    import pyarrow.parquet as pq

    from entropy_law.decoding.features import capture_features

    folder = Path(args.greedy_from_traces)
    reqs_t = [pq.read_table(f).to_pandas() for f in sorted(glob.glob(str(folder / "shards/*/requests.parquet")))]
    toks_t = [pq.read_table(f, columns=["request_id", "position", "token_id"]).to_pandas()
              for f in sorted(glob.glob(str(folder / "shards/*/tokens.parquet")))]
    if not reqs_t:
        raise FileNotFoundError(f"no trace shards under {folder}")
    import pandas as pd

    requests, tokens = pd.concat(reqs_t), pd.concat(toks_t)
    all_tasks = load_tasks(args.tasks)
    tasks = {t.request_id: t for t in all_tasks}
    if args.seed is not None:  # a seeded sample of each category's requests that the run holds complete
        complete = set(requests.request_id)
        chosen = {i for ids in chosen_ids(args, [t for t in all_tasks if t.request_id in complete]).values()
                  for i in ids}
        requests = requests[requests.request_id.isin(chosen)]
    eos = int(target.config.eos_token_id)
    out, rank = [], {}  # rank: among the complete requests of a category, after the first --offset ones
    order = {t.request_id: i for i, t in enumerate(all_tasks)}
    for row in requests.sort_values("request_id", key=lambda c: c.map(order)).itertuples():
        r = rank.setdefault(row.category, -args.offset if args.seed is None else 0)
        if r >= args.per_category:
            continue
        out_ids = tokens[tokens.request_id == row.request_id].sort_values("position").token_id.astype(int).tolist()
        if len(out_ids) != row.new_tokens:
            continue
        if r < 0:
            rank[row.category] = r + 1
            continue
        prompt = chat_ids(target.tokenizer, tasks[row.request_id].prompt)
        if len(prompt) != row.prompt_tokens:
            raise ValueError(f"{row.request_id}: prompt has {len(prompt)} tokens here, {row.prompt_tokens} in the trace")
        with torch.no_grad(), capture_features(target.model, layers) as cap:
            target.model(torch.tensor([prompt + out_ids]))
            feats = cap.features()[0, :-1].half()
        out.append({"request_id": row.request_id, "category": row.category, "rank": r, "prompt_ids": prompt,
                    "output_ids": out_ids, "features": feats, "eos": [eos]})
        rank[row.category] = r + 1
    return out


def replay_table(args, drafter, reqs) -> dict:
    cats = sorted({r["category"] for r in reqs})
    results: dict[str, dict] = {}
    for label, kind, tree, budget in ARMS:
        if "all" not in args.arms and kind not in args.arms:
            continue
        committed: dict[str, list[int]] = {c: [] for c in cats}
        nodes: dict[str, list[int]] = {c: [] for c in cats}
        calls = skips = 0
        for r in reqs:
            if kind == "block":
                d = PrecomputedBlockDrafter(drafter, r["prompt_ids"], r["output_ids"], r["features"])
            elif kind == "hybrid":  # the n-gram first; the block drafter's forward only where it is not confident
                d = HybridDrafter(NgramDrafter(), PrecomputedBlockDrafter(drafter, r["prompt_ids"], r["output_ids"],
                                                                          r["features"]))
            else:
                d = NgramDrafter()
            rep = replay_rounds(r["prompt_ids"], r["output_ids"][:args.replay_tokens], d, tree, budget,
                                eos_token_ids=r["eos"], max_new_tokens=args.replay_tokens, min_expected_accepted=0.0)
            committed[r["category"]] += [x.committed for x in rep.rounds[1:]]
            nodes[r["category"]] += [x.tree_nodes for x in rep.rounds[1:]]
            if kind == "hybrid":
                calls, skips = calls + d.block_calls, skips + d.block_skips
        row = {c: sum(v) / max(len(v), 1) for c, v in committed.items()}
        allv = [x for v in committed.values() for x in v]
        row["all"] = sum(allv) / max(len(allv), 1)
        results[label] = {"tau_plus_1": row, "rounds": len(allv),
                          "mean_tree_nodes": sum(sum(v) for v in nodes.values()) / max(len(allv), 1)}
        if kind == "hybrid":
            results[label]["block_forward_share"] = calls / max(calls + skips, 1)
    return results


def online_table(args, target, drafter, reqs) -> dict:
    from entropy_law.decoding.decoder import SpeculativeDecoder

    arms = {"ar": (None, "chain", None), "block chain": (drafter, "chain", None),
            "block ddtree16": (drafter, "ddtree", 16), "ngram ddtree16": ("ngram", "ddtree", 16)}
    chosen = [r for r in reqs if r["rank"] < args.online]
    out: dict[str, dict] = {}
    for name, (d, tree, budget) in arms.items():
        toks = secs = rounds = 0.0
        for i, r in enumerate(chosen):
            drafter_obj = NgramDrafter() if d == "ngram" else d
            dec = SpeculativeDecoder(target, drafter_obj, tree=tree, budget=budget)
            if i == 0:  # warm-up, same for every arm
                dec.generate(r["prompt_ids"], max_new_tokens=8)
            res = dec.generate(r["prompt_ids"], max_new_tokens=args.max_new_tokens)
            toks += res.new_tokens
            secs += (res.prefill_ms + res.decode_ms) / 1000
            rounds += res.target_forwards
        out[name] = {"tokens_per_s": toks / secs, "tokens_per_forward": toks / max(rounds, 1), "seconds": secs}
    for name in out:
        out[name]["speedup_vs_ar"] = out[name]["tokens_per_s"] / out["ar"]["tokens_per_s"]
    return out


def block_vs_ngram_arguments(parser) -> None:
    """The arguments of ``block-vs-ngram``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="checkpoint (default: the shipped one)")
    parser.add_argument("--tasks", default="spec_bench",
                        help="task file: spec_bench, open_ended or a JSONL path (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None,
                        help="a seeded sample of --per-category prompts from each whole category (not the first ones)")
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--offset", type=int, default=0,
                        help="skip the first N prompts of each category (e.g. 10: an unseen second set)")
    parser.add_argument("--arms", nargs="+", choices=("all", "block", "ngram", "hybrid"), default=["all"],
                        help="the drafters whose arms are replayed (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--replay-tokens", type=int, default=None,
                        help="replay only the first N new tokens of each output (default: all --max-new-tokens; "
                             "the greedy prefix is the same, so a 256-token cache gives the 128-token rounds)")
    parser.add_argument("--cache", default=None,
                        help="safetensors file for greedy outputs + features (reused by later runs with the same "
                             "settings, also with --greedy-from-traces)")
    parser.add_argument("--online", type=int, default=0, help="prompts per category to decode online")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only-cache", action="store_true", help="build the greedy cache and stop")
    parser.add_argument("--greedy-from-traces", default=None,
                        help="trace folder of an `entropy-law record` run (256 new tokens, spec_bench): use its "
                             "exact greedy outputs instead of generating")
    parser.add_argument("--context-vocab", choices=("on", "off"), default=None,
                        help="override the checkpoint's context vocabulary (also draft ids already in the context)")


def run_block_vs_ngram(args, parser) -> None:
    """Block drafter vs n-gram drafter on Spec-Bench: committed tokens per round by replay, optional online speed.

    1. Greedy outputs of the default target for the first ``--per-category`` prompts of each category of
       ``--tasks`` (Spec-Bench by default; ``open_ended`` or any task file), after skipping the first ``--offset``
       ones (a second, unseen set), or with ``--seed S`` a seeded sample of ``--per-category`` prompts from the
       whole of each category: either read from the
       traces of an ``entropy-law record`` run (``--greedy-from-traces``: lossless batch-1 decoding, so
       exact greedy outputs; features from one teacher-forced forward), or
       generated here (chat template as the decoder; fp32, eager attention; in batches with left padding,
       features captured on the way; cached in ``--cache``; batched fp32 greedy can differ from batch-1
       greedy at rare near-ties, the replayed texts are then still greedy texts of the target).
    2. Replay (``entropy_law.decoding.replay.replay_rounds``), always drafting (no gate): the block drafter
       through ``PrecomputedBlockDrafter`` (its marginals at every anchor from one pass; replay == online is
       tested in ``tests/test_block_drafter_decoding.py``), chain and DDTree N=16; the n-gram drafter, chain
       and DDTree N=16. Reports tau+1 (mean committed tokens per round) per category.
    3. ``--online K``: K prompts per category decoded for real (AR, block chain, block DDTree N=16, n-gram
       DDTree N=16) with the same decoder, timers and warm-up; tokens/s and speed-up over AR. On a shared,
       busy CPU these wall-clock numbers are noisy: read them next to the replayed tau+1.

        python bench/drafter.py block-vs-ngram --per-category 10 --max-new-tokens 256 --cache runs/specbench.st
        python bench/drafter.py block-vs-ngram --offset 10 --per-category 20 --arms block --cache runs/sb-11-30.st
        python bench/drafter.py block-vs-ngram --tasks open_ended --per-category 10 --arms block --cache runs/oe.st         --drafter runs/new/drafter.safetensors

    Prints a table and ends with one JSON line.
    """
    args.replay_tokens = min(args.replay_tokens or args.max_new_tokens, args.max_new_tokens)
    if args.threads:
        torch.set_num_threads(args.threads)
    from entropy_law.decoding.loading import load_target

    target = load_target(args.model)
    path = Path(args.drafter) if args.drafter else default_drafter_path()
    layers = BlockDrafter.load(path, target).feature_layers if path.is_file() else (1, 14, 27)
    reqs = read_cache(args)
    if reqs is None:
        reqs = (greedy_from_traces(args, target, layers) if args.greedy_from_traces
                else greedy_generated(args, target, layers))
        write_cache(args, reqs)
    if args.only_cache:
        return
    drafter = BlockDrafter.load(path, target)
    if args.context_vocab is not None and drafter.config.draft_vocab_size:
        from dataclasses import replace

        drafter.config = replace(drafter.config, context_vocab=args.context_vocab == "on")
        drafter.reset()
    results = replay_table(args, drafter, reqs)
    cats = sorted({r["category"] for r in reqs})
    chosen = (f"seeded sample (seed {args.seed})" if args.seed is not None else f"after the first {args.offset}")
    print(f"\nreplayed tau+1 (mean committed tokens per round), {args.tasks}, {args.per_category} prompts/category "
          f"({chosen}), "
          f"{args.replay_tokens} new tokens, always drafting")
    print(f"{'arm':<16}" + "".join(f"{c[:13]:>14}" for c in cats + ["all"]) + f"{'nodes':>8}")
    for label, res in results.items():
        print(f"{label:<16}" + "".join(f"{res['tau_plus_1'][c]:14.3f}" for c in cats + ["all"])
              + f"{res['mean_tree_nodes']:8.1f}"
              + (f"  block forward in {res['block_forward_share']:.0%} of rounds" if "block_forward_share" in res else ""))
    online = online_table(args, target, drafter, reqs) if args.online else None
    if online:
        print(f"\nonline, {args.online} prompt(s)/category")
        for name, row in online.items():
            print(f"{name:<16} {row['tokens_per_s']:8.2f} tok/s  {row['tokens_per_forward']:6.2f} tok/forward  "
                  f"x{row['speedup_vs_ar']:.2f} vs AR")
    print(json.dumps({"bench": "block_drafter_specbench", "drafter": str(path), "per_category": args.per_category,
                      "offset": args.offset, "tasks": args.tasks, "seed": args.seed,
                      "requests": [r["request_id"] for r in reqs],
                      "context_vocab": bool(drafter.config.context_vocab),
                      "max_new_tokens": args.max_new_tokens, "replay_tokens": args.replay_tokens,
                      "replay": results, "online": online}))


# --- ngram-replay ----------------------------------------------------------------------------------------------------

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


def ngram_replay_arguments(parser) -> None:
    """The arguments of ``ngram-replay``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--slope", type=float, default=0.067, help="extra verify cost per token, in forwards")
    parser.add_argument("--cache", default=None, help="JSON file to keep/reuse the greedy outputs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def run_ngram_replay(args, parser) -> None:
    """N-gram drafter configurations compared by offline replay on real greedy outputs (Spec-Bench).

    Decodes each prompt once with the autoregressive baseline (real default model, chat template), then
    replays the n-gram drafter under several configurations and tree policies without touching the target
    again (``entropy_law.decoding.replay``). Reports, per category: mean committed tokens per round, the
    share of rounds that drafted, target forwards per token, and an estimated speed-up over AR from a linear
    verify-cost model ``cost(n tokens) = 1 + slope * (n - 1)`` one-token forwards (``--slope``; the default
    0.067 is this machine's 16-token verify at ~2x a 1-token forward). The estimate ignores drafting and
    tree-building time (both well under 1 ms per round for the n-gram drafter). Ends with one JSON line.

        python bench/drafter.py ngram-replay --per-category 3 --max-new-tokens 128 [--cache outputs.json]
    """
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


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "block-vs-ngram": (block_vs_ngram_arguments, run_block_vs_ngram),
    "ngram-replay": (ngram_replay_arguments, run_ngram_replay),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
