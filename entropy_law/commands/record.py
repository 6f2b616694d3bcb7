"""``entropy-law record``: decode benchmark prompts speculatively and write acceptance traces.

Known here: the command-line options, the order of work (load the prompts, then the model; skip what
a resumed run already holds; decode each prompt through the chat template; hand every round to the
trace recorder), and what is skipped rather than fatal: empty prompts, prompts that leave no room in
the model's context, and a request that fails while decoding (logged with its reason, recorded with
stop reason "error" when it had begun, and the run goes on). Not known here: decoding itself
(``SpeculativeDecoder``), the trace format (``TraceRecorder``), the prompt files (``entropy_law.prompts.text``).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from pathlib import Path

logger = logging.getLogger("entropy_law.record")

DRAFTERS = ("ngram", "block", "none")
TREES = ("chain", "ddtree")
DEFAULT_DDTREE_BUDGET = 16


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "record",
        help="decode benchmark prompts with a drafter and write acceptance traces",
        description="Decode prompts greedily with speculative decoding (lossless: the output equals greedy "
                    "decoding) and write per-token target entropy and per-round acceptance to a trace run.",
    )
    p.add_argument("--model", default="smollm2-135m",
                   help="'smollm2-135m', a local Hugging Face model folder or a .gguf file (default: %(default)s)")
    p.add_argument("--drafter", choices=DRAFTERS, default="ngram",
                   help="draft source; 'none' is the autoregressive baseline (default: %(default)s)")
    p.add_argument("--checkpoint", default=None,
                   help="block drafter: a checkpoint trained for --model (default: the shipped one in data/drafters/)")
    p.add_argument("--tree", choices=TREES, default="chain", help="tree policy (default: %(default)s)")
    p.add_argument("--budget", type=int, default=None,
                   help=f"most draft nodes per tree (default: chain = the full block, ddtree = {DEFAULT_DDTREE_BUDGET})")
    p.add_argument("--block-size", type=int, default=11,
                   help="n-gram drafter: most tokens one round can commit (drafts + 1) (default: %(default)s)")
    p.add_argument("--max-ngram", type=int, default=4, help="n-gram drafter: longest n-gram matched (default: %(default)s)")
    p.add_argument("--max-matches", type=int, default=4,
                   help="n-gram drafter: earlier occurrences used as branches (default: %(default)s)")
    p.add_argument("--verify-cost-ratio", type=float, default=2.0,
                   help="cost of a verify pass over a one-token forward; a round drafts only when the expected "
                        "accepted drafts reach this minus 1 (default: %(default)s)")
    p.add_argument("--gate", choices=("ratio", "cost"), default="ratio",
                   help="drafting gate: 'ratio' uses --verify-cost-ratio; 'cost' times this machine's verify cost "
                        "for 1..32 tokens once (~10 s) and verifies the prefix of each tree with the most expected "
                        "tokens per unit cost (the curve is stored in the run metadata) (default: %(default)s)")
    p.add_argument("--tasks", default="spec_bench",
                   help="'spec_bench' or a JSONL file with question_id, category, turns (default: %(default)s)")
    p.add_argument("--categories", nargs="+", default=None, metavar="CATEGORY",
                   help="only these categories (space or comma separated; default: all)")
    p.add_argument("--limit", type=int, default=None, help="at most K prompts per category (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="tokenize the prompt text as is instead of applying the model's chat template")
    p.add_argument("--out", required=True, help="run directory for the traces")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue an existing run, skipping completed prompts")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _categories(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


class _RoundTracker:
    """Observer that remembers which requests began and how many tokens they logged (for error ends)."""

    def __init__(self):
        self.logged_tokens: dict[str, int] = {}

    def on_request_start(self, request_id: str, info: dict) -> None:
        self.logged_tokens[request_id] = 0

    def on_round(self, record) -> None:
        self.logged_tokens[record.request_id] = record.start_position + len(record.committed_ids)

    def on_request_end(self, request_id: str, info: dict) -> None:
        self.logged_tokens.pop(request_id, None)


def _check_args(args) -> None:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.budget is not None and args.budget < 0:
        raise ValueError(f"--budget must be >= 0, got {args.budget}")
    if args.checkpoint is not None and args.drafter != "block":
        raise ValueError("--checkpoint is a block drafter checkpoint: use it with --drafter block")
    if args.drafter == "none" and (args.tree != "chain" or args.budget is not None):
        raise ValueError("--drafter none decodes autoregressively: --tree and --budget do not apply")


def run(args) -> int:
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from entropy_law.prompts.text import load_tasks
    from entropy_law.prompts.image import is_image_task_file, load_image_tasks

    if not logging.getLogger().handlers and not logger.handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _check_args(args)
    # prompts first: a bad task file or category fails before the model is loaded
    image_tasks = is_image_task_file(args.tasks)  # JSONL lines with an "image" field, or "vlm_tasks"
    if image_tasks and args.drafter == "block":
        raise ValueError("--drafter block reads the hidden states of the text target it was trained for; image "
                         "tasks need a drafter trained for that VLM (use --drafter ngram or none)")
    loader = load_image_tasks if image_tasks else load_tasks
    tasks = loader(args.tasks, categories=_categories(args.categories), limit=args.limit)
    if not tasks:
        raise ValueError(f"no prompts to decode in {args.tasks} with these options")
    out = Path(args.out)
    if (out / "run.json").exists() and not (args.resume or args.overwrite):
        raise ValueError(f"{out} already holds a trace run; pass --resume to continue it (skipping recorded "
                         "prompts) or --overwrite to replace it")

    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.interface import drafter_run_config
    from entropy_law.decoding.loading import load_target
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.decoding.observers import RecorderObserver
    from entropy_law.traces.recorder import TraceRecorder

    images = None
    if image_tasks:  # a local Qwen2-VL / Qwen2.5-VL / LLaVA folder; pixels go to the prefill only
        from entropy_law.decoding.vlm import ImageRequests

        images = ImageRequests.load(args.model)
        target = images.target
    else:
        target = load_target(args.model)
    tokenizer = target.tokenizer
    if images is None and not args.no_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer of {args.model} has no chat template; pass --no-chat-template to "
                         "tokenize the prompt text as is")
    drafter = None
    budget = args.budget
    if args.drafter == "ngram":
        drafter = NgramDrafter(max_ngram=args.max_ngram, block_size=args.block_size, max_matches=args.max_matches)
    elif args.drafter == "block":
        from entropy_law.jobs.arms import load_block_drafter
        from entropy_law.drafters.block import BlockDrafter

        drafter = (BlockDrafter.load(args.checkpoint, target) if args.checkpoint is not None
                   else load_block_drafter(target))
    if drafter is not None and args.tree == "ddtree" and budget is None:
        budget = DEFAULT_DDTREE_BUDGET
    tracker = _RoundTracker()
    decoder = SpeculativeDecoder(images.adapter if images is not None else target, drafter, tree=args.tree,
                                 budget=budget, verify_cost_ratio=args.verify_cost_ratio, observers=[tracker],
                                 verify_cost="measure" if args.gate == "cost" else None,  # AR: the decoder measures nothing
                                 tokenizer=tokenizer)
    max_context = decoder.adapter.max_context
    metadata = {
        "model_id": target.model_id,
        "drafter_id": getattr(drafter, "drafter_id", "none"),
        "drafter_config": drafter_run_config(drafter),
        "tree_policy": args.tree if drafter is not None else "none",
        "tree_budget": budget,
        "dtype": str(target.dtype).replace("torch.", ""),
        "device": str(decoder.adapter.device),
        "max_new_tokens": args.max_new_tokens,
        "verify_cost_ratio": args.verify_cost_ratio,
        "chat_template": not args.no_chat_template,
        "tasks": str(args.tasks),
    }
    if decoder.verify_cost is not None:  # only then: runs recorded before the cost gate existed stay resumable
        metadata["verify_cost"] = decoder.verify_cost.to_config()
    counts: dict[str, int] = defaultdict(int)
    committed_per_round: dict[str, list[float]] = defaultdict(list)
    new_tokens = 0
    decode_s = 0.0
    try:
        recorder = TraceRecorder(out, overwrite=args.overwrite, resume=args.resume, **metadata)
    except (FileExistsError, NotADirectoryError) as err:
        raise ValueError(str(err)) from err
    with recorder:
        decoder.observers = [RecorderObserver(recorder), tracker]  # the recorder exists only now
        done = recorder.completed_requests
        todo = [task for task in tasks if task.request_id not in done]
        counts["already recorded"] = len(tasks) - len(todo)
        if counts["already recorded"]:
            logger.info("resuming %s: %d of %d prompts already recorded", args.out, counts["already recorded"],
                        len(tasks))
        with logging_redirect_tqdm():
            for task in tqdm(todo, desc="record", unit="prompt", disable=args.no_progress):
                extra = {}
                try:
                    if images is not None:  # encodes the image and first turn, attaches the pixels
                        prompt_ids, extra = images.prepare(task)
                    else:
                        prompt = task.prompt if args.no_chat_template else task.messages()
                        prompt_ids = decoder.encode_prompt(prompt, raw_prompt=args.no_chat_template)
                except Exception as err:  # a prompt the tokenizer cannot handle: skip it, keep going
                    logger.warning("skipping %s: cannot tokenize the prompt (%s)", task.request_id, err)
                    counts["skipped"] += 1
                    continue
                if not prompt_ids:
                    logger.warning("skipping %s: the prompt is empty after tokenization", task.request_id)
                    counts["skipped"] += 1
                    continue
                if max_context is not None and len(prompt_ids) >= max_context:
                    logger.warning("skipping %s: prompt has %d tokens, the model's context is %d (no room for "
                                   "a new token)", task.request_id, len(prompt_ids), max_context)
                    counts["skipped"] += 1
                    continue
                t0 = time.perf_counter()
                try:
                    result = decoder.generate(prompt_ids, max_new_tokens=args.max_new_tokens,
                                              category=task.category, request_id=task.request_id,
                                              dataset=task.dataset, question_id=task.question_id, **extra)
                except Exception as err:  # never abort the run for one request
                    logger.error("request %s failed: %s: %s", task.request_id, type(err).__name__, err)
                    counts["failed"] += 1
                    if task.request_id in tracker.logged_tokens:  # it began: close it, flagged as an error
                        try:
                            recorder.end_request(task.request_id, stop_reason="error",
                                                 new_tokens=tracker.logged_tokens.pop(task.request_id))
                        except Exception as end_err:
                            logger.error("could not close request %s: %s", task.request_id, end_err)
                    continue
                decode_s += time.perf_counter() - t0
                counts["recorded"] += 1
                new_tokens += result.new_tokens
                committed_per_round[task.category].append(result.mean_committed_per_round)
    _print_summary(args, counts, committed_per_round, new_tokens, decode_s)
    return 1 if counts["failed"] else 0


def _print_summary(args, counts, committed_per_round, new_tokens, decode_s) -> None:
    print(f"trace run {args.out}: recorded {counts['recorded']}, already recorded {counts['already recorded']}, "
          f"skipped {counts['skipped']}, failed {counts['failed']}")
    if counts["recorded"]:
        print(f"new tokens {new_tokens} in {decode_s:.1f} s ({new_tokens / max(decode_s, 1e-9):.1f} tokens/s)")
        for category, values in sorted(committed_per_round.items()):
            finite = [v for v in values if v == v]
            mean = sum(finite) / len(finite) if finite else float("nan")
            print(f"  {category:<16} prompts {len(values):>4}   mean committed tokens per round {mean:.2f}")
