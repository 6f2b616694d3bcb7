"""``entropy-law demo``: the main job on the embedded default target, end to end, in minutes (``jobs.demo.run_demo``);
prints one screen (``screen_lines``, at most ``SCREEN_COLUMNS`` wide), the detail goes to ``summary.txt``.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from entropy_law.jobs.demo import DEFAULT_ARMS, DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS, DemoPlan, demo_limits, run_demo
from entropy_law.prompts.text import load_tasks, sample_per_category

REFERENCE_MODEL = "smollm2-135m"  # the target of data/traces, the reference traces


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="decode a Spec-Bench subset with AR, n-gram and block drafters; record, fit the law, report",
        description="Decode a few Spec-Bench prompts per category with AR and each drafter, fit the law, print "
                    "per arm and category whether drafting pays; the detail goes to OUT/<run-id>/.")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="new tokens per prompt")
    p.add_argument("--out", default="runs", help="parent folder of the run folder (default: %(default)s)")
    p.add_argument("--run-id", default=None, help="name of the run folder (default: UTC time)")
    p.add_argument("--model", default=REFERENCE_MODEL, help="target (default: %(default)s)")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS),
                   help="arms to decode with: ar, ngram, ngram-ddtree16, block, block-ddtree16 (default: %(default)s)")
    p.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all)")
    p.add_argument("--tasks", default="spec_bench", help="task file (default: %(default)s)")
    p.add_argument("--n-boot", type=int, default=30, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the analysis (default: %(default)s)")
    p.add_argument("--format", choices=("html", "md"), default="html", help="report format (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-chat-template", action="store_true", help="tokenize the prompt as is (a base model)")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; torch loads only when the demo runs
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.record import prompt_encoder

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    if args.limit < 1:
        raise ValueError(f"--limit must be >= 1 prompt per category, got {args.limit}")
    limits = demo_limits(args.max_new_tokens)  # the plan's rule, said before the model loads
    categories = None if args.categories is None else [c.strip() for v in args.categories for c in v.split(",") if c.strip()]
    tasks = sample_per_category(load_tasks(args.tasks, categories=categories), args.limit, seed=args.seed)
    print(f"entropy-law demo: {len(tasks)} prompts ({args.limit} per category), {args.max_new_tokens} new tokens, "
          f"arms {' '.join(args.arms)}; loading {args.model} ...", flush=True)
    target = load_target(args.model)
    print(f"model loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    # None: the chat template (run_demo's default); --no-chat-template: the prompt text as is (as `record`)
    encode = prompt_encoder(target, chat_template=not args.no_chat_template, model=args.model)
    plan = DemoPlan(tasks, target, limits, arms=args.arms, out=args.out, run_id=args.run_id, seed=args.seed,
                    encode=encode, n_boot=args.n_boot, report_format=args.format,
                    run_metadata={"chat_template": not args.no_chat_template, "torch_threads": args.threads})
    result = run_demo(plan, progress=not args.no_progress)
    total_s = time.perf_counter() - t0
    print()
    print("\n".join(screen_lines(result, model=args.model, chat_template=not args.no_chat_template,
                                  total_s=total_s)))
    with open(result.run_dir / "summary.txt", "a", encoding="utf-8") as summary:  # the detail's last lines
        summary.write(f"total {total_s:.0f} s (incl. model load)\n"
                      f"{next_steps(args.model, result.trace_dir, chat_template=not args.no_chat_template)}\n")
    return 1 if result.mismatches else 0


SCREEN_COLUMNS = 100  # the printed answer's widest line (the detail goes to summary.txt)


def screen_lines(result, *, model: str, chat_template: bool, total_s: float) -> list[str]:
    """What the demo prints when it is done, at most ``SCREEN_COLUMNS`` wide: the verdict per arm and category
    (``DemoResult.answer_lines``), each note on one line, the timings, where the detail and the report are, and the
    two commands that ask the same question of the user's own prompts."""
    t = result.timings_s
    lines = [*result.answer_lines]
    lines += [textwrap.shorten(f"note: {m}", SCREEN_COLUMNS, placeholder=" ... (summary.txt)")
              for m in result.messages]
    report = "" if result.report_path is None else f", {Path(result.report_path).name}"
    where = [f"{result.run_dir}/: summary.txt (the detail){report}",
             f"decode {t['decode_s']:.0f} s, total {total_s:.0f} s"]
    lines += ["; ".join(where)] if len("; ".join(where)) <= SCREEN_COLUMNS else where
    lines += ["next, on your own prompts (before drafting them; more in summary.txt):",
              f"  entropy-law record{_target_flags(model, chat_template)} --drafter ar --tasks FILE --out RUN",
              f"  entropy-law predict RUN --from {result.trace_dir} --replay-rounds"]
    if len(lines[-1]) > SCREEN_COLUMNS:  # a long trace path: on a continuation line of its own
        lines[-1:] = ["  entropy-law predict RUN --from \\", f"    {result.trace_dir} --replay-rounds"]
    return lines


def _target_flags(model: str, chat_template: bool) -> str:
    """The flags that make a ``record`` run of the user's prompts comparable with this demo's traces."""
    return ("" if model == REFERENCE_MODEL else f" --model {model}") + ("" if chat_template else " --no-chat-template")


def next_steps(model: str, trace_dir, *, chat_template: bool = True) -> str:
    """The demo's last line: how to ask the same question of the user's own prompts, with this demo's target
    and prompt encoding (a run of another target or encoding would be refused or not comparable); the reference
    traces' law in the drafter's confidence only where they were decoded by this target."""
    flags = _target_flags(model, chat_template)
    # the reference traces' block arms ran the default checkpoint too
    # (tests/test_demo.py::test_the_reference_traces_block_arms_ran_the_default_checkpoint keeps that so)
    law = ("; or --replay --law-from data/traces --law-tasks spec_bench: the law in the drafter's confidence, "
           "fitted on the reference traces" if model == REFERENCE_MODEL else "")
    return (f"your own prompts, before drafting them: entropy-law record{flags} --drafter ar --tasks FILE --out RUN, "
            f"then entropy-law predict RUN --from {trace_dir} --replay-rounds (each arm's rounds replayed over your "
            f"outputs, priced by its cost model{law})")
