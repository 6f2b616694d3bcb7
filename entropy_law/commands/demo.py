"""``entropy-law demo``: the main job on the embedded default target, end to end, in minutes.

Known here: the command-line options and their defaults (sized to finish within ~20 minutes on a
2-core CPU, including model load), the final terminal summary. The work is ``entropy_law.jobs.demo.run_demo``.
"""

from __future__ import annotations

import time

from entropy_law.jobs.demo import DEFAULT_ARMS, DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS, run_demo
from entropy_law.prompts.text import load_tasks, sample_per_category

REFERENCE_MODEL = "smollm2-135m"  # the target of data/traces, the reference traces


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="decode a Spec-Bench subset with AR, n-gram and block drafters; record, fit the law, report",
        description="Decode a few Spec-Bench prompts per category with our AR baseline and each drafter, record "
                    "traces, fit the entropy law and write figures and a report into OUT/<run-id>/.")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--out", default="runs", help="parent folder of the run folder (default: %(default)s)")
    p.add_argument("--run-id", default=None, help="name of the run folder (default: UTC time)")
    p.add_argument("--model", default=REFERENCE_MODEL, help="target (default: %(default)s)")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS),
                   help="arms to decode with: ar, ngram, ngram-ddtree16, block, block-ddtree16 (default: %(default)s)")
    p.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all)")
    p.add_argument("--tasks", default="spec_bench", help="task file (default: %(default)s)")
    p.add_argument("--n-boot", type=int, default=30, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the prompt sample (LIMIT per category drawn from the whole set) and of the "
                        "analysis (default: %(default)s)")
    p.add_argument("--format", choices=("html", "md"), default="html", help="report format (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 helps on a busy shared machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-chat-template", action="store_true",
                   help="tokenize the prompt text as is instead of applying the model's chat template (a base model "
                        "without one, e.g. gemma3-270m)")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; torch loads only when the demo runs
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.record import prompt_encoder

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    if args.limit < 1:
        raise ValueError(f"--limit must be >= 1 prompt per category, got {args.limit}")
    if args.max_new_tokens < 2:  # said before the model loads (run_demo checks it too)
        raise ValueError(f"--max-new-tokens must be >= 2 (one token after the prefill), got {args.max_new_tokens}")
    categories = None if args.categories is None else [c.strip() for v in args.categories for c in v.split(",") if c.strip()]
    tasks = sample_per_category(load_tasks(args.tasks, categories=categories), args.limit, seed=args.seed)
    print(f"entropy-law demo: {len(tasks)} prompts ({args.limit} per category), {args.max_new_tokens} new tokens, "
          f"arms {' '.join(args.arms)}; loading {args.model} ...", flush=True)
    target = load_target(args.model)
    print(f"model loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    # None: the chat template (run_demo's default); --no-chat-template: the prompt text as is (as `record`)
    encode = prompt_encoder(target, chat_template=not args.no_chat_template, model=args.model)
    result = run_demo(tasks, target, out=args.out, run_id=args.run_id, arms=args.arms,
                      max_new_tokens=args.max_new_tokens, n_boot=args.n_boot, seed=args.seed, encode=encode,
                      report_format=args.format, progress=not args.no_progress,
                      run_metadata={"chat_template": not args.no_chat_template})
    print()
    print(result.summary_text)
    print()
    for message in result.messages:
        print(f"note: {message}")
    t = result.timings_s
    print(f"decode {t['decode_s']:.0f} s, analysis + figures + report {t['analysis_s']:.0f} s, "
          f"total {time.perf_counter() - t0:.0f} s (incl. model load)")
    print(f"report: {result.report_path}")
    print(f"figures: {result.run_dir / 'figures'}   traces: {result.trace_dir}")
    print(next_steps(args.model, result.trace_dir, chat_template=not args.no_chat_template))
    return 1 if result.mismatches else 0


def next_steps(model: str, trace_dir, *, chat_template: bool = True) -> str:
    """The demo's last line: how to ask the same question of the user's own prompts, with this demo's target
    and prompt encoding (a run of another target or encoding would be refused or not comparable); the reference
    traces' law in the drafter's confidence only where they were decoded by this target."""
    flags = ("" if model == REFERENCE_MODEL else f" --model {model}") + ("" if chat_template else " --no-chat-template")
    # the reference traces' block arms ran the default checkpoint too (replayed again with it on 2026-12-05)
    law = ("; or --replay --law-from data/traces --law-tasks spec_bench: the law in the drafter's confidence, "
           "fitted on the reference traces" if model == REFERENCE_MODEL else "")
    return (f"your own prompts, before drafting them: entropy-law record{flags} --drafter ar --tasks FILE --out RUN, "
            f"then entropy-law predict RUN --from {trace_dir} --replay-rounds (each arm's rounds replayed over your "
            f"outputs, priced by its cost model{law})")
