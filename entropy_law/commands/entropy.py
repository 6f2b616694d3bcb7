"""``entropy-law entropy RUN --model M``: the target statistics of an imported engine run, computed offline
(``jobs.entropy.compute_target_stats``; docs/importers.md)."""

from __future__ import annotations

import sys
import time

DTYPES = ("float32", "bfloat16", "float16")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "entropy", help="compute the target statistics (entropy, ...) of an imported engine run, to fit it like ours",
        description="Teacher-force the target over an imported run and write the target_* statistics of every "
                    "output token into it. Resumable; details in docs/cli.md and docs/importers.md.")
    p.add_argument("run", help="a run written by entropy-law import")
    p.add_argument("--model", default="smollm2-135m", help="the target the engine served (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, mps (default: %(default)s)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="model weights and activations (statistics always fp32); bfloat16 is faster but lossy "
                        "(docs/cli.md) (default: %(default)s)")
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa", help="attention kernel")
    p.add_argument("--out", help="write the scored run here, leaving the import as it is (default: in place)")
    p.add_argument("--batch-tokens", type=int, metavar="N",
                   help="most padded tokens per forward; 0: one request each (default: 0 on cpu, 16384 elsewhere)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--flush-every", type=int, default=16, metavar="N",
                   help="write a shard every N scored requests (and once a minute) (default: %(default)s)")
    p.add_argument("--break-lock", action="store_true", help="take over a killed job's stale lock")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; torch loads only when this command runs
    import torch

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.entropy import check_entropy_run, compute_target_stats

    # before the model is loaded; compute_target_stats runs the same check
    check_entropy_run(args.run, out=args.out, break_lock=args.break_lock, flush_every=args.flush_every)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    target = load_target(args.model, dtype=getattr(torch, args.dtype), attn_implementation=args.attention)
    target.model.to(device)
    batch_tokens = args.batch_tokens if args.batch_tokens is not None else (0 if device.type == "cpu" else 16384)
    last = [time.monotonic()]

    def progress(state) -> None:
        if args.no_progress or (time.monotonic() - last[0] < 10 and state.requests_done < state.requests_total):
            return
        last[0] = time.monotonic()
        rate = state.tokens_done / state.seconds if state.seconds else 0.0
        print(f"  {state.requests_done}/{state.requests_total} requests, {state.tokens_done} output tokens, "
              f"{rate:,.0f} tokens/s", file=sys.stderr, flush=True)

    summary = compute_target_stats(args.run, target, out=args.out, batch_tokens=batch_tokens,
                                   flush_every=args.flush_every, break_lock=args.break_lock, on_batch=progress)
    print("\n".join(summary.lines_to_print()))
    return 0
