"""``entropy-law record``: decode benchmark prompts with one arm and write its trace run (``jobs.record.record_arms``);
a failing request is recorded with stop reason "error" and logged, and the run goes on. Details: docs/cli.md.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

DRAFTERS = ("ngram", "block", "hybrid", "ar")
BLOCK_READERS = ("block", "hybrid")  # the drafters that load a block drafter checkpoint (jobs.arms.BLOCK_READERS)
DRAFTER_ALIASES = {"none": "ar"}  # the AR baseline's old name
TREES = ("chain", "ddtree")
DEFAULT_DDTREE_BUDGET = 16


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "record", help="decode benchmark prompts with a drafter and write acceptance traces",
        description="Decode prompts greedily with speculative decoding (lossless: the output equals greedy "
                    "decoding) and write per-token target entropy and per-round acceptance to a trace run.")
    p.add_argument("--model", default="smollm2-135m",
                   help="an embedded target ('smollm2-135m', 'gemma3-270m': see entropy-law info), a local Hugging "
                        "Face model folder or a .gguf file (default: %(default)s)")
    p.add_argument("--drafter", type=lambda value: DRAFTER_ALIASES.get(value, value), choices=DRAFTERS, default="ngram",
                   help="draft source; 'hybrid': prompt lookup and the block drafter in one tree; 'ar': the "
                        "autoregressive baseline (docs/cli.md) (default: %(default)s)")
    p.add_argument("--checkpoint", help="block (or hybrid) drafter: a checkpoint for --model (default: data/drafters/)")
    p.add_argument("--drafter-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="block drafter: the dtype its layers run in; the target stays fp32 and the output greedy "
                        "(docs/cli.md) (default: %(default)s)")
    p.add_argument("--hybrid-skip", type=float, default=None, metavar="E",
                   help="hybrid drafter: the n-gram confidence (expected accepted drafts) at which the block "
                        "forward is skipped (docs/cli.md) (default: the drafter's own)")
    p.add_argument("--tree", choices=TREES, default="chain", help="tree policy (default: %(default)s)")
    p.add_argument("--budget", type=int, default=None,
                   help=f"most draft nodes per tree (default: chain = the full block, ddtree = {DEFAULT_DDTREE_BUDGET})")
    p.add_argument("--block-size", type=int, default=11, help="n-gram: most tokens per round (default: %(default)s)")
    p.add_argument("--max-ngram", type=int, default=4, help="n-gram drafter: longest n-gram matched (default: %(default)s)")
    p.add_argument("--max-matches", type=int, default=4, help="n-gram: matches used (default: %(default)s)")
    p.add_argument("--verify-cost-ratio", type=float, default=2.0,
                   help="verify cost in one-token forwards; drafts when expected accepted drafts reach it - 1")
    p.add_argument("--gate", choices=("ratio", "cost"), default="ratio",
                   help="drafting gate: 'ratio' uses --verify-cost-ratio; 'cost' times this machine's verify "
                        "cost once (docs/cli.md) (default: %(default)s)")
    p.add_argument("--policy", choices=("gate", "law"), default="gate",
                   help="per-round drafting decision: 'gate' (--gate) or 'law', a fitted law policy (--policy-law; "
                        "implies --gate cost; docs/cli.md) (default: %(default)s)")
    p.add_argument("--policy-law", metavar="FITTED.json", help="parameters for --policy law (entropy-law policy)")
    p.add_argument("--policy-borrow", action="store_true",
                   help="apply --policy-law fitted for another drafter, checkpoint or target (borrowed_from)")
    p.add_argument("--tasks", default="spec_bench", help="spec_bench, open_ended or a JSONL task file")
    p.add_argument("--categories", nargs="+", metavar="CATEGORY", help="only these (space or comma separated)")
    p.add_argument("--limit", type=int, default=None, help="at most K prompts per category (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--no-chat-template", action="store_true", help="tokenize the prompt as is, no chat template")
    p.add_argument("--out", required=True, help="run directory for the traces")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue an existing run, skipping completed prompts; the options that shape decoding "
                           "must be those it was recorded with")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing run")
    p.add_argument("--break-lock", action="store_true",
                   help="take over a stale lock or one held by another host; never a running writer on this host")
    p.add_argument("--flush-every", type=int, default=1, metavar="N",
                   help="write finished prompts every N; a crash loses at most those (default: %(default)s)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _categories(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _check_args(args) -> None:
    """The options that the plan (``jobs.plan``) does not check: how they combine on this command line."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.budget is not None and args.budget < 0:
        raise ValueError(f"--budget must be >= 0, got {args.budget}")
    if args.checkpoint is not None and args.drafter not in BLOCK_READERS:
        raise ValueError("--checkpoint is a block drafter checkpoint: use it with --drafter block or hybrid")
    if args.drafter_dtype != "float32" and args.drafter not in BLOCK_READERS:
        raise ValueError("--drafter-dtype sets the block drafter's dtype: use it with --drafter block or hybrid")
    if args.hybrid_skip is not None and args.drafter != "hybrid":
        raise ValueError("--hybrid-skip sets when the hybrid drafter skips its block forward: use it with --drafter "
                         "hybrid")
    if args.hybrid_skip is not None and not 0 <= args.hybrid_skip < math.inf:  # run.json holds finite numbers
        raise ValueError(f"--hybrid-skip must be a finite number >= 0 (above the n-gram block size, e.g. 99: never "
                         f"skip), got {args.hybrid_skip}")
    if (args.policy == "law") != (args.policy_law is not None):
        raise ValueError("--policy law needs --policy-law FITTED.json (and --policy-law needs --policy law)")
    if args.policy_borrow and args.policy != "law":
        raise ValueError("--policy-borrow relabels the parameters of --policy law: use it with --policy law")
    if args.policy == "law" and args.drafter == "ar":
        raise ValueError("--policy law decides when to draft: use it with a drafter, not --drafter ar")
    if args.drafter == "ar" and (args.tree != "chain" or args.budget is not None):
        raise ValueError("--drafter ar decodes autoregressively: --tree and --budget do not apply")


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; torch loads only when this command runs
    from entropy_law.decoding.loading import load_target
    from entropy_law.decoding.vlm import ImageRequests
    from entropy_law.jobs.plan import Limits, Output, RecordPlan
    from entropy_law.jobs.record import chat_prompt, check_run_dir, logger, prompt_encoder, record_arms
    from entropy_law.prompts.image import is_image_task_file, load_image_tasks
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.recorder import RunLockLostError

    if not logging.getLogger().handlers and not logger.handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _check_args(args)
    # the plan's limits and output, checked by the rules a Python caller meets, before anything loads
    limits = Limits(args.max_new_tokens, flush_every=args.flush_every)
    output = Output({args.drafter: Path(args.out)}, resume=args.resume, overwrite=args.overwrite,
                    break_lock=args.break_lock)  # the one arm's run folder is --out itself
    # prompts first: a bad task file or category fails before the model is loaded
    image_tasks = is_image_task_file(args.tasks)  # JSONL lines with an "image" field, or "vlm_tasks"
    if image_tasks and args.drafter in BLOCK_READERS:
        raise ValueError(f"--drafter {args.drafter} reads the hidden states of the text target its block drafter was "
                         "trained for; image tasks need a drafter trained for that VLM (use --drafter ngram or ar)")
    loader = load_image_tasks if image_tasks else load_tasks
    policy = None
    if args.policy == "law":  # before the model: a bad file fails fast
        from entropy_law.payoff.policy import borrow_policy, load_policy
        policy = load_policy(args.policy_law, hybrid=args.drafter == "hybrid")
        if args.policy_borrow:  # for whichever drafter and target this run builds
            policy = borrow_policy(policy, None, model_id=None)
        args.gate = "cost"  # the policy prices trees with this machine's measured verify cost
    drafting = _drafting(args, policy)
    tasks = loader(args.tasks, categories=_categories(args.categories), limit=args.limit)
    if not tasks:
        raise ValueError(f"no prompts to decode in {args.tasks} with these options")
    out = Path(args.out)
    try:  # the output folder before the model (loading takes long)
        check_run_dir(out, resume=args.resume, overwrite=args.overwrite, break_lock=args.break_lock)
    except ValueError as err:
        raise ValueError(f"--out {out}: {_cli_words(str(err))}") from err
    tasks_meta = _tasks_identity(args, out, image_tasks)  # a resume's task file checked before the model too
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    images = None
    if image_tasks:  # a local Qwen2-VL / Qwen2.5-VL / LLaVA folder; pixels go to the prefill only
        images = ImageRequests.load(args.model)
        target = images.target
    else:
        target = load_target(args.model)
    text_ids = None if images is not None else prompt_encoder(target, chat_template=not args.no_chat_template,
                                                              model=args.model)

    def encode(task, decoder):
        if images is not None:  # encodes the image and first turn, attaches the pixels
            return images.prepare(task)
        return (text_ids(task), {}) if text_ids is not None else chat_prompt(task, decoder)

    spec = _arm_spec(args)
    try:
        plan = RecordPlan(
            tasks, [spec], target, output, limits, drafting, encode=encode,
            adapter=images.adapter if images is not None else None, keep_going=True,
            run_metadata={"verify_cost_ratio": args.verify_cost_ratio, "chat_template": not args.no_chat_template,
                          **tasks_meta, **({"policy": policy} if policy is not None else {})})
        recorded = record_arms(plan, progress=not args.no_progress, desc="record")
    except (ValueError, RunLockLostError) as err:  # the recorder's advice (resume=True, ...) in our options
        raise ValueError(_cli_words(str(err))) from err
    except KeyboardInterrupt:  # the recorder has written every finished prompt and let the run go
        raise KeyboardInterrupt(_interrupted(out, args)) from None
    arm = recorded[spec.name]
    _print_summary(args.out, arm)
    if not arm.counts["failed"] and not arm.counts["recorded"] and not arm.counts["already recorded"]:
        raise ValueError(f"nothing was recorded: all {arm.counts['skipped']} prompt(s) were skipped (their reasons "
                         f"are logged above), so {out} holds no prompt; give prompts the model can decode")
    return 1 if arm.counts["failed"] else 0


def _drafting(args, policy):
    """How the drafting arm is built and gated (``jobs.plan.Drafting``), from the options."""
    from entropy_law.jobs.plan import Drafting

    return Drafting(gate=args.gate, verify_cost_ratio=args.verify_cost_ratio, policy=policy,
                    ngram_options=dict(max_ngram=args.max_ngram, block_size=args.block_size,
                                       max_matches=args.max_matches),
                    checkpoint=args.checkpoint, drafter_dtype=args.drafter_dtype,
                    hybrid_options=None if args.hybrid_skip is None else {"skip_block_at": args.hybrid_skip})


def _arm_spec(args):
    """The one arm this command records, named after its drafter (``jobs.arms.ArmSpec``)."""
    from entropy_law.jobs.arms import ArmSpec

    drafts = args.drafter != "ar"
    budget = args.budget
    if drafts and args.tree == "ddtree" and budget is None:
        budget = DEFAULT_DDTREE_BUDGET
    return ArmSpec(args.drafter, args.drafter, tree=args.tree if drafts else "none", budget=budget)


def _tasks_identity(args, out: Path, image_tasks: bool) -> dict:
    """run.json's ``tasks`` (the file as given) and ``tasks_sha256`` (its content: a task file's identity, not its
    path). A resume must give a file of the same content, by any path (checked here, before the model loads); a run
    that stored no hash is checked by the content of the file its ``tasks`` names. ``--resume`` needs a run."""
    from entropy_law.prompts.image import image_task_file
    from entropy_law.prompts.text import task_file
    from entropy_law.traces.layout import RUN_FILE, file_sha256, read_run_json

    sha = file_sha256((image_task_file if image_tasks else task_file)(args.tasks)[1])
    given = {"tasks": str(args.tasks), "tasks_sha256": sha}
    if not args.resume:
        return given
    if not (out / RUN_FILE).is_file():
        raise ValueError(f"--out {out}: no run to resume there (no {RUN_FILE}); check the path, or drop --resume to "
                         "start a new run")
    stored = read_run_json(out / RUN_FILE)
    if "tasks" not in stored:
        return given  # not recorded by this command: the recorder names what differs
    recorded = stored.get("tasks_sha256")
    if recorded is None:  # an older run: the file its path names, if it is still there
        try:
            recorded = file_sha256((image_task_file if image_tasks else task_file)(stored["tasks"])[1])
        except (OSError, ValueError):
            recorded = None
        kept = {"tasks": stored["tasks"]}  # the recorder compares the keys a run holds
    else:
        kept = {"tasks": stored["tasks"], "tasks_sha256": recorded}
    builtin = ("vlm_tasks",) if image_tasks else ("spec_bench", "open_ended")
    dataset, stored_dataset = ((t if t in builtin else Path(t).expanduser().stem) for t in (str(args.tasks),
                                                                                          str(stored["tasks"])))
    if dataset != stored_dataset:  # request ids are "<dataset>:<question_id>": another name, other ids
        raise ValueError(f"--tasks {args.tasks}: {out} was recorded from {stored['tasks']}, whose request ids are "
                         f"named {stored_dataset!r}:<question_id>; resume with that file (by any path), or record "
                         "into a new --out")
    if recorded != sha:
        raise ValueError(f"--tasks {args.tasks} is not the task file {out} was recorded from ({stored['tasks']}"
                         + (f": content SHA-256 {recorded[:12]}..., given {sha[:12]}..." if recorded else
                            ", which is no longer there to compare")
                         + "); resume with that file, or record into a new --out")
    return kept


def _interrupted(out: Path, args) -> str:
    """What an interrupted ``record`` kept (the finished prompts in the run's shards) and how to go on."""
    import pyarrow.parquet as pq

    from entropy_law.traces.layout import RUN_FILE, shard_dirs, table_file

    if not (out / RUN_FILE).exists():
        return f"nothing was recorded into {out}; run the same command again"
    try:
        kept = str(sum(pq.read_metadata(shard / table_file("requests")).num_rows for shard in shard_dirs(out)))
    except (OSError, ValueError):  # an unreadable shard: the next --resume says which
        kept = "the"
    how = "the same command" + ("" if args.resume else " with --resume" if not args.overwrite
                               else " with --resume in place of --overwrite")
    return (f"{out} keeps {kept} finished prompt(s), the prompt being decoded was not recorded; to go on, run "
            f"{how} (it skips the prompts already recorded)")


def _cli_words(message: str) -> str:
    """The recorder's advice in this command's options."""
    for api, option in (("record into a new directory", "record into a new --out"), ("resume=True", "--resume"),
                        ("overwrite=True", "--overwrite"), ("break_lock=True", "--break-lock")):
        message = message.replace(api, option)
    return message


def _print_summary(run_dir: str, arm) -> None:
    """What the run did (``jobs.record.ArmResult``): counts, decode speed, committed tokens per round."""
    counts, new_tokens, decode_s = arm.counts, arm.new_tokens, arm.decode_s
    print(f"trace run {run_dir}: recorded {counts['recorded']}, already recorded {counts['already recorded']}, "
          f"skipped {counts['skipped']}, failed {counts['failed']}")
    if counts["recorded"]:
        print(f"new tokens {new_tokens} in {decode_s:.1f} s ({new_tokens / max(decode_s, 1e-9):.1f} tokens/s)")
        for category, values in sorted(arm.committed_per_round.items()):
            finite = [v for v in values if v == v]
            mean = sum(finite) / len(finite) if finite else float("nan")
            print(f"  {category:<16} prompts {len(values):>4}   mean committed tokens per round {mean:.2f}")
