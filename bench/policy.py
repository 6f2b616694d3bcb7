"""Drafting policies: the law policy timed against fixed budgets and gates, its ceiling (the oracles), its replay
over recorded workloads, the cost gate against the law policy.

Subcommands (each prints a table and ends with one JSON line):

    python bench/policy.py policy [ARGS]
    python bench/policy.py ceiling [ARGS]
    python bench/policy.py replay [ARGS]
    python bench/policy.py gate-vs-law [ARGS]
    python bench/policy.py controllers [ARGS]
    python bench/policy.py controllers-timed [ARGS]
    python bench/policy.py controllers-loco [ARGS]
    python bench/policy.py controllers-gap [ARGS]
    python bench/policy.py controllers-signals [ARGS]

``python bench/policy.py SUBCOMMAND --help`` lists a subcommand's arguments.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib import exit_code, measured_line, run_subcommand  # noqa: E402

from entropy_law.decoding.adapter import TargetAdapter  # noqa: E402
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder, measure_draft_cost  # noqa: E402
from entropy_law.decoding.gate import CostGate, RatioGate, measure_verify_cost  # noqa: E402
from entropy_law.decoding.policy import LawPolicy, make_policy  # noqa: E402
from entropy_law.decoding.loading import load_target  # noqa: E402
from entropy_law.decoding.replay import HindsightPolicy, oracle_rounds  # noqa: E402
from entropy_law.drafters.block import BlockDrafter, default_drafter_path  # noqa: E402
from entropy_law.drafters.ngram import NgramDrafter  # noqa: E402
from entropy_law.jobs.record import prompt_encoder  # noqa: E402
from entropy_law.jobs.speed import ALL, decoder_arm, format_speedup, paired_speedups, print_progress, time_arms  # noqa: E402
from entropy_law.payoff.policy import borrow_policy, fit_policy, hybrid_policy  # noqa: E402
from entropy_law.prompts.paths import data_dir  # noqa: E402
from entropy_law.prompts.text import load_tasks, sample_per_category  # noqa: E402
from entropy_law.traces.layout import file_sha256  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402


# --- policy ----------------------------------------------------------------------------------------------------------

AR = "AR"
FIXED_BUDGETS = (4, 8, 16, 32)
ORACLE_BUDGETS = (0, 1, 2, 4, 8, 16, 32)
POLICY_MAX_NODES = 32
UNCALIBRATED = "uncalibrated"  # the law policy without its in-request calibration (as before it existed)
NO_FORGETTING = "no forgetting"  # the calibration without its half-life (evidence never fades)


def fitted_policy(traces_dir: Path, drafter: str, exclude_question_ids: set[str], draft_cost: float | None,
                  target=None) -> dict:
    """Policy parameters from the reference traces of ``drafter`` (``traces_dir / drafter``), without the requests
    this bench decodes; with ``target``, with the copyability input (``jobs.reference.context_matches`` of the traces'
    run, the prompts rebuilt from Spec-Bench with the target's tokenizer)."""
    run_dir = traces_dir / drafter
    traces = load_traces(run_dir)
    requests = traces.requests
    keep = requests.loc[~requests["question_id"].astype(str).isin(exclude_question_ids), "request_id"]
    from types import SimpleNamespace
    held_out = SimpleNamespace(tokens=traces.tokens.loc[traces.tokens["request_id"].isin(keep)],
                               rounds=traces.rounds.loc[traces.rounds["request_id"].isin(keep)],
                               runs=traces.runs, requests=requests.loc[requests["request_id"].isin(keep)])
    lengths = None
    if target is not None:
        from entropy_law.jobs.reference import context_matches

        lengths = context_matches(run_dir, target, tasks="spec_bench")
        lengths = lengths.loc[lengths["request_id"].isin(set(keep.astype(str)))]
    return fit_policy(held_out, draft_cost=draft_cost, context_match=lengths)


def json_row(row, keys) -> dict:
    """A speed row's numbers for the JSON line (NaN -> null, 4 decimals) with its verdict."""
    return {k: (None if row[k] != row[k] else round(float(row[k]), 4)) for k in keys} | {"verdict": row["verdict"]}


def policy_arguments(parser) -> None:
    """The arguments of ``policy``."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="tokenize the prompt text as is (a base model without a chat template)")
    parser.add_argument("--traces", default=None, metavar="DIR",
                        help="reference traces the law policies are fitted on, one folder per drafter (DIR/ngram, "
                             "DIR/block: chain runs of Spec-Bench, e.g. entropy-law record --drafter ngram --tree "
                             "chain --verify-cost-ratio 1.0 --out DIR/ngram), decoded by --model to test its own law "
                             "(default: data/traces, SmolLM2-135M's)")
    parser.add_argument("--limit", type=int, default=2, help="prompts per category (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block", action="store_true", help="also the block drafter's arms (cost gate, law policy)")
    parser.add_argument("--block-fixed", action="store_true", help="with --block, also its fixed chain and DDTree16")
    parser.add_argument("--checkpoint", default=None,
                        help="with --block: this block drafter checkpoint instead of the default one (e.g. the sixth, "
                             "data/drafters/smollm2-135m-block-b8.safetensors, which data/traces was decoded with)")
    parser.add_argument("--also-checkpoint", default=None, metavar="PATH",
                        help="with --block: a second block drafter checkpoint timed beside the first, in the same "
                             "interleaved run: its DDTree16 cost gate (and fixed DDTree16 with --block-fixed), as arms "
                             "named 'ckpt:<last part of its name> ...' (no law policy: its law is not fitted)")
    parser.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="with --block: the block drafter's compute dtype (BlockDrafter.set_compute_dtype; the "
                             "target stays fp32, the output greedy) (default: %(default)s)")
    parser.add_argument("--also-compute-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the --also-checkpoint drafter's compute dtype (the same file in another dtype: a "
                             "paired comparison of the two dtypes) (default: %(default)s)")
    parser.add_argument("--hybrid", action="store_true",
                        help="with --block, also the hybrid drafter (n-gram + block in one tree): cost gate and law "
                             "policy (each round the drafter whose own fitted law pays more: payoff.policy.hybrid_policy)")
    parser.add_argument("--hybrid-skip", type=float, default=None, metavar="E",
                        help="with --hybrid: HybridDrafter(skip_block_at=E), the n-gram chain confidence at which the "
                             "block forward is skipped (0: whenever the n-gram proposes anything) (default: the "
                             "drafter's own default)")
    parser.add_argument("--context-match", action="store_true",
                        help="the law policies read the context's copyability before each round (fit_policy("
                             "context_match=): the law per level of the longest repeated suffix of the context)")
    parser.add_argument("--only", nargs="+", default=None, metavar="ARM", help="run only these arms (and AR)")
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])


def run_policy(args, parser) -> dict:
    """The law policy against fixed trees, the cost gate, AR and the replay oracle: tokens per CPU-second.

    Arms (every arm on the same prompts, interleaved per prompt in a rotating order, after one warm-up, timed by
    this process's CPU clock with one torch thread, through the one speed routine ``entropy_law.jobs.speed``):

    - ``AR``: our autoregressive decoder (the reference);
    - for the n-gram drafter: a fixed chain and fixed DDTrees with N in {4, 8, 16, 32} (no gate: every drafted node
      is verified), the current cost gate (DDTree16, the measured verify-cost curve), and the law policy (DDTree
      drafted with up to 32 nodes; the policy decides per round whether to draft and how many nodes to verify),
      and the law policy without its in-request calibration (``ngram law uncalibrated``) and with a calibration
      whose evidence never fades (``ngram law no forgetting``);
    - with ``--block``: the block drafter (shipped checkpoint): cost gate, law policy (the same three variants);
      fixed chain and DDTree16 with ``--block-fixed``; with ``--also-checkpoint PATH`` a second checkpoint's cost gate
      (and fixed DDTree16) in the same interleaved run, to compare two drafters by CPU time on the same prompts;
      ``--compute-dtype`` / ``--also-compute-dtype bfloat16`` run a block drafter's layers in bf16 (the same file
      twice: the two dtypes compared);
    - with ``--block --hybrid``: the hybrid drafter (n-gram matches and block candidates in one tree): its cost gate
      (DDTree16; ``--hybrid-skip`` sets when its n-gram proposal alone is used) and its law policy (each round the
      drafter whose own fitted law promises the higher rate, its cost included, or none: ``payoff.policy.hybrid_policy``);
    - the replay oracle of each drafter run (tokens per round and modelled rate only: it is not a decoder): for each
      round in hindsight the budget in {0, 1, 2, 4, 8, 16, 32} with the most committed tokens per unit of modelled
      cost ``c(N + 1) + c_draft``, replayed on AR's greedy output of the same prompt, for each drafter with an arm in the
      run: the n-gram drafter's, and the block drafter's (its proposals from one teacher-forced target pass per prompt,
      ``jobs.reference.replay_drafter``; ``c_draft`` its forward's cost measured here). Each law policy's "within 10%
      of the oracle" goal reads its own drafter's oracle;
    - ``ngram oracle`` (and ``block oracle`` with ``--block``): that oracle timed, its rounds played on the target like
      any arm's (``decoding.replay.HindsightPolicy``: the replayed oracle's budget from each output position, the drafter
      skipped where it took a plain step): a ceiling measured by the same clock as the law policy, and a check of how far
      the modelled rate is from what its own rounds cost (the cost curve is timed at one context length, 3-7% below
      the decoder's rounds). The block drafter's live proposals can differ a little from its replayed ones; rounds that
      leave the replayed schedule are counted and choose by hindsight too.

    With ``--context-match`` the law policies also read the context's copyability before each round (the law per
    level of the longest suffix of the context that occurred earlier in it; ``fit_policy(context_match=)``).

    The law policy's parameters are fitted here (``entropy_law.payoff.policy.fit_policy``) from the reference traces
    in ``data/traces/<drafter>`` (Spec-Bench, chain runs; ``--traces DIR`` reads ``DIR/<drafter>`` instead, e.g. another
    target's own runs), leaving out every Spec-Bench question this bench decodes (held-out prompts; the open-ended set is
    never in the traces). Each drafter's own cost per round is measured here on the warm-up prompt by the thread's CPU
    clock, against the target's one-token step (``decoding.decoder.measure_draft_cost``).

    Prompts: ``--limit`` per category of Spec-Bench and of the open-ended set (``data/open_ended``), a seeded sample
    of each whole set. Reports per category the paired speedup over AR with its 95% request-bootstrap interval,
    tokens per round and the verify-only bound (tokens per round over the measured verify cost of the trees verified:
    the drafter's own cost and the round's overhead are not in it, so it is an upper bound, far above the block
    drafter's measured speedups; the oracle's modelled rate does count the drafter's cost); with ``--also-checkpoint``
    the second checkpoint's arms paired against the first's on the same requests, and the hybrid law policy against each
    drafter's law policy (JSON ``head_to_head``);
    then each prompt set's overall row (Spec-Bench and the open-ended set apart: the hybrid's goal reads Spec-Bench's),
    then each law policy against its oracle twice: measured against modelled (the goal's reading) and modelled against
    modelled (the policy's own rounds priced as the oracle prices its rounds: ``c(N + 1)`` plus the drafter's cost per
    round it ran, no per-round overhead), measured against the oracle's modelled rate with the prefill priced in (each
    prompt's prefill in one-token steps, from AR's reference decode of it: a measured speedup counts the prefill, which
    every arm pays, and the decode-only model does not) and measured against the timed oracle (paired per request too),
    then the cost model against the measurement for every drafting arm (its own rounds priced, with and without the
    prefill, against its measured speedup: JSON ``cost_model``), then the goals, and ONE JSON line.

        OMP_NUM_THREADS=1 python bench/policy.py policy --limit 2 --max-new-tokens 128        # small
        OMP_NUM_THREADS=1 python bench/policy.py policy --limit 5 --max-new-tokens 256 --block # the goals' setting
        OMP_NUM_THREADS=1 python bench/policy.py policy --model gemma3-270m --no-chat-template --traces runs/gemma  # its own law
    """
    if not args.block and (args.checkpoint or args.also_checkpoint or args.block_fixed or args.hybrid
                           or args.compute_dtype != "float32"):
        parser.error("--checkpoint, --also-checkpoint, --block-fixed, --hybrid and --compute-dtype need --block")
    if args.also_compute_dtype != "float32" and not args.also_checkpoint:
        parser.error("--also-compute-dtype sets the --also-checkpoint drafter's dtype: give --also-checkpoint")
    if args.hybrid_skip is not None and not args.hybrid:
        parser.error("--hybrid-skip needs --hybrid")
    torch.set_num_threads(1)

    target = load_target(args.model)
    tasks = [t for name in args.sets for t in sample_per_category(load_tasks(name), args.limit, seed=args.seed)]
    encoder, raw = ARDecoder(target), prompt_encoder(target, chat_template=not args.no_chat_template, model=args.model)
    prompt_of = {t.request_id: encoder.encode_prompt(t.messages()) if raw is None else raw(t) for t in tasks}
    traces_dir = Path(args.traces) if args.traces else data_dir() / "traces"
    decoded_ids = {str(t.question_id) for t in tasks if t.dataset == "spec_bench"}

    verify_cost = measure_verify_cost(TargetAdapter(target.model))
    print(f"verify cost c(n) (one-token forward = 1): {verify_cost.describe()}", flush=True)
    traces_runs = load_traces(traces_dir / "ngram").runs
    traces_models = {str(m) for m in traces_runs["model_id"]}
    foreign = str(target.model_id) not in traces_models  # the laws come from another target's traces
    copy_target = None
    if args.context_match:  # the traces' prompts rebuilt with the tokenizer of the target that decoded them
        from entropy_law.jobs.reference import runs_target

        copy_target = runs_target(traces_runs) if foreign else target
    warm = prompt_of[tasks[0].request_id]  # each drafter's cost per call, measured here (CPU clock) on this prompt
    ngram_cost = measure_draft_cost(target, NgramDrafter(), warm)
    print(f"n-gram drafter cost: {ngram_cost:.4f} one-token forwards per round (measured here, the thread's CPU "
          "clock)", flush=True)
    laws = {"ngram": fitted_policy(traces_dir, "ngram", decoded_ids, ngram_cost, copy_target)}
    block_path = Path(args.checkpoint) if args.checkpoint else default_drafter_path()
    if args.block:  # its traces are replayed (no timings): time its forward here, against a one-token step
        block_cost = measure_draft_cost(target, BlockDrafter.load(block_path, target, compute_dtype=args.compute_dtype),
                                        warm)
        print(f"block drafter cost: {block_cost:.3f} one-token forwards per round (measured here, the thread's CPU "
              "clock)", flush=True)
        laws["block"] = fitted_policy(traces_dir, "block", decoded_ids, block_cost, copy_target)
        block_sha = file_sha256(block_path)
        if laws["block"].get("checkpoint_sha256") != block_sha:  # data/traces' checkpoint's law, applied knowingly
            print(f"block drafter: {block_path}; its law policy is fitted on {traces_dir / 'block'}, decoded by "
                  "another checkpoint, and borrowed: the fixed arms and the cost gate need no fit", flush=True)
            laws["block"] = borrow_policy(laws["block"], laws["block"]["drafter_id"], block_sha)
    if foreign:  # the decoder refuses a law of another target unless it is borrowed knowingly
        print(f"target {target.model_id}: the reference traces (data/traces) were decoded by "
              f"{', '.join(sorted(traces_models))}; the law policies fitted on them are BORROWED for this target (its "
              "entropies may sit on another scale; the in-request calibration corrects the law's level, not its "
              "shape): fit a policy on this target's own runs to test its law", flush=True)
        laws = {name: borrow_policy(law, law["drafter_id"], law.get("checkpoint_sha256"), model_id=target.model_id)
                for name, law in laws.items()}
    for name, law in laws.items():
        print(f"{name} policy: fitted on {law['fitted_on']['requests']} held-out requests "
              f"({law['fitted_on']['at_risk_trials']} trials), draft cost {law['draft_cost']:.4f}; "
              f"a(H_w, d=1) at H_w = 0.1 / 1 / 3 nats: "
              + " / ".join(f"{np.interp(np.log(h + 1e-3), np.log(np.array(law['entropy_grid']) + 1e-3), np.array(law['acceptance'])[:, 0]):.2f}"
                           for h in (0.1, 1.0, 3.0))
              + (f"; copyability levels {law['context_match']['levels']}" if law.get("context_match") else ""), flush=True)

    def ours(make):  # built when listed
        return decoder_arm(make())

    def ngram():
        return NgramDrafter()

    def fixed():  # a fixed tree: every drafted node verified (a fresh policy object per decoder)
        return {"policy": RatioGate(min_expected_accepted=0.0)}
    arms = {AR: ours(lambda: ARDecoder(target)),
            "ngram chain": ours(lambda: SpeculativeDecoder(target, ngram(), tree="chain", **fixed()))}
    for n in FIXED_BUDGETS:
        arms[f"ngram ddtree{n}"] = ours(lambda n=n: SpeculativeDecoder(target, ngram(), tree="ddtree", budget=n,
                                                                       **fixed()))
    arms["ngram ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, ngram(), tree="ddtree", budget=16,
                                                                       policy=CostGate(verify_cost)))

    def law_variants(name, drafter):
        """The law policy of ``name`` as fitted, with its calibration never fading, and without calibration."""
        for arm, change in ((f"{name} law", {}), (f"{name} law {NO_FORGETTING}", {"calibration_half_life": None}),
                            (f"{name} law {UNCALIBRATED}", {"calibration_prior": None})):
            arms[arm] = ours(lambda change=change: SpeculativeDecoder(
                target, drafter(), tree="ddtree", budget=POLICY_MAX_NODES,
                policy=make_policy({**laws[name], **change}, verify_cost)))
    law_variants("ngram", ngram)
    if args.block:
        def block():
            return BlockDrafter.load(block_path, target, compute_dtype=args.compute_dtype)
        if args.block_fixed:
            arms["block chain"] = ours(lambda: SpeculativeDecoder(target, block(), tree="chain", **fixed()))
            arms["block ddtree16"] = ours(lambda: SpeculativeDecoder(target, block(), tree="ddtree", budget=16,
                                                                     **fixed()))
        arms["block ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, block(), tree="ddtree", budget=16,
                                                                           policy=CostGate(verify_cost)))
        law_variants("block", block)
        if args.also_checkpoint:
            other_path = Path(args.also_checkpoint)
            if not other_path.is_file():
                raise SystemExit(f"--also-checkpoint {other_path}: no such file")
            label = "ckpt:" + other_path.name.removesuffix(".safetensors").rsplit("-", 1)[-1]
            label += "-bf16" if args.also_compute_dtype == "bfloat16" else ""

            def other():
                return BlockDrafter.load(other_path, target, compute_dtype=args.also_compute_dtype)
            if args.block_fixed:
                arms[f"{label} ddtree16"] = ours(lambda: SpeculativeDecoder(target, other(), tree="ddtree", budget=16,
                                                                            **fixed()))
            arms[f"{label} ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(
                target, other(), tree="ddtree", budget=16, policy=CostGate(verify_cost)))

    routes = Counter()  # the hybrid law's rounds by the drafter it ran ("none": declined)
    if args.hybrid:
        from entropy_law.drafters.hybrid import HybridDrafter

        def hybrid():
            skip = {} if args.hybrid_skip is None else {"skip_block_at": args.hybrid_skip}
            return HybridDrafter(NgramDrafter(), BlockDrafter.load(block_path, target,
                                                                   compute_dtype=args.compute_dtype), **skip)
        arms["hybrid ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, hybrid(), tree="ddtree", budget=16,
                                                                            policy=CostGate(verify_cost)))
        # each round the drafter whose own law pays more (prompt lookup nearly free, the block forward not)
        routed = ours(lambda: SpeculativeDecoder(target, hybrid(), tree="ddtree", budget=POLICY_MAX_NODES,
                                                 policy=make_policy(hybrid_policy(laws["ngram"], laws["block"]),
                                                                    verify_cost)))

        def hybrid_law(prompt_ids, max_new_tokens):  # counts which drafter each decode round ran (warm-up included)
            token_ids, rounds = routed(prompt_ids, max_new_tokens)
            routes.update(r.policy["route"] if r.policy["draft"] else "none" for r in rounds if r.policy)
            return token_ids, rounds
        arms["hybrid law"] = hybrid_law

    # the replay oracle of each drafter, timed: its rounds played on the target (decoding.replay.HindsightPolicy),
    # from AR's greedy output and the replayed oracle of the same prompt (both filled in below, before the timing)
    references = {}  # (drafter, prompt ids) -> (AR's greedy output, its replay oracle)
    off_schedule = Counter()  # the timed oracle's decode rounds that left the replayed oracle's schedule

    def timed_oracle(drafter, make_drafter):
        drafts = make_drafter()  # loaded once, as every arm's drafter (begin() starts each request afresh)

        def run(prompt_ids, max_new_tokens):
            output, result = references[drafter, tuple(prompt_ids)]
            policy = HindsightPolicy(output[:max_new_tokens], result, verify_cost=verify_cost,
                                     draft_cost=laws[drafter]["draft_cost"], budgets=ORACLE_BUDGETS,
                                     max_new_tokens=max_new_tokens)
            token_ids, rounds = decoder_arm(SpeculativeDecoder(target, drafts, tree="ddtree",
                                                               budget=POLICY_MAX_NODES, policy=policy))(prompt_ids, max_new_tokens)
            if max_new_tokens == args.max_new_tokens:  # not the warm-up's short decode
                off_schedule[drafter] += sum(1 for r in rounds if r.policy and r.policy["scheduled"] != r.tree_nodes)
            return token_ids, rounds
        return run
    arms["ngram oracle"] = timed_oracle("ngram", ngram)
    if args.block:
        arms["block oracle"] = timed_oracle("block", block)
    if args.only:
        unknown = sorted(set(args.only) - set(arms))
        if unknown:
            raise SystemExit(f"unknown arm(s) {unknown}; arms: {sorted(arms)}")
        arms = {name: run for name, run in arms.items() if name in args.only or name == AR}

    # each drafter's replay oracle on AR's greedy outputs (before the timing: the timed oracle arms read them)
    from entropy_law.jobs.reference import replay_drafter

    oracle_drafters = {}  # the oracle of each drafter whose arms run
    if any(name.startswith("ngram") for name in arms):
        oracle_drafters["ngram"] = lambda prompt, output: NgramDrafter()
    if any(name.startswith("block") for name in arms):
        block_once = block()
        oracle_drafters["block"] = lambda prompt, output: replay_drafter(block_once, target, prompt, output)
    oracle_rows, prefill_of = [], {}  # prefill_of: request id -> its prefill in one-token steps
    for task in tasks if oracle_drafters else ():
        prompt = prompt_of[task.request_id]
        reference = ARDecoder(target).generate(prompt, max_new_tokens=args.max_new_tokens)
        output = reference.token_ids
        # the prompt's prefill in one-token steps (this decode's own, by its wall clock): every arm pays it, and a
        # measured speedup counts it, while the oracle's rounds do not
        prefill = (reference.prefill_ms / (reference.decode_ms / (len(output) - 1))
                   if len(output) > 1 and reference.decode_ms > 0 else 0.0)
        prefill_of[task.request_id] = prefill
        for drafter, make in oracle_drafters.items():
            result = oracle_rounds(prompt, output, make(prompt, output), budgets=ORACLE_BUDGETS,
                                   verify_cost=verify_cost, draft_cost=laws[drafter]["draft_cost"],
                                   eos_token_ids=target.model.generation_config.eos_token_id,
                                   max_new_tokens=args.max_new_tokens, max_context=None)
            oracle_rows.append(dict(drafter=drafter, category=task.category, dataset=task.dataset,
                                    committed=sum(result.committed),
                                    rounds=len(result.committed), cost=sum(result.cost), prefill=prefill))
            references[drafter, tuple(prompt)] = (output, result)
    import pandas as pd
    oracle = pd.DataFrame(oracle_rows)

    timings = time_arms(tasks, arms, lambda task: prompt_of[task.request_id], max_new_tokens=args.max_new_tokens,
                        reference=AR, warm_up_tokens=16, verify_cost=verify_cost, progress=print_progress)
    speed = paired_speedups(timings, reference=AR, clock="cpu", seed=args.seed)
    set_of = {t.request_id: t.dataset for t in tasks}  # each prompt set's own overall row (the goals read "on Spec-Bench")
    by_set = paired_speedups(timings.assign(category=timings["request_id"].map(set_of)), reference=AR, clock="cpu",
                             seed=args.seed)
    by_set = by_set.loc[by_set["category"] != ALL]
    sets = list(dict.fromkeys(set_of.values()))

    categories = list(dict.fromkeys(task.category for task in tasks))
    names = [n for n in arms if n != AR]

    def cell(name, category):
        row = speed.loc[(speed["arm"] == name) & (speed["category"] == category)]
        return None if row.empty else row.iloc[0]

    def oracle_of(category, drafter="ngram", column="category"):
        """(tokens per round, modelled rate, modelled rate with the prefill priced in: the AR request's cost, its
        prefill plus one step per later token, over the oracle's, the same prefill plus its rounds)."""
        part = oracle.loc[oracle["drafter"] == drafter]
        part = part if category == ALL else part.loc[part[column] == category]
        committed, prefill = part["committed"].sum(), part["prefill"].sum()
        return (committed / part["rounds"].sum(), committed / part["cost"].sum(),
                (prefill + committed) / (prefill + part["cost"].sum()))

    print(f"\nSpeedup over {AR} by CPU time (one torch thread; a shared machine, load average "
          f"{os.getloadavg()[0]:.1f}), paired per request, 95% request-bootstrap interval; {args.limit} prompts per "
          f"category (seed {args.seed}), {args.max_new_tokens} new tokens. SMALL RUN: intervals are wide.")
    for name in names:
        print(name)
        for category in [*categories, ALL]:
            row = cell(name, category)
            if row is not None:
                print(f"    {category:<16} {format_speedup(row)}   tokens/round {row['tokens_per_round']:.2f}, "
                      f"verify-only bound {row['bound']:.2f}x")
    head_to_head = {}
    pairs = []  # (reference, arm) paired on the same requests, not through AR
    if args.block and args.also_checkpoint:  # the two checkpoints
        pairs += [(f"block {suffix}", f"{label} {suffix}") for suffix in ("ddtree16 cost gate", "ddtree16")]
    pairs += [(f"{drafter} law", "hybrid law") for drafter in ("ngram", "block")]  # the hybrid against each drafter's
    pairs += [(f"{drafter} oracle", f"{drafter} law") for drafter in ("ngram", "block")]  # each law against its oracle
    for first, second in pairs:
        if first not in arms or second not in arms:
            continue
        pair = paired_speedups(timings.loc[timings["arm"].isin([first, second])], reference=first, clock="cpu",
                               seed=args.seed)
        print(f"{second} over {first} (paired per request, 95% request-bootstrap interval)")
        for _, row in pair.iterrows():
            print(f"    {row['category']:<16} {format_speedup(row)}")
        head_to_head[f"{second} / {first}"] = {row["category"]: json_row(row, ("speedup", "lo", "hi"))
                                               for _, row in pair.iterrows()}
    for drafter in oracle_drafters:
        print(f"replay oracle ({drafter}, best N per round in hindsight; modelled, not timed)")
        for category in [*categories, ALL]:
            tpr, rate, with_prefill = oracle_of(category, drafter)
            print(f"    {category:<16} tokens/round {tpr:.2f}, modelled {rate:.2f}x ({with_prefill:.2f}x with the "
                  "prefill priced in)")

    print(f"\n{'speedup (point)':<26}" + "".join(f"{c[:11]:>12}" for c in categories) + f"{'all':>12}")
    for name in names:
        print(f"{name:<26}" + "".join(f"{cell(name, c)['speedup']:>12.2f}" for c in [*categories, ALL]))
    for drafter in oracle_drafters:
        print(f"{drafter + ' oracle (modelled)':<26}" + "".join(f"{oracle_of(c, drafter)[1]:>12.2f}"
                                                               for c in [*categories, ALL]))
        print(f"{drafter + ' oracle (+ prefill)':<26}" + "".join(f"{oracle_of(c, drafter)[2]:>12.2f}"
                                                                for c in [*categories, ALL]))
    if len(sets) > 1:
        def set_cell(name, dataset):
            return by_set.loc[(by_set["arm"] == name) & (by_set["category"] == dataset)].iloc[0]

        print("\nEach prompt set overall (paired per request, 95% request-bootstrap interval)")
        for name in names:
            print(f"{name:<26}" + "".join(f"  {d}: {format_speedup(set_cell(name, d))}" for d in sets))
        for drafter in oracle_drafters:
            print(f"{drafter + ' oracle (modelled)':<26}"
                  + "".join(f"  {d}: {oracle_of(d, drafter, 'dataset')[1]:.2f}x" for d in sets))

    def modelled(name, drafter, prefill=False):
        """The arm's committed tokens after the prefill per unit of modelled cost, priced as the oracle prices its
        rounds: c(N + 1) per verify plus ``drafter``'s cost per round it ran; None without a decode round. With
        ``prefill``, each request's prefill (in one-token steps) is added to both AR's cost and the arm's."""
        part = timings.loc[timings["arm"] == name]
        cost = part["verify_cost"].sum() + laws[drafter]["draft_cost"] * part["draft_calls"].sum()
        tokens = (part["new_tokens"] - 1).clip(lower=0).sum()
        if prefill and cost > 0:
            steps = part["request_id"].map(prefill_of).fillna(0.0).sum()
            tokens, cost = tokens + steps, cost + steps
        return float(tokens / cost) if cost > 0 else None

    cost_model = {}  # each drafting arm's modelled rate against its measured one: is the model a fair ceiling?
    for name in names:
        drafter = name.split()[0]
        decode_only, with_steps = (modelled(name, drafter), modelled(name, drafter, prefill=True)) if (
            drafter in laws and prefill_of) else (None, None)
        if with_steps is not None:
            measured = float(cell(name, ALL)["speedup"])
            cost_model[name] = {"modelled": round(decode_only, 4), "modelled_with_prefill": round(with_steps, 4),
                                "measured": round(measured, 4)}
    if cost_model:
        print("The cost model against the measurement, overall (each arm's own rounds priced c(N + 1) + the drafter's "
              "cost per call; with the prefill: each prompt's prefill, from AR's reference decode, added to both "
              "sides):")
        for name, row in cost_model.items():
            print(f"    {name:<24} modelled {row['modelled']:.2f}x, with the prefill "
                  f"{row['modelled_with_prefill']:.2f}x, measured {row['measured']:.2f}x "
                  f"({row['modelled_with_prefill'] / row['measured'] - 1:+.1%})")

    law_vs_oracle = {}
    for drafter in oracle_drafters:
        law = f"{drafter} law"
        if law in names:
            _, ceiling, with_prefill = oracle_of(ALL, drafter)
            rate = modelled(law, drafter)
            law_vs_oracle[drafter] = {"measured": round(float(cell(law, ALL)["speedup"]), 4),
                                      "modelled": None if rate is None else round(rate, 4),
                                      "oracle_modelled": round(float(ceiling), 4),
                                      "oracle_modelled_with_prefill": round(float(with_prefill), 4)}
            print(f"{law} against the {drafter} oracle: measured {cell(law, ALL)['speedup']:.2f}x is "
                  f"{1 - cell(law, ALL)['speedup'] / ceiling:.1%} below the oracle's modelled {ceiling:.2f}x; "
                  + ("it verified nothing to price" if rate is None else
                     f"its own rounds priced as the oracle's (c(N + 1) + the drafter's cost per call, no per-round "
                     f"overhead) {rate:.2f}x, {1 - rate / ceiling:.1%} below it (modelled against modelled)")
                  + f"; {1 - cell(law, ALL)['speedup'] / with_prefill:.1%} below the oracle's modelled rate with the "
                  f"prefill priced in, {with_prefill:.2f}x (a measured speedup counts the prefill)")
            timed = cell(f"{drafter} oracle", ALL)
            if timed is not None:  # the oracle's rounds played on the target and timed like the law's
                law_vs_oracle[drafter].update(oracle_measured=round(float(timed["speedup"]), 4),
                                              off_schedule_rounds=off_schedule[drafter])
                mine = cell(law, ALL)["speedup"]
                print(f"{law} against the {drafter} oracle timed (its rounds played on the target): measured "
                      f"{mine:.2f}x is {abs(1 - mine / timed['speedup']):.1%} "
                      f"{'below' if mine < timed['speedup'] else 'above'} its measured {timed['speedup']:.2f}x "
                      "(measured against measured; its own rounds priced: the cost-model check above)"
                      + f"; {off_schedule[drafter]} of its decode rounds left the replayed oracle's schedule (the "
                      "drafter's own state differs when it is not called on every round, as the replay calls it)")
    mismatches = {name: int((~timings.loc[timings["arm"] == name, "matches_reference"]).sum()) for name in arms}
    print("Outputs different from AR: " + ", ".join(f"{n}: {m}" for n, m in mismatches.items()))

    goals, detail = {}, {}
    for drafter in laws:
        law = f"{drafter} law"
        if law not in names or f"{drafter} ddtree16 cost gate" not in names:
            continue
        fixed_arms = [n for n in names if n.startswith(drafter) and not {"law", "gate", "oracle"} & set(n.split())]
        gate = f"{drafter} ddtree16 cost gate"
        goals[f"{law} >= the cost gate in every category (point estimates)"] = all(
            cell(law, c)["speedup"] >= cell(gate, c)["speedup"] for c in categories)
        goals[f"{law} >= 1.00x AR in every category (point estimates)"] = all(
            cell(law, c)["speedup"] >= 1.0 for c in categories)
        goals[f"{law} >= 1.00x AR in every category (interval's lower end)"] = all(
            cell(law, c)["lo"] >= 1.0 for c in categories)
        # what can be measured (bench/speed.py aa-noise: AR against itself falls below 1.00 in about half the
        # categories, so the point-estimate reading fails by chance alone for an arm that equals AR): no category
        # measured as a loss, i.e. no interval wholly below 1
        goals[f"{law}: no category measured below AR (no interval wholly below 1.00)"] = all(
            not cell(law, c)["hi"] < 1.0 for c in categories)
        if not fixed_arms:  # the block drafter's fixed arms run only with --block-fixed
            continue
        best_fixed = {c: max(cell(n, c)["speedup"] for n in fixed_arms) for c in [*categories, ALL]}
        best_overall = max(fixed_arms, key=lambda n: cell(n, ALL)["speedup"])
        goals[f"{law} >= best fixed {drafter} policy in every category (point estimates)"] = all(
            cell(law, c)["speedup"] >= best_fixed[c] for c in categories)
        goals[f"{law} >= 1.05x the best fixed {drafter} policy overall ({best_overall})"] = (
            cell(law, ALL)["speedup"] >= 1.05 * cell(best_overall, ALL)["speedup"])
        detail[drafter] = {"best_fixed": {c: round(float(v), 4) for c, v in best_fixed.items()},
                           "best_fixed_overall_arm": best_overall}
    for drafter in oracle_drafters:
        if f"{drafter} law" in names:
            goals[f"{drafter} law within 10% of the {drafter} oracle's modelled rate (overall)"] = (
                cell(f"{drafter} law", ALL)["speedup"] >= 0.9 * oracle_of(ALL, drafter)[1])
            rate = law_vs_oracle[drafter]["modelled"]
            goals[f"{drafter} law within 10% of the {drafter} oracle, both priced by the same cost model (overall)"] = (
                rate is not None and rate >= 0.9 * oracle_of(ALL, drafter)[1])
            goals[f"{drafter} law within 10% of the {drafter} oracle's modelled rate, prefill priced in (overall)"] = (
                cell(f"{drafter} law", ALL)["speedup"] >= 0.9 * oracle_of(ALL, drafter)[2])
            if f"{drafter} oracle" in names:
                goals[f"{drafter} law within 10% of the {drafter} oracle timed, both measured (overall)"] = (
                    cell(f"{drafter} law", ALL)["speedup"] >= 0.9 * cell(f"{drafter} oracle", ALL)["speedup"])
    for name in ("hybrid ddtree16 cost gate", "hybrid law"):
        others = [n for n in ("ngram ddtree16 cost gate", "ngram law", "block ddtree16 cost gate", "block law")
                  if n in names]
        if name in names and others:
            goals[f"{name} >= max(n-gram, block arms run) in every category (point estimates)"] = all(
                cell(name, c)["speedup"] >= max(cell(n, c)["speedup"] for n in others) for c in categories)
        if name in names and "spec_bench" in sets:
            spec = by_set.loc[(by_set["arm"] == name) & (by_set["category"] == "spec_bench"), "speedup"]
            goals[f"{name} >= 1.70x AR overall on Spec-Bench (point estimate)"] = bool(spec.iloc[0] >= 1.7)
    if routes:
        total = sum(routes.values())
        print("hybrid law, decode rounds by the drafter it ran: " + ", ".join(
            f"{k} {routes[k] / total:.1%}" for k in ("ngram", "block", "none")) + f" ({total} rounds)")
    print("Goals: " + "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in goals.items()))
    summary = {
        "bench": "policy", "model": target.model_id, "traces": str(traces_dir),
        "block_checkpoint": block_path.name if args.block else None,
        "also_checkpoint": Path(args.also_checkpoint).name if args.block and args.also_checkpoint else None,
        "compute_dtype": args.compute_dtype, "also_compute_dtype": args.also_compute_dtype,
        "hybrid_skip_block_at": args.hybrid_skip,
        "prompts_per_category": args.limit, "seed": args.seed,
        "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(), "clock": "cpu",
        "load_average_end": os.getloadavg()[0], "question_ids": sorted(str(t.question_id) for t in tasks),
        "verify_cost": verify_cost.to_config(),
        "policies": {k: {"draft_cost": v["draft_cost"], "fitted_on": v["fitted_on"], "window": v["window"],
                         "context_match": (v.get("context_match") or {}).get("levels")}
                     for k, v in laws.items()},
        "speedup_vs_ar": {name: {row["category"]: json_row(row, ("speedup", "lo", "hi", "tokens_per_round", "bound"))
                                 for _, row in speed.loc[speed["arm"] == name].iterrows()} for name in names},
        "speedup_by_set": {name: {row["category"]: json_row(row, ("speedup", "lo", "hi", "tokens_per_round", "bound"))
                                  for _, row in by_set.loc[by_set["arm"] == name].iterrows()} for name in names},
        "oracle_by_set": {drafter: {d: round(float(oracle_of(d, drafter, "dataset")[1]), 4) for d in sets}
                          for drafter in oracle_drafters},
        "oracle": {drafter: {c: {"tokens_per_round": round(float(oracle_of(c, drafter)[0]), 4),
                                 "modelled_speedup": round(float(oracle_of(c, drafter)[1]), 4),
                                 "modelled_with_prefill": round(float(oracle_of(c, drafter)[2]), 4)}
                             for c in [*categories, ALL]} for drafter in oracle_drafters},
        "hybrid_law_routes": dict(routes), "law_vs_oracle": law_vs_oracle, "cost_model": cost_model,
        "head_to_head": head_to_head,
        "mismatches_vs_ar": mismatches,
        "goals": {k: bool(v) for k, v in goals.items()}, "detail": detail,
    }
    print(json.dumps(summary))
    return summary


# --- ceiling ---------------------------------------------------------------------------------------------------------

WORKLOADS = ("traces_open_timed", "traces_open_budgets", "traces_open_policy", "traces_open_policy2",
             "traces_open_context")
ALL_WORKLOADS = (*WORKLOADS, "traces")
TASKS = {"traces": "spec_bench"}  # a workload whose run.json names no task file: the prompts it decoded
# the run of a workload replayed over (default its AR run): Spec-Bench's reference AR run holds 5 requests, its n-gram
# chain run all 400, and every arm's output is the target's greedy one (recorded with its entropies at every position)
RUN_OF = {"traces": "ngram"}
BUDGETS = (0, 1, 2, 4, 8, 16)
ORACLE = "replay oracle (best rate of the round, in hindsight)"
PATH = "path oracle (the best whole walk, in hindsight)"
ROUTE = "route oracle (either drafter and its budget, per round in hindsight)"
ROUTE_PATH = "route path oracle (the best whole walk over both drafters)"
LAW = "law policy (shipped, calibrated)"
MERGED = "merged-tree replay oracle (the hybrid drafter calling both drafters every round)"
ROUTE3 = "route oracle with the merged tree (either drafter or both merged, per round in hindsight)"
HYBRID_LAW = "hybrid drafter's law policy (routes each round by the two laws; merged tree when it calls the block)"


# --- the action table of one set of requests ------------------------------------------------------------------

class Actions:
    """Per round start: what each action commits and costs. Actions: a plain step (the drafter not called), then,
    the drafter called, each budget of the table (budget 0 there: verify nothing after drafting)."""

    def __init__(self, table: pd.DataFrame, budgets: list[int], curve, draft_cost: float):
        starts = table.loc[table["budget"] == budgets[0]].sort_values(["key", "start_position"])
        self.starts = starts.reset_index(drop=True)
        wide = {c: table.pivot_table(index=["key", "start_position"], columns="budget", values=c, observed=True)
                .reindex(columns=budgets).loc[list(zip(starts["key"], starts["start_position"]))].to_numpy()
                for c in ("committed", "tree_nodes", "expected_accepted")}
        plain = wide["committed"][:, :1]
        self.committed = np.hstack([plain, plain, wide["committed"][:, 1:]]).astype(float)
        nodes = np.hstack([np.zeros_like(plain), np.zeros_like(plain), wide["tree_nodes"][:, 1:]])
        self.cost = np.vectorize(lambda n: float(curve(int(n) + 1)))(nodes)
        self.cost[:, 1:] += draft_cost
        self.names = ["plain step", "draft, verify none"] + [f"N={b}" for b in budgets[1:]]
        self.confidence = wide["expected_accepted"][:, -1]  # the largest tree's surrogate: known after drafting
        # the walk: row of each (key, start), the next start of each action
        self.row_of = {(k, int(s)): i for i, (k, s) in enumerate(zip(starts["key"], starts["start_position"]))}
        self.keys = list(dict.fromkeys(starts["key"]))

    def walk(self, choice: np.ndarray, keys=None) -> tuple[np.ndarray, np.ndarray]:
        """The rows visited and their actions when each start takes ``choice[row]``."""
        rows, acts = [], []
        for key in self.keys if keys is None else keys:
            s = 1
            while (key, s) in self.row_of:
                i = self.row_of[(key, s)]
                rows.append(i)
                acts.append(int(choice[i]))
                s += int(self.committed[i, choice[i]])
        return np.array(rows, dtype=int), np.array(acts, dtype=int)

    def rate(self, choice: np.ndarray, keys=None) -> float:
        rows, acts = self.walk(choice, keys)
        return float(self.committed[rows, acts].sum() / self.cost[rows, acts].sum())


def either_drafter(parts: list[Actions], names: list[str]) -> Actions:
    """The actions of several drafters at the same round starts (a hybrid that routes each round to one of them): the
    plain step, then each drafter's drafting actions in turn (each priced with its own drafter's cost); ``groups``:
    the columns of each drafter's."""
    keys = [part.starts[["key", "start_position"]].reset_index(drop=True) for part in parts]
    if any(not keys[0].equals(other) for other in keys[1:]):
        raise ValueError("the drafters' outcome tables do not hold the same round starts")
    both = copy.copy(parts[0])
    both.committed = np.hstack([parts[0].committed[:, :1]] + [part.committed[:, 1:] for part in parts])
    both.cost = np.hstack([parts[0].cost[:, :1]] + [part.cost[:, 1:] for part in parts])
    both.names = ["plain step"] + [f"{name} {n}" for part, name in zip(parts, names) for n in part.names[1:]]
    both.groups, start = [], 1
    for part in parts:
        both.groups.append(list(range(start, start + part.committed.shape[1] - 1)))
        start += part.committed.shape[1] - 1
    return both


def path_oracle(actions: Actions, iterations: int = 30) -> np.ndarray:
    """The best walk in hindsight: per start, the action of the walk with the highest rate over all requests together
    (sum committed / sum cost). Dinkelbach's iteration: for a rate lambda, the walk with the most committed - lambda *
    cost is found exactly by dynamic programming backwards over each request's starts (the value of a start is its
    best action's committed - lambda * cost plus the value of the start that action leads to); lambda becomes that
    walk's rate, until it no longer rises. A ceiling for any per-round choice among these actions."""
    lam, order = 1.0, np.argsort(-actions.starts["start_position"].to_numpy(), kind="stable")
    keys = actions.starts["key"].to_numpy()
    for _ in range(iterations):
        value, choice = {}, np.zeros(len(actions.starts), dtype=int)
        for i in order:  # later starts first: a start's successors are already valued
            s, key = int(actions.starts["start_position"].iat[i]), keys[i]
            gains = [actions.committed[i, a] - lam * actions.cost[i, a]
                     + value.get((key, s + int(actions.committed[i, a])), 0.0) for a in range(actions.cost.shape[1])]
            choice[i] = int(np.argmax(gains))
            value[(key, s)] = gains[choice[i]]
        new = actions.rate(choice)
        if new <= lam + 1e-12:
            break
        lam = new
    return choice


def ratio_oracle(actions: Actions) -> np.ndarray:
    """``oracle_rounds``' rule: the action with the best rate of the round itself (the plain step when none beats
    it; drafting then verifying nothing is never chosen, as the oracle never pays for a draft it does not use)."""
    rates = actions.committed / actions.cost
    rates[:, [i for i, name in enumerate(actions.names) if name.endswith("verify none")]] = -np.inf
    return np.argmax(rates > rates.max(axis=1, keepdims=True) - 1e-12, axis=1)


# --- table policies ----------------------------------------------------------------------------------------------

def quantile_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """Edges of ``bins`` quantile bins of ``values``, each moved to the midpoint between the distinct values around it,
    so that tied values (a copyability level, a confidence of 1) never straddle an edge; fewer bins where ties merge
    them."""
    distinct = np.unique(values[np.isfinite(values)])
    edges = []
    for q in np.quantile(distinct if len(distinct) < 2 else values, np.linspace(0, 1, bins + 1)[1:-1]):
        above = min(np.searchsorted(distinct, q, side="right"), len(distinct) - 1)  # at the top: the edge below it
        if above > 0:
            edges.append((distinct[above - 1] + distinct[above]) / 2)
    return np.unique(edges)


def cells(actions: Actions, edges: dict, use: tuple[str, ...], drafters: list[Actions] | None = None
          ) -> tuple[np.ndarray, list[np.ndarray]]:
    """(before-drafting cell, after-drafting cells) of every start, from the inputs in ``use``: ``entropy`` (window
    entropy bin), ``copy`` (copyability level), ``confidence`` (the drafter's surrogate bin, after drafting). One
    array of after-drafting cells per drafter (``drafters``, default ``actions`` alone), each from its own confidence
    (``edges["confidence"]``: one list of edges per drafter)."""
    pre = np.zeros(len(actions.starts), dtype=np.int64)
    if "entropy" in use:
        pre = pre * 100 + np.searchsorted(edges["entropy"], actions.starts["window_entropy"].to_numpy())
    if "copy" in use:
        pre = pre * 100 + actions.starts["context_match"].to_numpy(dtype=np.int64)
    posts = [pre * 100 + (np.searchsorted(e, d.confidence) if "confidence" in use else 0)
             for d, e in zip(drafters or [actions], edges["confidence"])]
    return pre, posts


def fit_table(actions: Actions, rows: np.ndarray, pre: np.ndarray, posts: list[np.ndarray], groups: list[list[int]], *,
              iterations: int = 12, passes: int = 3):
    """The best action per cell for the requests of the starts ``rows``: before drafting, per ``pre`` cell, a plain
    step or which drafter to call (``groups``: one list of action columns per drafter); after it, that drafter's
    budget per cell of its own array of ``posts`` (a post cell belongs to the pre cell ``post // 100``). Started from
    the renewal rule over those starts (each weighed alike, lambda the walk's rate; the best table of the iterations
    kept), then improved cell by cell on the rate of the walk itself (coordinate ascent: each cell takes the choice
    whose walk over those requests commits most per cost, the others held; at most ``passes`` sweeps), since a walk
    visits only some starts, and which ones depends on the table. Returns a function from (pre cells, one array of
    post cells per drafter) to actions (an unseen cell: a plain step)."""
    keys = list(dict.fromkeys(actions.starts["key"].to_numpy()[rows]))
    pre_of_post = [pd.Series(p // 100, index=p).groupby(level=0).first() for p in posts]

    def choose(pre_cells, post_cells, route, best):
        taken = pd.Series(pre_cells).map(route).to_numpy()  # the drafter of each start's pre cell (NaN: plain)
        out = np.zeros(len(pre_cells), dtype=int)
        for g in range(len(groups)):
            here = taken == g
            out[here] = pd.Series(post_cells[g][here]).map(best[g]).fillna(0).to_numpy(dtype=int)
        return out

    def rate(route, best):
        return actions.rate(choose(pre, posts, route, best), keys)

    lam, found = 1.0, (-np.inf, {}, [{} for _ in groups])
    for _ in range(iterations):
        value = actions.committed[rows] - lam * actions.cost[rows]
        best, options = [], [value[:, 0]]
        for g, columns in enumerate(groups):
            frame = pd.DataFrame(value[:, columns], columns=columns).assign(post=posts[g][rows])
            chosen = frame.groupby("post").sum().idxmax(axis=1).astype(int)
            options.append(value[np.arange(len(rows)), chosen.loc[posts[g][rows]].to_numpy()])
            best.append(chosen.to_dict())
        sums = pd.DataFrame(np.column_stack(options)).groupby(pre[rows]).sum().to_numpy()
        cells_seen = np.unique(pre[rows])  # groupby sorts its keys
        # the drafter whose best budgets gain most in the cell, where that is strictly above a plain step
        pick = np.where((sums[:, 1:] > sums[:, :1]).any(axis=1), np.argmax(sums[:, 1:], axis=1) + 1, 0)
        route = {cell: int(k) - 1 for cell, k in zip(cells_seen, pick) if k > 0}
        new = rate(route, best)
        if new > found[0]:
            found = (new, route, best)
        if abs(new - lam) < 1e-9:
            break
        lam = new
    current, route, best = found
    for _ in range(passes):
        before = current
        for cell in sorted(set(pre[rows])):
            for option in [None, *range(len(groups))]:
                if option == route.get(cell):
                    continue
                trial = {k: v for k, v in route.items() if k != cell}
                if option is not None:
                    trial[cell] = option
                if (r := rate(trial, best)) > current + 1e-12:
                    current, route = r, trial
        for g, columns in enumerate(groups):
            for cell in sorted(set(posts[g][rows])):
                if route.get(pre_of_post[g][cell]) != g:
                    continue
                for action in columns:
                    if action != best[g].get(cell):
                        trial = [*best[:g], {**best[g], cell: action}, *best[g + 1:]]
                        if (r := rate(route, trial)) > current + 1e-12:
                            current, best = r, trial
        if current <= before + 1e-12:
            break
    return lambda pre_cells, post_cells: choose(pre_cells, post_cells, route, best)


def table_policy(actions: Actions, use: tuple[str, ...], *, bins: int, folds: int,
                 drafters: list[Actions] | None = None) -> dict[str, np.ndarray]:
    """Per start, the in-sample and the cross-fitted table policy's action. ``drafters``: for a route table over
    ``either_drafter``'s actions, the drafters' own actions (each drafter's budget is chosen per cell of its own
    confidence; before drafting, a cell chooses a plain step or one drafter)."""
    starts = actions.starts
    drafters = [actions] if drafters is None else drafters
    groups = getattr(actions, "groups", None) or [list(range(1, actions.committed.shape[1]))]

    def edges_of(rows):
        return {"entropy": quantile_edges(starts["window_entropy"].to_numpy()[rows], bins),
                "confidence": [quantile_edges(d.confidence[rows], bins) for d in drafters]}

    everything = np.arange(len(starts))
    pre, posts = cells(actions, edges_of(everything), use, drafters)
    in_sample = fit_table(actions, everything, pre, posts, groups)(pre, posts)
    fold_of = {key: i % folds for i, key in enumerate(actions.keys)}
    fold = starts["key"].map(fold_of).to_numpy()
    crossed = np.zeros(len(starts), dtype=int)
    for f in range(folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        pre, posts = cells(actions, edges_of(train), use, drafters)
        crossed[test] = fit_table(actions, train, pre, posts, groups)(pre[test], [p[test] for p in posts])
    return {"in sample": in_sample, "cross-fitted": crossed}


def replay_code_sha256() -> str:
    """SHA-256 of the code that replays and decides (``entropy_law/decoding/*.py``, ``entropy_law/jobs/reference.py``):
    kept in the cache's manifest, so that replays made by other code (a policy's rule, the curve's measurement) are
    refused, not reused."""
    root = Path(__file__).resolve().parents[1] / "entropy_law"
    digest = hashlib.sha256()
    for path in sorted((root / "decoding").glob("*.py")) + [root / "jobs" / "reference.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def open_cache(cache: Path, manifest: dict) -> None:
    """Use ``cache`` for the replays of what ``manifest`` names (the policy file's hash, the arm, the budgets, a
    given verify-cost curve and the replaying code's hash), writing the manifest into an empty or new folder; a
    folder that holds another configuration's replays is refused, never mixed in."""
    path = cache / "manifest.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored != manifest:
            differ = sorted(k for k in set(stored) | set(manifest) if stored.get(k) != manifest.get(k))
            raise SystemExit(f"--cache {cache} holds replays of another configuration ({', '.join(differ)} differ): "
                             "give another --cache folder, or empty this one")
        return
    if cache.is_dir() and any(cache.iterdir()):
        raise SystemExit(f"--cache {cache} is not empty and has no {path.name}: give an empty or new folder")
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1))


# --- the bench -----------------------------------------------------------------------------------------------------

def ddtree16_arm(data: Path, params: dict) -> Path:
    """The DDTree16 arm of the policy's drafter among the reference traces (``data/traces``)."""
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    for d in sorted((data / "traces").iterdir()):
        if (d / RUN_FILE).is_file():
            meta = read_run_json(d / RUN_FILE)
            if meta.get("drafter_id") == params.get("drafter_id") and meta.get("tree_budget") == 16:
                return d
    raise SystemExit(f"no DDTree16 arm of drafter {params.get('drafter_id')!r} under {data / 'traces'}: give --arm")


def sampled_requests(ar: Path, per_category: int | None, seed: int) -> list[str] | None:
    """A seeded sample of ``per_category`` requests of each category of a workload's AR run (the whole run, not its
    first requests); ``None``: all of them."""
    from entropy_law.traces.reader import load_traces

    if per_category is None:
        return None
    requests = load_traces(ar).requests[["request_id", "category"]].drop_duplicates()
    rng = np.random.default_rng(seed)
    chosen = []
    for _, part in requests.sort_values("request_id").groupby("category", observed=True):
        ids = part["request_id"].astype(str).to_numpy()
        chosen += list(rng.choice(ids, size=min(per_category, len(ids)), replace=False))
    return sorted(chosen)


def ceiling_arguments(parser) -> None:
    """The arguments of ``ceiling``."""
    parser.add_argument("--policy", required=True, metavar="FITTED.json",
                   help="the drafter's law policy (entropy-law policy ... --context-match): its inputs, draft cost "
                        "and, replayed, its decisions")
    parser.add_argument("--arm", default=None, metavar="RUN",
                   help="the drafting run whose drafter and tree are replayed (default: the policy drafter's "
                        "DDTree16 arm of data/traces)")
    parser.add_argument("--route", default=None, metavar="OTHER.json",
                   help="a second drafter's law policy (its DDTree16 arm of data/traces): both drafters' outcomes at "
                        "the same round starts, each drafter's oracle and replayed law policy, and the route oracle "
                        "(each round the better drafter and budget in hindsight: the ceiling of a hybrid that routes)")
    parser.add_argument("--merged", action="store_true",
                   help="with --route over the n-gram and block drafters: also the hybrid drafter's merged tree (both "
                        "drafters called every round, their candidates in one tree) as a third drafter of the route "
                        "oracle and table")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=ALL_WORKLOADS, metavar="NAME",
                   help=f"recordings under data/ whose AR runs are replayed over (default: {' '.join(WORKLOADS)}; "
                        "'traces': Spec-Bench's 400 reference requests (the greedy outputs of data/traces/ngram), on "
                        "which the shipped law policies were fitted)")
    parser.add_argument("--sample", type=int, default=None, metavar="K",
                   help="K requests of each category of each workload, a seeded sample (default: every request)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--verify-cost", default=None, metavar="CURVE.json",
                   help="a verify-cost curve (VerifyCost.to_config) to decide and price by (default: measured now)")
    parser.add_argument("--bins", type=int, default=6, help="quantile bins of the window entropy and the confidence")
    parser.add_argument("--folds", type=int, default=2, help="folds of requests for the cross-fitted tables")
    parser.add_argument("--cache", default=None, metavar="DIR",
                   help="keep each workload's outcome table and replayed rounds here, with the verify-cost curve "
                        "measured for them (all reused when present; a folder of another policy, arm, budgets, "
                        "sample, --verify-cost or decoding code is refused)")


def run_ceiling(args, parser) -> dict:
    """How close to the replay oracle can a per-round policy get from what it knows before each round? Modelled by replay.

    The policy goal asks a law policy to reach within 10% of the replay oracle, which picks each round's budget knowing the
    round's outcome. This bench asks how much of that distance any policy that reads the goal's inputs could close,
    so that a shortfall can be told apart from a ceiling.

    For every output position of each request of the open-ended AR recordings (``data/<workload>/ar``) it replays
    what a round of each budget N in {0, 1, 2, 4, 8, 16} of the drafter's DDTree would do there
    (``jobs.reference.workload_round_outcomes``: committed tokens, nodes verified, and the drafter's surrogate
    expected accepted drafts of the tree: its confidence), and what the policy reads before drafting (the window
    entropy, the context's copyability, the law's best chain rate). Every round is priced by one verify-cost curve
    ``c(nodes + 1)`` (+ the policy's draft cost when the drafter runs), the curve the policies decide by: the
    modelled rate, as bench/policy.py policy's oracle line. Configurations, each walked over the table (the next round
    starts where the chosen one ends) or replayed:

    - fixed budgets (every round drafts, no gate);
    - the **replay oracle** (``oracle_rounds``' rule: the best rate of the round itself in hindsight; the goal's
      ceiling) and the **path oracle** (the walk with the highest rate over whole requests, in hindsight, by dynamic
      programming: the true ceiling of any per-round choice among these actions, at least the replay oracle);
    - the shipped **law policy** (``--policy``; its in-request calibration included) and the **cost gate**, replayed
      by the decoder's own round (``workload_round_records``) and priced by the same curve;
    - **table policies**: the best decision per cell of the inputs, chosen on the data with the renewal rule. Before
      drafting, a cell of (window entropy bin, copyability level) decides to draft or take a plain step; after
      drafting, a cell of (that, confidence bin) picks the budget (0: verify nothing). *In sample* (fitted on the
      requests it is scored on: an optimistic bound for a policy that reads those inputs at that resolution) and
      *cross-fitted* (each request scored by a table fitted on the other folds' requests: what such a policy could
      reach honestly from this much data).

    If even the in-sample table stays more than 10% below the oracle, no policy deciding from those inputs at that
    resolution meets the goal on these prompts: the rest is what the inputs do not say about a round.

    With ``--route OTHER.json`` (the other drafter's law policy; its DDTree16 arm of ``data/traces``) the bench also asks
    what the hybrid goal can reach when each round goes to one drafter (the hybrid drafter's law policy routes so, its
    merged trees are not modelled here): the second drafter's outcomes at the same round starts, its replay oracle and
    replayed law policy, the **route oracle** (each round, in hindsight, the drafter and budget with the best rate of the
    round, each drafter's own cost counted) and its path oracle, and a **route table** (before drafting a cell of window
    entropy and copyability chooses a plain step or one drafter; after drafting that drafter's budget per cell of its own
    confidence; in sample and cross-fitted). ``--workloads traces`` adds Spec-Bench (the reference AR run, where the hybrid
    goal's 1.7x is read: the greedy outputs of its 400 reference requests, in ``data/traces/ngram``; the shipped law
    policies were fitted on them, so their rows there are in sample) and ``--sample K
    --seed S`` replays a seeded sample of K requests per category of each workload; the table then has an overall column
    per workload.

        OMP_NUM_THREADS=1 python bench/policy.py ceiling --policy BLOCK-POLICY.json --cache /tmp/ceiling \\
        OMP_NUM_THREADS=1 python bench/policy.py ceiling --policy BLOCK-POLICY.json --route NGRAM-POLICY.json \\
            --workloads traces traces_open_context traces_open_timed --sample 12 --seed 11 --cache /tmp/route

    Prints a table (modelled speedup over AR per category and overall, tokens per round, the distance to the oracle)
    and ends with ONE JSON line.
    """
    if args.bins < 1 or args.folds < 2:
        parser.error("--bins must be >= 1 and --folds >= 2")
    if args.sample is not None and args.sample < 1:
        parser.error("--sample must be >= 1 requests a category")
    if args.merged and not args.route:
        parser.error("--merged goes with --route (the n-gram and the block drafter's law policies)")

    import torch

    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import VerifyCost, measure_verify_cost
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import with_gate, workload_round_outcomes, workload_round_records
    from entropy_law.payoff.policy import hybrid_policy, load_policy, policy_arm_meta
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.process_time()
    data = Path(__file__).resolve().parents[1] / "data"
    params = load_policy(args.policy)
    arm_dir = Path(args.arm) if args.arm else ddtree16_arm(data, params)
    arm_meta = read_run_json(arm_dir / RUN_FILE)
    other = load_policy(args.route) if args.route else None
    if other is not None and other.get("drafter_id") == params.get("drafter_id"):
        parser.error("--route takes the OTHER drafter's law policy (it is the same drafter as --policy's)")
    other_dir = ddtree16_arm(data, other) if other is not None else None
    other_meta = read_run_json(other_dir / RUN_FILE) if other is not None else None
    target = load_target("smollm2-135m")
    cache = Path(args.cache) if args.cache else None
    if cache is not None:
        open_cache(cache, {"policy_sha256": hashlib.sha256(Path(args.policy).read_bytes()).hexdigest(),
                           "arm": str(arm_dir.resolve()), "budgets": list(BUDGETS),
                           "verify_cost": json.loads(Path(args.verify_cost).read_text()) if args.verify_cost else None,
                           "code_sha256": replay_code_sha256(),
                           **({"route_policy_sha256": hashlib.sha256(Path(args.route).read_bytes()).hexdigest(),
                               "route_arm": str(other_dir.resolve())} if other is not None else {}),
                           **({"sample": args.sample, "seed": args.seed} if args.sample is not None else {}),
                           **({"merged": True} if args.merged else {})})
    kept = cache / "verify_cost.json" if cache else None
    if args.verify_cost or (kept is not None and kept.is_file()):
        curve = VerifyCost.from_config(json.loads(Path(args.verify_cost or kept).read_text()))
    else:
        curve = measure_verify_cost(TargetAdapter(target.model))
        if kept is not None:  # the cached tables' replayed policies decided by it: keep it with them
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(curve.to_config()))
    draft_cost = float(params["draft_cost"])
    print(f"{arm_dir}: {arm_meta.get('drafter_id')} {arm_meta.get('tree_policy')}{arm_meta.get('tree_budget')}; "
          f"decided and priced by c(n): {curve.describe()}; draft cost {draft_cost:.3f} forwards", flush=True)
    replayed = {LAW: (policy_arm_meta(arm_meta, params, measured=curve.to_config())[0], "law", draft_cost),
                "cost gate (DDTree16)": (with_gate(arm_meta, {"gate": "cost", "verify_cost": curve.to_config()}),
                                         "cost", draft_cost)}
    drafters = [("", arm_meta, params)]
    if other is not None:
        name = other_meta.get("drafter_id")
        print(f"route: {other_dir}: {name} {other_meta.get('tree_policy')}{other_meta.get('tree_budget')}; draft cost "
              f"{float(other['draft_cost']):.3f} forwards", flush=True)
        drafters.append(("route.", other_meta, other))
        replayed[f"{name} {LAW}"] = (policy_arm_meta(other_meta, other, measured=curve.to_config())[0], "route.law",
                                     float(other["draft_cost"]))
        by_id = {arm_meta.get("drafter_id"): (arm_meta, params), name: (other_meta, other)}
        if args.merged and "ngram" not in by_id:
            parser.error("--merged needs the n-gram drafter's law policy as --policy or --route")
        if "ngram" in by_id:  # the hybrid drafter's law policy: the two laws, each round the drafter of the higher rate
            (ngram_meta, ngram_law), (block_meta, block_law) = by_id.pop("ngram"), by_id.popitem()[1]
            hybrid_meta = {**block_meta, "drafter_id": "hybrid", "gate": "cost",
                           "drafter_config": {"ngram": ngram_meta.get("drafter_config") or {},
                                              "block": block_meta.get("drafter_config") or {}}}
            if args.merged:  # both drafters every round; the block law: only its inputs are read
                drafters.append(("merged.", {**hybrid_meta, "drafter_config": {
                    **hybrid_meta["drafter_config"], "skip_block_at": float("inf")}}, block_law))
                merged_cost = float(ngram_law["draft_cost"]) + float(block_law["draft_cost"])
            replayed[HYBRID_LAW] = (
                {**hybrid_meta, "verify_cost": curve.to_config(), "policy": hybrid_policy(ngram_law, block_law)},
                "hybrid.law", {"ngram": float(ngram_law["draft_cost"]), "block": float(block_law["draft_cost"])})
    tables, rounds = {tag: [] for tag, _, _ in drafters}, []
    for workload in args.workloads:
        ar = data / workload / RUN_OF.get(workload, "ar")
        requests = sampled_requests(ar, args.sample, args.seed)
        for tag, meta_of, params_of in drafters:
            stored = cache / f"{workload}.{tag}outcomes.parquet" if cache else None
            if stored is not None and stored.is_file():
                table = pd.read_parquet(stored)
            else:
                table = workload_round_outcomes(ar, meta_of, target, budgets=BUDGETS, policy=params_of,
                                                verify_cost=curve, requests=requests, tasks=TASKS.get(workload))
                if stored is not None:
                    stored.parent.mkdir(parents=True, exist_ok=True)
                    table.to_parquet(stored)
            tables[tag].append(table.assign(key=workload + ":" + table["request_id"].astype(str), workload=workload))
        for name, (meta, stem, _) in replayed.items():
            stored = cache / f"{workload}.{stem}.parquet" if cache else None
            if stored is not None and stored.is_file():
                part = pd.read_parquet(stored)
            else:
                part = workload_round_records(ar, meta, target, requests=requests, tasks=TASKS.get(workload))
                if stored is not None:
                    part.to_parquet(stored)
            rounds.append(part.assign(config=name, key=workload + ":" + part["request_id"].astype(str)))
        print(f"replayed over {ar} ({table['request_id'].nunique()} prompts)", flush=True)
    actions = Actions(pd.concat(tables[""], ignore_index=True), list(BUDGETS), curve, draft_cost)
    category = actions.starts.groupby("key")["category"].first()

    choices = {f"fixed N={b}": (actions, np.full(len(actions.starts), 2 + i, dtype=int))
               for i, b in enumerate(BUDGETS[1:])}
    choices[ORACLE] = (actions, ratio_oracle(actions))
    choices[PATH] = (actions, path_oracle(actions))
    inputs = {"entropy": ("entropy",), "entropy + copyability": ("entropy", "copy"),
              "confidence (after drafting)": ("confidence",),
              "entropy + copyability + confidence": ("entropy", "copy", "confidence")}
    for label, use in inputs.items():
        for how, choice in table_policy(actions, use, bins=args.bins, folds=args.folds).items():
            choices[f"table: {label}, {how}"] = (actions, choice)
    route = None
    if other is not None:
        name = other_meta.get("drafter_id")
        second = Actions(pd.concat(tables["route."], ignore_index=True), list(BUDGETS), curve,
                         float(other["draft_cost"]))
        choices[f"{name} replay oracle"] = (second, ratio_oracle(second))
        route = either_drafter([actions, second], [arm_meta.get("drafter_id"), name])
        choices[ROUTE] = (route, ratio_oracle(route))
        choices[ROUTE_PATH] = (route, path_oracle(route))
        use = inputs["entropy + copyability + confidence"]
        for how, choice in table_policy(route, use, bins=args.bins, folds=args.folds,
                                        drafters=[actions, second]).items():
            choices[f"route table: entropy + copyability + each drafter's confidence, {how}"] = (route, choice)
        if args.merged:
            merged = Actions(pd.concat(tables["merged."], ignore_index=True), list(BUDGETS), curve, merged_cost)
            choices[MERGED] = (merged, ratio_oracle(merged))
            three = either_drafter([actions, second, merged], [arm_meta.get("drafter_id"), name, "merged"])
            choices[ROUTE3] = (three, ratio_oracle(three))
            for how, choice in table_policy(three, use, bins=args.bins, folds=args.folds,
                                            drafters=[actions, second, merged]).items():
                choices[f"route table with the merged tree, {how}"] = (three, choice)

    rows, shares = [], {}
    for name, (acting, choice) in choices.items():
        visited, acts = acting.walk(choice)
        frame = pd.DataFrame({"key": acting.starts["key"].to_numpy()[visited],
                              "committed": acting.committed[visited, acts], "cost": acting.cost[visited, acts],
                              "drafted": acts > 0})
        rows.append((name, frame))
        if getattr(acting, "groups", None) is not None:  # the share of rounds each drafter drafted in
            shares[name] = [float(np.isin(acts, group).mean()) for group in acting.groups]
    costs = {name: cost for name, (_, _, cost) in replayed.items()}
    for name, part in pd.concat(rounds).groupby("config", sort=False):
        part = part.loc[part["round_index"] > 0]
        called = part["policy_drafted"].fillna(True).astype(bool) if LAW in name or name == HYBRID_LAW else \
            pd.Series(True, index=part.index)
        if name == HYBRID_LAW:  # prompt lookup runs every round (the policy looks at it first); the block forward
            # where the round was routed to it
            spent = costs[name]["ngram"] + costs[name]["block"] * (called & (part["policy_route"] == "block"))
        else:
            spent = costs[name] * called
        cost = np.array([curve(int(n) + 1) for n in part["tree_nodes"]]) + spent.to_numpy(dtype=float)
        rows.append((name, pd.DataFrame({"key": part["key"].to_numpy(), "committed": part["committed"].to_numpy(),
                                         "cost": cost, "drafted": called.to_numpy()})))
    summary = []
    for name, frame in rows:
        frame = frame.assign(category=frame["key"].map(category))
        by = frame.groupby("category")[["committed", "cost"]].sum()
        sets = frame.groupby(frame["key"].str.split(":").str[0])[["committed", "cost"]].sum()
        summary.append({"config": name, **(by["committed"] / by["cost"]).round(3).to_dict(),
                        **({f"all {w}": round(float(sets.loc[w, "committed"] / sets.loc[w, "cost"]), 3)
                            for w in args.workloads} if len(args.workloads) > 1 else {}),
                        "all": round(float(frame["committed"].sum() / frame["cost"].sum()), 4),
                        "tokens_per_round": round(float(frame["committed"].mean()), 2),
                        "drafter_called": round(float(frame["drafted"].mean()), 2)})
    out = pd.DataFrame(summary).set_index("config")
    oracle = float(out.loc[ORACLE, "all"])
    out["below_oracle"] = (1 - out["all"] / oracle).round(3)
    with pd.option_context("display.width", 240, "display.max_columns", 30):
        print(f"\nmodelled speedup over AR ({len(actions.keys)} prompt runs; every round priced by the curve above)")
        print(out.to_string())
    if "traces" in args.workloads:
        print("NOTE: the law policies' rows on Spec-Bench ('traces') are in sample when the policies were fitted on "
              "data/traces (as entropy-law policy data/traces fits them): it holds these requests; the oracles and "
              "fixed budgets fit nothing")
    law = float(out.loc[LAW, "all"])
    best_in = out.loc[[c for c in out.index if c.startswith("table:") and c.endswith("in sample")], "all"]
    best_cross = out.loc[[c for c in out.index if c.startswith("table:") and c.endswith("cross-fitted")], "all"]
    print(f"\nthe replay oracle {oracle:.3f}x (the path oracle {out.loc[PATH, 'all']:.3f}x); the shipped law "
          "policy "
          f"{law:.3f}x ({1 - law / oracle:.1%} below the oracle); the best table policy in sample: {best_in.idxmax()} "
          f"{best_in.max():.3f}x ({1 - best_in.max() / oracle:.1%} below), cross-fitted: {best_cross.idxmax()} "
          f"{best_cross.max():.3f}x ({1 - best_cross.max() / oracle:.1%} below)")
    routed = {}
    if route is not None:
        names = (arm_meta.get("drafter_id"), other_meta.get("drafter_id"))
        second_oracle = float(out.loc[f"{names[1]} replay oracle", "all"])
        routed = {"route_oracle": float(out.loc[ROUTE, "all"]), "route_path_oracle": float(out.loc[ROUTE_PATH, "all"]),
                  "second_oracle": second_oracle, "second_drafter": names[1],
                  "second_law_policy": float(out.loc[f"{names[1]} {LAW}", "all"]),
                  **({"hybrid_law_policy": float(out.loc[HYBRID_LAW, "all"])} if HYBRID_LAW in out.index else {}),
                  "route_oracle_shares": dict(zip(names, shares[ROUTE])),
                  "route_table": {how: float(out.loc[c, "all"]) for c in out.index if c.startswith("route table:")
                                  for how in ("in sample", "cross-fitted") if c.endswith(how)},
                  "per_workload": {c: {k: float(v) for k, v in out[c].items()} for c in out.columns
                                   if c.startswith("all ")}}
        share = shares[ROUTE]
        print(f"the route oracle {routed['route_oracle']:.3f}x (path {routed['route_path_oracle']:.3f}x): "
              f"{routed['route_oracle'] / max(oracle, second_oracle) - 1:+.1%} over the better drafter's own oracle "
              f"({names[0]} {oracle:.3f}x, {names[1]} {second_oracle:.3f}x); it drafts with {names[0]} in "
              f"{share[0]:.0%} of its rounds, with {names[1]} in {share[1]:.0%}, and takes a plain step "
              f"in {1 - sum(share):.0%}. The better law policy reaches "
              f"{max(law, routed['second_law_policy']) / routed['route_oracle']:.1%} of the route oracle, a route "
              f"table on the inputs {routed['route_table']['cross-fitted'] / routed['route_oracle']:.1%} cross-fitted, "
              f"{routed['route_table']['in sample'] / routed['route_oracle']:.1%} in sample"
              + (f", the hybrid drafter's law policy {routed['hybrid_law_policy'] / routed['route_oracle']:.1%}"
                 if "hybrid_law_policy" in routed else ""))
    if args.merged:
        three = {c: float(out.loc[c, "all"]) for c in out.index
                 if c in (MERGED, ROUTE3) or c.startswith("route table with")}
        routed["merged"] = {**three, "route3_oracle_shares": dict(zip([*names, "merged"], shares[ROUTE3]))}
        print(f"with the merged tree as a third drafter: its own oracle {three[MERGED]:.3f}x, the route oracle "
              f"{three[ROUTE3]:.3f}x, a route table "
              + ", ".join(f"{v:.3f}x {k.rsplit(', ', 1)[1]}" for k, v in three.items() if k.startswith("route table")))
    result = {"bench": "policy_ceiling", "policy": str(args.policy), "arm": str(arm_dir), "workloads": args.workloads,
              "route_policy": args.route, "sample": args.sample, "seed": args.seed,
              "prompt_runs": len(actions.keys), "verify_cost_curve": curve.to_config(), "draft_cost": draft_cost,
              "bins": args.bins, "folds": args.folds, "cpu_s": round(time.process_time() - t0, 1),
              "overall": {c: float(v) for c, v in out["all"].items()}, "oracle": oracle,
              "path_oracle": float(out.loc[PATH, "all"]), "law_policy_below_oracle": 1 - law / oracle,
              "best_table_in_sample": best_in.idxmax(), "best_table_in_sample_below_oracle": 1 - best_in.max() / oracle,
              "best_table_cross_fitted": best_cross.idxmax(),
              "best_table_cross_fitted_below_oracle": 1 - best_cross.max() / oracle, **routed}
    print(json.dumps(result))
    return result


# --- replay ----------------------------------------------------------------------------------------------------------

WEIGHTS = (0.0, 0.5, 1.0)
REPLAY_ORACLE = "replay oracle (DDTree, best N per round in hindsight)"
BUDGETS = (0, 1, 2, 4, 8, 16)
COST_GATE = "ddtree16 (cost gate)"


def replay_arguments(parser) -> None:
    """The arguments of ``replay``."""
    parser.add_argument("--policy", required=True, nargs="+", metavar="FITTED.json",
                   help="the drafter's law policy parameters; several files: each at the three weights, labelled by "
                        "its file name, all under the same measured verify-cost curve")
    parser.add_argument("--from", dest="arm_traces", default="data/traces_timed", help="the timed arms whose costs price")
    parser.add_argument("--drafter", choices=("ngram", "block"), default="ngram",
                   help="ngram (default): chain, DDTree16, DDTree4 and six law policies; block: DDTree16, DDTree4 and "
                        "the law policy at weights 0, 0.5, 1 (its replay needs a teacher-forced pass per request)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS, metavar="NAME",
                   help=f"recordings under data/ whose AR runs are replayed over (default: {' '.join(WORKLOADS)})")
    parser.add_argument("--curve", choices=CURVES, default="priced",
                   help="the verify-cost curve the law policies and the oracle decide by: 'priced' (default), the verify "
                        "line of the cost model that prices every configuration (decisions judged by the cost they "
                        "were made with); 'measured', this machine's curve measured now (what an online run here "
                        "would decide by, priced by the recording machine's timings)")


def run_replay(args, parser) -> dict:
    """Which drafting policy pays most on prompts it was never fitted on? Modelled by replay, not timed.

    Every configuration's rounds are replayed over the AR runs of the timed open-ended recordings (``data/traces_open_*``:
    seeds 7, 11, 13 and 17, 3 prompts per category each, and 19, 4 per category; the same prompt may appear in several) and priced by the cost
    model of ``data/traces_timed``'s n-gram arm of that tree (``entropy-law predict --replay-rounds`` / ``--budgets`` /
    ``--policy``; on the timed open-ended checks these predictions landed within 2.2-3.1% of the measured speedups on
    average per category, ``bench/results/predict-open-ended.txt``). Configurations:

    - the fixed arms: n-gram chain, DDTree16 and DDTree4 under their ratio gate;
    - the cost gate (DDTree16: every round drafts, the best-value prefix by the drafter's own probabilities under the
      same verify-cost curve the policies decide by), as ``bench/policy.py policy`` times it; not a fixed arm;
    - the law policy (``--policy``: fitted on ``data/traces``, Spec-Bench), on DDTree16, with ``confidence_weight`` 0
      (the law alone), 0.5 (the default blend) and 1 (the drafter's own confidence alone: no law), each with the
      in-request calibration on (the default) and off;
    - the replay oracle (``jobs.reference.workload_oracle_rounds``): the drafter's DDTree with, each round in hindsight,
      the budget N in {0, 1, 2, 4, 8, 16} that commits the most tokens per unit of the verify-cost curve (+ the policy's
      draft cost when it drafts); a ceiling for any per-round policy, not a decoder, priced as the others are. The
      goal's "distance to the oracle" is the best law policy's shortfall against it.

    The verify-cost curve the policies and the oracle decide by (``--curve``): by default the verify line of the cost
    model that prices every configuration (``cost.verify_curve`` of the tree arm of ``--from``), so that each decision
    is judged by the cost it was made with. ``--curve measured`` decides by this machine's curve measured now, as an
    online run here would; it is priced by the recording machine's timings all the same, so where the two machines
    differ the comparison mixes two cost models (docs/results.md shows how far the verdict moves with the curve alone). The priced line is fitted on the
    timed rounds of the tree arm (mostly large trees: the run printed their range), so the small trees a policy verifies
    are priced by extrapolation; the timed bench (``bench/policy.py policy``) is the measurement.

    ``--drafter block``: the block drafter's DDTree16 and DDTree4 and its law policy at the three weights (its replay needs
    one teacher-forced pass per request: give fewer ``--workloads``). Prints per configuration the modelled speedup over
    AR per category (pooled over the recordings) and overall, and ends with ONE JSON line.

        OMP_NUM_THREADS=1 python bench/predict.py open-ended --fit-policy ngram --out /tmp/ngram-policy.json
        OMP_NUM_THREADS=1 python bench/policy.py replay --policy /tmp/ngram-policy.json
        OMP_NUM_THREADS=1 python bench/policy.py replay --drafter block --policy /tmp/block-policy.json         --workloads traces_open_policy2
    """

    import numpy as np
    import pandas as pd
    import torch

    from entropy_law.decoding.adapter import TargetAdapter
    from entropy_law.decoding.gate import VerifyCost, measure_verify_cost
    from entropy_law.payoff.cost import verify_curve
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import with_gate, workload_oracle_rounds, workload_rounds
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.policy import load_policy, policy_arm_meta
    from entropy_law.traces.layout import RUN_FILE, read_run_json
    from entropy_law.traces.reader import load_traces

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.process_time()
    data = Path(__file__).resolve().parents[1] / "data"
    source = TraceAnalysis(load_traces(args.arm_traces), n_boot=0)
    path_of = dict(zip(source.runs["arm"], source.runs["path"]))
    meta = {arm: read_run_json(Path(path_of[arm]) / RUN_FILE) for arm in source.arms}
    tree_arm = next(a for a in source.arms if a.startswith(args.drafter) and a.endswith("ddtree16"))
    policies = {Path(path).stem: load_policy(path) for path in args.policy}
    for name, policy in policies.items():
        if policy.get("drafter_id") != meta[tree_arm].get("drafter_id"):
            raise SystemExit(f"--policy {name} is for drafter {policy.get('drafter_id')!r}, --drafter {args.drafter} "
                             f"is {meta[tree_arm].get('drafter_id')!r}")
    if len(policies) != len(args.policy):
        raise SystemExit("--policy: give files of distinct names (they label the configurations)")
    target = load_target("smollm2-135m")
    measured = measure_verify_cost(TargetAdapter(target.model))
    priced = {**verify_curve(source.cost_model(tree_arm)), "clock": measured.clock}
    curve = priced if args.curve == "priced" else measured.to_config()
    print(f"this machine's measured verify cost c(n): {measured.describe()}\n"
          f"{tree_arm}'s priced verify line c(n):      {VerifyCost.from_config(priced).describe()}\n"
          f"the policies and the oracle decide by the {args.curve} curve", flush=True)
    sizes = _timed_tree_sizes(source, tree_arm)
    print(f"the priced line is fitted on {tree_arm}'s timed rounds, which verified {sizes}: smaller trees are priced "
          "by extrapolation", flush=True)
    tree = meta[tree_arm]
    configs = {}
    if args.drafter == "ngram":
        configs["chain (ratio gate)"] = (meta["ngram chain"], "ngram chain")
    configs["ddtree16 (ratio gate)"] = (tree, tree_arm)
    configs["ddtree4 (ratio gate)"] = ({**tree, "tree_budget": 4}, tree_arm)
    # the cost gate as bench/policy.py policy times it: DDTree16, every round drafted, the best-value prefix of the tree by
    # the drafter's own probabilities under the same curve the policies decide by
    configs[COST_GATE] = (with_gate(tree, {"gate": "cost", "verify_cost": curve}), tree_arm)
    for label, policy in policies.items():
        for weight in WEIGHTS:
            for calibrated in (True, False) if args.drafter == "ngram" else (True,):
                params = {**policy, "confidence_weight": weight,
                          **({} if calibrated else {"calibration_prior": None})}
                name = ("law policy" + (f" {label}" if len(policies) > 1 else "") + f", weight {weight:g}"
                        + ("" if calibrated else ", no calibration"))
                configs[name] = (policy_arm_meta(tree, params, measured=curve, arm=tree_arm)[0], tree_arm)
    frames = []
    for workload in args.workloads:
        ar = data / workload / "ar"
        runs = load_traces(ar)
        for name, (arm_meta, priced_by) in configs.items():
            rounds = workload_rounds(ar, arm_meta, target)
            frames.append(rounds.assign(config=name, priced_by=priced_by, workload=workload))
        oracle = workload_oracle_rounds(ar, tree, target, verify_cost=VerifyCost.from_config(curve),
                                        draft_cost=float(next(iter(policies.values()))["draft_cost"]),
                                        budgets=BUDGETS)
        frames.append(oracle.assign(config=REPLAY_ORACLE, priced_by=tree_arm, workload=workload))
        print(f"replayed over {ar} ({runs.requests['request_id'].nunique()} prompts)", flush=True)
    table = pd.concat(frames, ignore_index=True)
    # pooled over the recordings: each (config, category) priced once by its arm's cost model
    ar_runs = [load_traces(data / w / "ar") for w in args.workloads]  # one workload: request ids made unique
    entropies = pd.concat([t.tokens.assign(request_id=w + ":" + t.tokens["request_id"].astype(str))
                           for w, t in zip(args.workloads, ar_runs)], ignore_index=True)
    workload = _Workload(entropies, pd.concat([t.runs for t in ar_runs], ignore_index=True).drop_duplicates("run_id"))
    rows = []
    for name, part in table.groupby("config", sort=False):
        work = part.assign(request_id=part["workload"] + ":" + part["request_id"].astype(str))
        summary = source.predict(part["priced_by"].iloc[0], workload, rounds=work, transfer_error=0.0).summary
        rows.append({"config": name, **summary["predicted_speedup"].round(3).to_dict(),
                     "tokens_per_round": round(float(summary.loc["all", "predicted_tokens_per_round"]), 3),
                     "nodes_per_verify": round(float(part["nodes"].sum() / max(part["drafting_rounds"].sum(), 1)), 2)})
    out = pd.DataFrame(rows).set_index("config")
    with pd.option_context("display.width", 220, "display.max_columns", 20):
        print("\nmodelled speedup over AR (replayed rounds priced by data/traces_timed's cost models; not timed), "
              f"{len(set(table['workload'] + table['request_id'].astype(str)))} prompt runs")
        print(out.to_string())
    fixed = out.loc[[c for c in out.index if "ratio gate" in c], "all"]
    best_fixed = float(fixed.max())
    laws = out.loc[[c for c in out.index if c.startswith("law policy")], "all"]
    ceiling = float(out.loc[REPLAY_ORACLE, "all"])
    gate = float(out.loc[COST_GATE, "all"])
    result = {"bench": "policy_replay", "drafter": args.drafter, "from": args.arm_traces,
              "workloads": list(args.workloads),
              "cpu_s": round(time.process_time() - t0, 1), "curve": args.curve, "verify_cost_curve": curve,
              "measured_curve": measured.to_config(),
              "overall": {c: float(v) for c, v in out["all"].items()}, "best_fixed": fixed.idxmax(),
              "best_law_policy": laws.idxmax(),
              "best_law_policy_over_best_fixed": float(laws.max() / best_fixed - 1),
              "oracle": ceiling, "best_law_policy_below_oracle": float(1 - laws.max() / ceiling),
              "best_fixed_below_oracle": float(1 - best_fixed / ceiling),
              "cost_gate": gate, "best_law_policy_over_cost_gate": float(laws.max() / gate - 1)}
    alone = ", ".join(f"{out.loc[c, 'all']:.3f}x" for c in out.index
                      if c.startswith("law policy") and c.endswith("weight 0"))
    print(f"\nbest fixed: {fixed.idxmax()} {best_fixed:.3f}x; best law policy: {laws.idxmax()} {laws.max():.3f}x "
          f"({laws.max() / best_fixed - 1:+.1%}); the law alone (weight 0): "
          f"{alone}; the replay oracle (a ceiling: it knows each round's outcome) {ceiling:.3f}x: the best law policy {1 - laws.max() / ceiling:.1%} below it, the best fixed arm "
          f"{1 - best_fixed / ceiling:.1%}; the cost gate (DDTree16) {gate:.3f}x: the best law policy "
          f"{laws.max() / gate - 1:+.1%} against it")
    print(json.dumps(result, default=lambda v: float(v) if isinstance(v, np.floating) else str(v)))
    return result


CURVES = ("priced", "measured")


def _timed_tree_sizes(source, arm: str) -> str:
    """The draft nodes of the arm's timed drafting rounds: the range its cost model's verify line is fitted on."""
    view = source.arm_view(arm)
    nodes = view.rounds.loc[view.rounds["tree_nodes"] > 0, "tree_nodes"]
    share = (nodes <= 2).mean()
    return (f"{int(nodes.min())}-{int(nodes.max())} draft nodes (median {int(nodes.median())}; {share:.1%} of them "
            "<= 2 nodes)")


class _Workload:
    """The pooled AR runs as ``TraceAnalysis.predict`` reads a workload: ``tokens`` and ``runs``."""

    def __init__(self, tokens, runs):
        self.tokens, self.runs = tokens, runs


# --- gate-vs-law -----------------------------------------------------------------------------------------------------

N_BOOT = 4000


def per_request(folder: Path, reference: str = "ar") -> tuple[pd.DataFrame, str]:
    """Per request of a timed recording: its category, AR's and the drafting arm's CPU seconds and new tokens, and
    the drafting arm's rounds; and the drafting arm's name. Refuses a recording with other than one drafting arm,
    or an output that differs from AR's."""
    path = folder / "timings.csv"
    if not path.is_file():
        raise SystemExit(f"{folder}: no timings.csv (record it with bench/predict.py open-ended --record)")
    t = pd.read_csv(path)
    arms = sorted(set(t["arm"]) - {reference})
    if reference not in set(t["arm"]) or len(arms) != 1:
        raise SystemExit(f"{folder}: needs AR ({reference!r}) and exactly one drafting arm, holds "
                         f"{sorted(set(t['arm']))}")
    if not t["matches_reference"].all():
        bad = t.loc[~t["matches_reference"].astype(bool), ["arm", "request_id"]].to_records(index=False).tolist()
        raise SystemExit(f"{folder}: outputs differ from AR's: {bad}")
    t = t.drop_duplicates(["arm", "request_id"], keep="last")  # a resumed recording: the last call of each
    wide = t.pivot(index="request_id", columns="arm", values=["cpu_s", "new_tokens", "rounds"])
    out = pd.DataFrame({"category": t.drop_duplicates("request_id").set_index("request_id")["category"],
                        "ar_s": wide[("cpu_s", reference)], "ar_tokens": wide[("new_tokens", reference)],
                        "s": wide[("cpu_s", arms[0])], "tokens": wide[("new_tokens", arms[0])],
                        "rounds": wide[("rounds", arms[0])]})
    return out.sort_index(), arms[0]


def speedups(frame: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """``payoff.cost.paired_speedup`` of the requests at ``rows`` (positions; a leading axis of resamples allowed)."""
    from entropy_law.payoff.cost import paired_speedup

    return paired_speedup(*(frame[c].to_numpy(float)[rows] for c in ("ar_s", "ar_tokens", "s", "tokens")))


def gate_vs_law_arguments(parser) -> None:
    """The arguments of ``gate-vs-law``."""
    parser.add_argument("a", help="the first timed recording (the baseline of the ratio)")
    parser.add_argument("b", help="the second, of the same prompts")
    parser.add_argument("--seed", type=int, default=0)


def run_gate_vs_law(args, parser) -> dict:
    """Two gates of one drafter, each timed against its own AR on the same prompts: which pays more, by how much?

    ``A`` and ``B`` are timed recordings (``bench/predict.py open-ended --record``: AR and one drafting arm, interleaved
    per prompt, CPU clock, one thread, per-call times in ``timings.csv``) of the same prompts, the drafting arm run with
    a different gate or policy in each (``--gate cost`` in one, ``--policy block=FITTED.json`` in the other). The two
    recordings ran one after the other, so the machine may have drifted between them: each arm is therefore taken
    against its OWN recording's AR (speedup S = AR time per token / arm time per token, pooled over requests), and the
    comparison is the ratio S_B / S_A, with a percentile interval from resampling the prompts (the same resample in both
    recordings: the prompts are paired). Per category and overall; every output must equal its AR's (``timings.csv``'s
    ``matches_reference``), and the two recordings must hold the same prompts and the same drafting arm name.

        OMP_NUM_THREADS=1 python bench/predict.py open-ended --record /tmp/gate --per-category 4 --seed 31         --arms ar,block-ddtree16 --gate cost
        OMP_NUM_THREADS=1 python bench/predict.py open-ended --record /tmp/law --per-category 4 --seed 31         --arms ar,block-ddtree16 --policy block=/tmp/block-law-context.json
        python bench/policy.py gate-vs-law /tmp/gate /tmp/law

    Prints a table and ends with ONE JSON line.
    """
    (a, arm_a), (b, arm_b) = per_request(Path(args.a)), per_request(Path(args.b))
    if arm_a != arm_b:
        raise SystemExit(f"the recordings ran different drafting arms ({arm_a!r}, {arm_b!r}): compare one arm's gates")
    if list(a.index) != list(b.index):
        raise SystemExit("the recordings hold different prompts: record both with the same --seed and --per-category")
    if not (a["ar_tokens"].to_numpy() == b["ar_tokens"].to_numpy()).all():
        raise SystemExit("AR decoded different lengths in the two recordings: not the same prompts and settings")
    rng = np.random.default_rng(args.seed)
    rows = []
    groups = list(a.groupby("category").groups.items()) + [("all", a.index)]
    for category, ids in groups:
        at = a.index.get_indexer(ids)
        sa, sb = float(speedups(a, at)), float(speedups(b, at))
        pick = at[rng.integers(0, len(at), size=(N_BOOT, len(at)))]  # the same prompts in both recordings
        lo, hi = np.percentile(speedups(b, pick) / speedups(a, pick), [2.5, 97.5])
        rows.append(dict(category=category, requests=len(ids), a=sa, b=sb, ratio=sb / sa, lo=lo, hi=hi,
                         a_tokens_per_round=float(a.loc[ids, "tokens"].sum() / a.loc[ids, "rounds"].sum()),
                         b_tokens_per_round=float(b.loc[ids, "tokens"].sum() / b.loc[ids, "rounds"].sum()),
                         ar_drift=float(b.loc[ids, "ar_s"].sum() / a.loc[ids, "ar_s"].sum())))
    table = pd.DataFrame(rows).set_index("category")
    print(f"A = {args.a}, B = {args.b}; drafting arm {arm_a}; speedups over each recording's own AR (CPU clock); "
          f"ratio = B / A with a 95% percentile interval over {N_BOOT} resamples of the prompts (few per category: "
          "only the 'all' row is a result); ar_drift = B's AR time / A's")
    with pd.option_context("display.width", 200):
        print(table.round(3).to_string())
    overall = table.loc["all"]
    above = int((table.drop(index="all")["ratio"] >= 1).sum())
    print(f"\nB / A overall {overall['ratio']:.3f}x [{overall['lo']:.3f}, {overall['hi']:.3f}]; B at or above A in "
          f"{above} of {len(table) - 1} categories' points")
    result = {"bench": "gate_vs_law", "a": args.a, "b": args.b, "arm": arm_a, "requests": int(overall["requests"]),
              "a_speedup": float(overall["a"]), "b_speedup": float(overall["b"]), "ratio": float(overall["ratio"]),
              "lo": float(overall["lo"]), "hi": float(overall["hi"]), "categories_b_at_or_above": above,
              "per_category": {c: round(float(r), 4) for c, r in table["ratio"].items() if c != "all"}}
    print(json.dumps(result))
    return result


# --- controllers -----------------------------------------------------------------------------------------------------

OPEN_WORKLOADS = ("traces_open_timed", "traces_open_budgets", "traces_open_policy", "traces_open_policy2",
                  "traces_open_context")
SHIPPED_LAW = "data/traces_open_policy/{drafter}-ddtree16/run.json"  # the law policy fitted on data/traces, as it ran


def controllers_arguments(parser) -> None:
    """The arguments of ``controllers``."""
    parser.add_argument("--workloads", nargs="+", default=list(OPEN_WORKLOADS), metavar="NAME",
                        help=f"trace sets under data/ replayed over (default: {' '.join(OPEN_WORKLOADS)})")
    parser.add_argument("--policy", default=None, metavar="FITTED.json",
                        help="the law policy (default: the one data/traces_open_policy's arm ran, fitted on data/traces)")
    parser.add_argument("--drafter", choices=("ngram", "block"), default="ngram")
    parser.add_argument("--sample", type=int, default=3, metavar="K", help="a seeded sample of K requests per category")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default=None, help="the prompts' task file, where a run's run.json names none")
    parser.add_argument("--min-prompt-tokens", type=int, default=0, metavar="N",
                        help="only requests whose prompt has at least N tokens (the long prompts)")
    parser.add_argument("--fit-below", type=int, default=None, metavar="N",
                        help="instead of the shipped law policy, one fitted as it was (data/traces' DDTree16 arm of the "
                             "drafter, its settings) on the requests whose prompts are shorter than N tokens: held out")
    parser.add_argument("--csv", default=None, metavar="FILE",
                        help="also write the per-category table here (figures/fig13_controllers.py draws it)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the table here, headed by date, commit "
                                                                   "and machine")


def policy_below(root: Path, drafter: str, below: int) -> dict:
    """The shipped law policy refitted on the requests of ``data/traces``' DDTree16 arm of ``drafter`` whose prompts
    have fewer than ``below`` tokens (the settings, draft cost included, of the shipped one)."""
    from types import SimpleNamespace

    shipped = json.loads((root / SHIPPED_LAW.format(drafter=drafter)).read_text())["policy"]
    traces = load_traces(root / f"data/traces/{drafter}-ddtree16")
    keep = set(traces.requests.loc[traces.requests["prompt_tokens"] < below, "request_id"])
    if not keep:
        raise SystemExit(f"--fit-below {below}: no request of data/traces/{drafter}-ddtree16 has a shorter prompt")
    held = SimpleNamespace(**{name: getattr(traces, name).loc[getattr(traces, name)["request_id"].isin(keep)]
                              for name in ("tokens", "rounds", "requests")}, runs=traces.runs)
    return fit_policy(held, draft_cost=shipped["draft_cost"], window=shipped["window"],
                      confidence_weight=shipped["confidence_weight"], calibration_prior=shipped["calibration_prior"],
                      calibration_half_life=shipped["calibration_half_life"])


def run_controllers(args, parser) -> dict:
    """Does the law policy beat the draft-length controllers engines ship? Modelled by replay over the same requests.

    ``entropy-law controllers`` over the open-ended trace sets (prompts the shipped law policy, fitted on Spec-Bench's
    ``data/traces``, never saw), a seeded sample of ``--sample`` requests per category of each: the field's
    controllers (``decoding.controllers``), the law policy, its stop-probability ablation, the cost gate, fixed DDTrees
    and the replay oracle, every round priced by ``data/traces_timed``'s cost model of the drafter's DDTree16 arm.

        OMP_NUM_THREADS=1 python bench/policy.py controllers --out bench/results/policy-controllers.txt

    Prints the table and ends with ONE JSON line.
    """
    from argparse import Namespace

    from entropy_law.commands.controllers import compare, report

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    root = Path(__file__).resolve().parents[1]
    # the arm the shipped policy ran with (block: the checkpoint the open-ended sets recorded); priced by the cost
    # model of data/traces_timed's arm of the same drafter and tree (same architecture, same cost)
    arm = None if args.policy else str(root / Path(SHIPPED_LAW.format(drafter=args.drafter)).parent)
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="controllers-") as tmp:
        policy = args.policy
        if policy is None:  # the shipped policy's parameters, out of its run.json (--fit-below: refitted held out)
            policy = str(Path(tmp) / f"{args.drafter}-law.json")
            Path(policy).write_text(json.dumps(json.loads(
                (root / SHIPPED_LAW.format(drafter=args.drafter)).read_text())["policy"] if args.fit_below is None
                else policy_below(root, args.drafter, args.fit_below)))
        options = Namespace(traces=[str(root / "data" / w) for w in args.workloads], policy=policy, arm=arm,
                            source=str(root / "data/traces_timed"), drafter=args.drafter, sample=args.sample,
                            seed=args.seed, tasks=args.tasks, min_prompt_tokens=args.min_prompt_tokens)
        rows, table, curve = compare(options)
    result = {"bench": "policy_controllers", "drafter": args.drafter, "workloads": list(args.workloads),
              "sample": args.sample, "seed": args.seed}
    command = (f"controllers --drafter {args.drafter} --sample {args.sample} --seed {args.seed}"
               + (f" --workloads {' '.join(args.workloads)}" if list(args.workloads) != list(OPEN_WORKLOADS) else "")
               + (f" --tasks {args.tasks}" if args.tasks else "")
               + (f" --min-prompt-tokens {args.min_prompt_tokens}" if args.min_prompt_tokens else "")
               + (f" --fit-below {args.fit_below}" if args.fit_below is not None else ""))
    return _controllers_result(report(rows, table, curve, options), table, rows, args, result, command, t0)


def _controllers_result(text: str, table, rows, args, result: dict, command: str, t0: float) -> dict:
    """Prints a controllers table (``--csv``: also as CSV; ``--out``: with a header of date, commit and machine) and
    ends with its JSON line: ``result`` plus the requests, CPU seconds, overall speedups and the law over the best
    field controller."""
    from entropy_law.jobs.controllers import LAW, is_field

    root = Path(__file__).resolve().parents[1]
    text = text.replace(str(root) + "/", "")
    print(text)
    if args.csv:
        table.round(4).to_csv(args.csv, index=False)
    overall = table.loc[table["category"] == "all"].set_index("config")
    field = overall.loc[[c for c in overall.index if is_field(c)], "speedup"]
    result = {**result, "requests": int(rows["request"].nunique()), "cpu_s": round(time.process_time() - t0, 1),
              "overall": overall["speedup"].round(4).to_dict(), "of_oracle": overall["of_oracle"].round(4).to_dict(),
              "best_field": field.idxmax(), "law_over_best_field": float(overall.loc[LAW, "speedup"] / field.max() - 1)}
    if args.out:
        header = f"# {Path(args.out).name}: python bench/policy.py {command}\n{measured_line()}\n\n"
        Path(args.out).write_text(header + text + "\n\n" + json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


# the top three field controllers of the modelled ranking (n-gram drafter, policy-controllers.txt), timed
TIMED_FIELD = ("SGLang accept-length EMA (tiers 1/3/7)", "vLLM per-workload length (other requests' profile)",
               "transformers confidence threshold (0.4, ROC refit)")


def controllers_timed_arguments(parser) -> None:
    """The arguments of ``controllers-timed``."""
    parser.add_argument("--sets", nargs="+", default=["open_ended"], metavar="TASKS",
                        help="prompt sets the shipped law policy never saw (default: open_ended; it was fitted on all "
                             "400 Spec-Bench prompts of data/traces)")
    parser.add_argument("--categories", nargs="+", default=None, help="only these categories (default: all)")
    parser.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timings", default=None, metavar="CSV",
                        help="append each prompt's timings here as soon as it is timed, and skip the prompts already "
                             "in it (resumable)")
    parser.add_argument("--part", default="1/1", metavar="K/N",
                        help="time only prompts K, K+N, ... of the list (categories taken in turn): N processes, each "
                             "with its own --timings file (default: all)")
    parser.add_argument("--report", nargs="+", default=None, metavar="CSV",
                        help="time nothing: the table from these --timings files (the prompts every arm finished)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the table here, headed by date, commit, "
                                                                   "machine and load average")


def workload_lengths(target, arm_meta: dict, skip_questions: set[str], categories: set[str], verify_cost,
                     draft_cost: float) -> tuple[dict, int, dict]:
    """vLLM's per-workload draft length from an offline profile of OTHER requests: the fixed tree of ``arm_meta``
    replayed over the greedy outputs of the open-ended trace sets' AR runs, every recorded question in
    ``skip_questions`` left out, only ``categories``; (length per category, length of the whole pool, requests per
    category)."""
    from entropy_law.decoding.controllers import profile_length
    from entropy_law.decoding.replay import replay_rounds
    from entropy_law.jobs.controllers import acceptance_profile
    from entropy_law.jobs.reference import decoded_requests, workload_inputs

    root = Path(__file__).resolve().parents[1]
    rounds, counts = {}, Counter()
    for workload in OPEN_WORKLOADS:
        ar = root / "data" / workload / "ar"
        requests = load_traces(ar).requests
        question = dict(zip(requests["request_id"].astype(str), requests["question_id"].astype(str)))
        meta, drafter, plain, prompts, outputs = workload_inputs(ar, arm_meta, target, None, None)
        for rid, category, output in decoded_requests(outputs):
            if question[str(rid)] in skip_questions or category not in categories:
                continue
            result = replay_rounds(prompts[rid], output, copy.deepcopy(drafter), arm_meta["tree_policy"],
                                   arm_meta["tree_budget"], policy=RatioGate(min_expected_accepted=0.0),
                                   verify_cost=verify_cost, eos_token_ids=plain.config["eos_token_ids"],
                                   max_new_tokens=meta.get("max_new_tokens"), max_context=plain.adapter.max_context)
            rounds.setdefault(category, []).extend(result.rounds[1:])
            counts[category] += 1
    if not rounds:
        raise SystemExit("no recorded open-ended request is left out of the timed prompts: vLLM's profile needs others")
    lengths = {c: profile_length(acceptance_profile(r), verify_cost, draft_cost) for c, r in rounds.items()}
    pooled = profile_length(acceptance_profile([r for rs in rounds.values() for r in rs]), verify_cost, draft_cost)
    return lengths, pooled, dict(counts)


def run_controllers_timed(args, parser) -> dict:
    """The modelled ranking checked by the clock: the top three field controllers of ``controllers`` (n-gram
    drafter), the shipped n-gram law policy (``data/traces_open_policy``'s, fitted on Spec-Bench's ``data/traces``)
    and AR, DECODING on prompts the law policy never saw, SmolLM2-135M, one torch thread, the process's CPU clock,
    arms interleaved per prompt in a rotating order (``jobs.speed.time_arms``, one prompt at a time). Every drafting
    arm runs the shipped arm's drafter and tree (n-gram DDTree16); each arm's output must equal AR's (asserted).
    vLLM's length per category comes from the replayed acceptance profile of the recorded open-ended requests whose
    prompts are not in the timed list (``workload_lengths``), priced by the verify-cost curve each process measures
    (as the law policy is). Reports each arm's paired speedup over AR per category
    with 95% request-bootstrap intervals, and the law policy over the best timed field controller, paired.

    On a loaded machine: ``--part K/N`` in N processes, each with its own ``--timings`` file, then ``--report``:

        OMP_NUM_THREADS=1 nice -n 10 python bench/policy.py controllers-timed --part 1/2 --timings t1.csv &
        OMP_NUM_THREADS=1 nice -n 10 python bench/policy.py controllers-timed --part 2/2 --timings t2.csv
        python bench/policy.py controllers-timed --report t1.csv t2.csv --out bench/results/policy-controllers-timed.txt

    Prints the table and ends with ONE JSON line.
    """

    from entropy_law.decoding.controllers import AcceptLengthEMA, ConfidenceThreshold, WorkloadLength
    from entropy_law.jobs.controllers import LAW

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    root = Path(__file__).resolve().parents[1]
    t0 = time.process_time()
    chosen = [t for name in args.sets for t in sample_per_category(load_tasks(name, categories=args.categories),
                                                                   args.per_category, seed=args.seed)]
    rank = Counter()
    order = []
    for task in chosen:  # categories taken in turn: a run stopped early keeps them balanced
        order.append((rank[task.category], task))
        rank[task.category] += 1
    tasks = [t for _, t in sorted(order, key=lambda pair: pair[0])]
    fitted = set(map(str, load_traces(root / "data/traces/ngram").requests["question_id"]))
    seen = sorted(str(t.question_id) for t in tasks if t.dataset == "spec_bench" and str(t.question_id) in fitted)
    if seen:
        raise SystemExit(f"the law policy was fitted on Spec-Bench questions {seen[:5]}: time prompts it never saw")
    names = [LAW, *TIMED_FIELD]
    if args.report:
        timings = pd.concat([pd.read_csv(f, dtype={"request_id": str}) for f in args.report], ignore_index=True
                            ).drop_duplicates(["arm", "request_id"])  # a resumed part may start from a merged file
        lengths = [json.loads(x) for x in timings["vllm_lengths"].dropna().unique()]  # each process's own
        # cost curve; the committed file keeps each value on its first row only
    else:
        part, parts = map(int, args.part.split("/"))
        if not 1 <= part <= parts:
            parser.error(f"--part K/N needs 1 <= K <= N, got {args.part}")
        run = json.loads((root / SHIPPED_LAW.format(drafter="ngram")).read_text())
        law, tree, budget = run["policy"], run["tree_policy"], run["tree_budget"]
        target = load_target("smollm2-135m")
        encoder = ARDecoder(target)
        verify_cost = measure_verify_cost(TargetAdapter(target.model))
        print(f"verify cost c(n) (one-token forward = 1): {verify_cost.describe()}", flush=True)
        lengths, pooled, counts = workload_lengths(target, run, {str(t.question_id) for t in tasks},
                                                   {t.category for t in tasks}, verify_cost, float(law["draft_cost"]))
        lengths = {**lengths, "(pool)": pooled}
        print(f"vLLM lengths from the other requests' profile: {lengths} (requests {counts})", flush=True)

        def speculative(policy):
            return decoder_arm(SpeculativeDecoder(target, NgramDrafter(), tree=tree, budget=budget, policy=policy))
        arms = {AR: decoder_arm(ARDecoder(target)), LAW: speculative(make_policy(law, verify_cost)),
                TIMED_FIELD[0]: speculative(AcceptLengthEMA()),
                TIMED_FIELD[1]: speculative(WorkloadLength(lengths, pooled)),
                TIMED_FIELD[2]: speculative(ConfidenceThreshold())}
        out = Path(args.timings) if args.timings else None
        done = set(pd.read_csv(out, dtype={"request_id": str})["request_id"]) if out and out.is_file() else set()
        frames, warm = [], 16  # the first prompt warms every arm up (16 tokens), later ones with one token
        for index in range(part - 1, len(tasks), parts):
            task = tasks[index]
            if task.request_id in done:
                continue
            print(f"[{index + 1}/{len(tasks)}] {task.category:<16} {task.question_id:>6}", file=sys.stderr, flush=True)
            names_now = list(arms)[index % len(arms):] + list(arms)[: index % len(arms)]  # rotating order
            load = os.getloadavg()[0]
            frame = time_arms([task], {n: arms[n] for n in names_now}, lambda t: encoder.encode_prompt(t.messages()),
                              max_new_tokens=args.max_new_tokens, reference=AR, warm_up_tokens=warm,
                              verify_cost=verify_cost).assign(load1=load, vllm_lengths=json.dumps(lengths))
            warm = 1
            frames.append(frame)
            if out:
                frame.to_csv(out, mode="a", header=not out.is_file(), index=False)
        timings = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if out:
            timings = pd.read_csv(out, dtype={"request_id": str})
    timings = timings.loc[timings.groupby("request_id")["arm"].transform("nunique") == len(names) + 1]
    if timings.empty:
        raise SystemExit("no prompt was timed by every arm yet")
    wrong = timings.loc[~timings["matches_reference"].astype(bool), ["arm", "request_id"]]
    assert wrong.empty, f"outputs differ from AR's (not exact): {wrong.to_dict('records')}"
    speed = paired_speedups(timings, reference=AR, clock="cpu", seed=args.seed)
    overall = speed.loc[speed["category"] == ALL].set_index("arm")
    best = overall.loc[list(TIMED_FIELD), "speedup"].idxmax()
    head = paired_speedups(timings.loc[timings["arm"].isin([LAW, best])], reference=best, clock="cpu",
                           seed=args.seed).set_index("category")
    categories = [c for c in speed["category"].unique() if c != ALL] + [ALL]
    prompts = timings["request_id"].nunique()
    lines = [f"{prompts} prompts ({', '.join(args.sets)}, seed {args.seed}), {args.max_new_tokens} new tokens, n-gram "
             "DDTree16; paired speedup over AR by CPU time [95% request bootstrap] (tokens per round); every output "
             "equals AR's", "",
             "| category | prompts | " + " | ".join(names) + f" | law / {best.split(' (')[0]} |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for category in categories:
        cells = []
        for name in names:
            row = speed.loc[(speed["arm"] == name) & (speed["category"] == category)].iloc[0]
            cells.append(f"{row['speedup']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}] ({row['tokens_per_round']:.2f})")
        ratio = head.loc[category]
        lines.append(f"| {category} | {int(ratio['requests'])} | " + " | ".join(cells) + f" | {ratio['speedup']:.3f} "
                     f"[{ratio['lo']:.3f}, {ratio['hi']:.3f}] |")
    text = "\n".join(lines)
    print(text)
    load = timings["load1"]
    result = {"bench": "policy_controllers_timed", "prompts": int(prompts), "sets": list(args.sets),
              "max_new_tokens": args.max_new_tokens, "seed": args.seed, "vllm_lengths": lengths,
              "overall": {n: [round(float(overall.loc[n, k]), 4) for k in ("speedup", "lo", "hi")] for n in names},
              "best_field": best, "law_over_best_field": [round(float(head.loc[ALL, k]), 4)
                                                          for k in ("speedup", "lo", "hi")],
              "mismatches": int((~timings["matches_reference"].astype(bool)).sum()),
              "arm_cpu_s": round(float(timings["cpu_s"].sum()), 1), "cpu_s": round(time.process_time() - t0, 1)}
    if args.out:
        header = (f"# policy-controllers-timed.txt: python bench/policy.py controllers-timed --per-category "
                  f"{args.per_category} --max-new-tokens {args.max_new_tokens} --seed {args.seed} --categories "
                  f"{' '.join(args.categories or ['(all)'])} (--part K/N, then "
                  f"--report)\n{measured_line()}; load average (1 min) at each prompt's start {load.min():.1f}-{load.max():.1f} (mean "
                  f"{load.mean():.1f}): the CPU clock, not wall\n# vLLM lengths (other requests' profile; each "
                  f"process priced by the verify-cost curve it measured): {lengths}\n\n")
        Path(args.out).write_text(header + text + "\n\n" + json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


def controllers_loco_arguments(parser) -> None:
    """The arguments of ``controllers-loco``."""
    parser.add_argument("--traces", default="data/traces_gemma/ngram", metavar="RUN",
                        help="a timed n-gram chain run of Spec-Bench (default: the second target's, data/traces_gemma)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=None, metavar="FILE",
                        help="also write the per-category table here (figures/fig13_controllers.py draws it)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the table here, headed by date, commit "
                                                                   "and machine")


def run_controllers_loco(args, parser) -> dict:
    """The controllers' comparison on a target with one timed n-gram chain run and no law policy of its own (the
    second target): leave one category out. For each category, a law policy is fitted on the run's OTHER categories
    (``fitted_policy``) and every configuration (``jobs.controllers.replay_controllers``, n-gram DDTree16) is replayed
    over the held-out category's requests; rounds are priced by the run's own timed rounds: the verify line of
    ``payoff.cost.fit_cost_model`` (CPU clock where recorded) as the curve ``c(n)``, the drafter's cost its
    ``draft_ms`` over the line's one-token intercept. The chain run verified at most its block's drafts: a DDTree16
    round's cost is the line extrapolated.

        OMP_NUM_THREADS=1 python bench/policy.py controllers-loco --out bench/results/policy-controllers-loco.txt

    Prints the table and ends with ONE JSON line.
    """
    from argparse import Namespace

    from entropy_law.commands.controllers import report
    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.jobs.controllers import replay_controllers
    from entropy_law.payoff.controllers import controller_table
    from entropy_law.payoff.cost import fit_cost_model, verify_curve
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0 = time.process_time()
    run = Path(args.traces)
    traces, meta = load_traces(run), read_run_json(run / RUN_FILE)
    if meta.get("drafter_id") != "ngram" or meta.get("tree_policy") != "chain":
        raise SystemExit(f"{run}: give a timed n-gram chain run (drafter {meta.get('drafter_id')}, tree "
                         f"{meta.get('tree_policy')})")
    from types import SimpleNamespace

    decoded = set(traces.requests.loc[traces.requests["new_tokens"] >= 2, "request_id"])  # a timed decode round
    timed = SimpleNamespace(runs=traces.runs, requests=traces.requests.loc[traces.requests["request_id"].isin(decoded)],
                            rounds=traces.rounds.loc[traces.rounds["request_id"].isin(decoded)])
    idle = timed.rounds.loc[(timed.rounds["round_index"] > 0) & (timed.rounds["tree_nodes"] == 0)]
    cost = fit_cost_model(timed, drafter="ngram", ar_ms_per_token=float(idle[["draft_ms", "verify_ms",
                                                                                "overhead_ms"]].sum(axis=1).mean()))
    curve = VerifyCost.from_config(verify_curve(cost))
    draft_cost = cost.draft_ms / cost.verify_intercept_ms
    target = load_target(meta["model_id"])
    arm = {**meta, "tree_policy": "ddtree", "tree_budget": 16}
    requests, frames, laws = traces.requests, [], {}
    for category in sorted(requests["category"].unique()):
        held = requests.loc[requests["category"] == category]
        law = fitted_policy(run.parent, run.name, set(held["question_id"].astype(str)), draft_cost)
        laws[category] = law["fitted_on"]["requests"]
        frames.append(replay_controllers(run, arm, target, law, curve, requests=held["request_id"].astype(str).tolist(),
                                         seed=args.seed, workload=category))
        print(f"{category}: law fitted on {laws[category]} requests of the other categories; replayed over "
              f"{len(held)}", flush=True)
    rows = pd.concat(frames, ignore_index=True)
    table = controller_table(rows, seed=args.seed)
    options = Namespace(source=f"{args.traces} (own rounds, {cost.clock} clock, draft cost {draft_cost:.4f})",
                        drafter="ngram", traces=[f"{args.traces} (each category held out)"], seed=args.seed)
    result = {"bench": "policy_controllers_loco", "traces": args.traces, "model_id": meta["model_id"],
              "draft_cost": round(draft_cost, 5), "cost_clock": cost.clock}
    command = f"controllers-loco --traces {args.traces} --seed {args.seed}"
    return _controllers_result(report(rows, table, curve, options), table, rows, args, result, command, t0)


# --- controllers-gap ---------------------------------------------------------------------------------------------------
# Why the law policy stops short of the replay oracle on a workload: where it loses, what any signal could buy.

GAP_BUDGETS = (0, 1, 2, 4, 8, 16)
GAP_KINDS = ("skips; the oracle skips too", "skips; the oracle drafts", "drafts, verifies none; the oracle skips",
             "drafts and verifies; the oracle skips", "shallower than the oracle", "as deep as the oracle or deeper")


def controllers_gap_arguments(parser) -> None:
    """The arguments of ``controllers-gap``."""
    parser.add_argument("traces", nargs="*", default=[f"data/{w}" for w in OPEN_WORKLOADS],
                        help="trace sets with an AR run, as entropy-law controllers takes (default: the open-ended sets)")
    parser.add_argument("--drafter", choices=("ngram", "block"), default="block")
    parser.add_argument("--policy", default=None, metavar="FITTED.json",
                        help="the law policy (default: the one data/traces_open_policy's arm ran, fitted on data/traces)")
    parser.add_argument("--tasks", default=None, help="the prompts' task file, where a run's run.json names none")
    parser.add_argument("--min-prompt-tokens", type=int, default=0, metavar="N")
    parser.add_argument("--sample", type=int, default=3, metavar="K", help="a seeded sample of K requests per category")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--bins", type=int, default=6, help="quantile bins of the table policies' inputs")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the table here, headed by date, commit "
                                                                   "and machine")


class RateGatedLaw:
    """The law policy (its ``plan`` unchanged) drafting only where the law's best chain gains at ``rate``: ``E_D >
    rate * (c(D + 1) + c_draft - 1)`` for some depth D (the renewal rule of a policy that earns ``rate`` tokens per
    unit cost; the law policy itself asks ``rate`` = 1). ``rate`` None: the request's own tokens per cost so far (the prefill
    not counted), started from ``prior`` units of cost at ``prior_rate``. Reads the history the ``RoundPolicy`` protocol passes: nothing new."""

    def __init__(self, params: dict, curve, rate: float | None, prior: float = 8.0, prior_rate: float = 1.1):
        self.law, self.rate, self.prior, self.prior_rate = LawPolicy(params, curve), rate, prior, prior_rate
        self.plan, self.observe, self.begin_request = self.law.plan, self.law.observe, self.law.begin_request

    def bind(self, adapter, drafter) -> "RateGatedLaw":  # the decoder and the replay decide with what bind returns
        return self

    def _rate(self, history) -> float:
        if self.rate is not None:
            return float(self.rate)
        law, tokens, cost = self.law, self.prior * self.prior_rate, self.prior
        for r in history:
            if r.round_index > 0:
                drafted = (r.policy or {}).get("draft", True)
                tokens, cost = tokens + r.committed, cost + law.verify_cost(r.tree_nodes + 1) + drafted * law.draft_cost
        return tokens / cost

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        decision, law = self.law.before_draft(entropies, n_output, max_depth, history, context), self.law
        rate, scale, expected, best = self._rate(history), decision.get("calibration", 1.0), 0.0, -np.inf
        for depth, reach in enumerate(law._reach(decision["acceptance"], max(int(max_depth), 0)), start=1):
            expected += min(1.0, scale * reach)
            best = max(best, expected - rate * (law.verify_cost(depth + 1) + law.draft_cost - 1.0))
        return {**decision, "draft": bool(best > 0.0), "opportunity_rate": rate}

    def to_config(self) -> dict:
        return {**self.law.to_config(), "opportunity_rate": self.rate}


def gap_candidates(law: dict, curve) -> dict:
    """name -> a factory of the round policy: the shipped law policy and the candidates replayed beside it."""
    def params(**changes):
        return lambda: LawPolicy({**law, **changes}, curve)

    return {"law policy (shipped)": params(),
            "calibration off": params(calibration_prior=None, calibration_half_life=None),
            "faster calibration (1 pseudo-draft, half-life 2 rounds)": params(calibration_prior=1.0,
                                                                              calibration_half_life=2.0),
            "drafter's confidences only in the plan (confidence weight 1)": params(confidence_weight=1.0),
            "law only in the plan (confidence weight 0)": params(confidence_weight=0.0),
            "drafts where it gains at the request's own rate so far": lambda: RateGatedLaw(law, curve, None)}


def _round_rate(t: pd.DataFrame, n: int, curve, draft_cost: float) -> float:
    return t.loc[n, "committed"] / (curve(int(t.loc[n, "tree_nodes"]) + 1) + (draft_cost if n else 0.0))


def gap_rows(request: dict, law_rounds, curve, draft_cost: float) -> list[dict]:
    """Per round of the law policy's replay: what it did, and the round in hindsight from the same start (the best
    rate of ``GAP_BUDGETS``, 0 a plain step) with the signals read before drafting and after it."""
    by = {int(s): p.set_index("budget") for s, p in request["table"].groupby("start_position")}
    rows, last, ema = [], np.nan, np.nan
    for r in law_rounds[1:]:
        decision, t = r.policy or {}, by[r.start_position]
        drafted = bool(decision.get("draft", True))
        best = max(GAP_BUDGETS, key=lambda n: _round_rate(t, n, curve, draft_cost))
        rows.append(dict(key=request["key"], drafted=drafted, nodes=r.tree_nodes, committed=r.committed,
                         cost=curve(r.tree_nodes + 1) + drafted * draft_cost, best=best,
                         best_committed=t.loc[best, "committed"],
                         best_cost=curve(int(t.loc[best, "tree_nodes"]) + 1) + (draft_cost if best else 0.0),
                         law_rate=decision.get("law_rate"), window_entropy=decision.get("window_entropy"),
                         calibration=decision.get("calibration", 1.0), last_accepted=last, accepted_ema=ema,
                         confidence=float(t.loc[max(GAP_BUDGETS), "expected_accepted"]),
                         full_accepted=int(t.loc[max(GAP_BUDGETS), "accepted"]), accepted=r.accepted,
                         budget=decision.get("budget", 0), expected=decision.get("expected", 0.0),
                         **{k: decision.get(k) for k in SIGNAL_KEYS if k in decision}))
        if drafted and r.tree_nodes:
            last = r.accepted
            ema = r.accepted if ema != ema else 0.7 * ema + 0.3 * r.accepted
    return rows


def auc(label: np.ndarray, score: np.ndarray) -> float:
    """The area under the ROC curve of ``score`` for ``label`` (Mann-Whitney, ties counted half)."""
    from scipy.stats import mannwhitneyu

    ok = np.isfinite(score)
    y, x = label[ok].astype(bool), score[ok]
    return float(mannwhitneyu(x[y], x[~y]).statistic / (y.sum() * (~y).sum()))


def gap_tables(requests: list[dict], law, curve, draft_cost: float, bins: int) -> dict:
    """Table policies over the requests' round outcomes (``Actions``): in sample and cross-fitted, on the window
    entropy and the drafter's confidence, then with two history inputs that see more than a policy can (the
    request's share of starts where drafting pays, in hindsight, in 4 bins; whether the drafter's proposal one
    position back was accepted): optimistic bounds for any signal of the request's history."""
    frames = []
    for r in requests:
        t = r["table"].assign(key=r["key"], category=r["category"])
        starts = sorted(t["start_position"].unique())
        t["window_entropy"] = t["start_position"].map({s: law.inputs(r["entropies"], s)["window_entropy"]
                                                       for s in starts})
        by = {int(s): p.set_index("budget") for s, p in t.groupby("start_position")}
        pays = np.mean([max(_round_rate(by[s], n, curve, draft_cost) for n in GAP_BUDGETS[1:]) > 1.0 for s in starts])
        full = by[starts[0]].index.max()
        back = {s: int(s - 1 in by and by[s - 1].loc[full, "accepted"] >= 1) for s in starts}
        frames.append(t.assign(pays=pays, back=t["start_position"].map(back)))
    table = pd.concat(frames, ignore_index=True)
    pays = table.groupby("key")["pays"].first()
    table["pays_bin"] = np.searchsorted(np.quantile(pays, [0.25, 0.5, 0.75]), table["pays"])
    out = {}
    for label, level in (("", 0), (" + hindsight history", table["pays_bin"] * 2 + table["back"])):
        actions = Actions(table.assign(context_match=level), list(GAP_BUDGETS), curve, draft_cost)
        oracle = actions.rate(ratio_oracle(actions))
        out["table oracle"] = oracle
        drafting = actions.committed[:, 1:] / actions.cost[:, 1:]
        out["drafts every round, budget in hindsight"] = actions.rate(1 + np.argmax(drafting, axis=1))
        for use in (("entropy", "copy"), ("entropy", "copy", "confidence")):
            name = "entropy" + label + (" + confidence" if "confidence" in use else "")
            for how, choice in table_policy(actions, use, bins=bins, folds=2).items():
                out[f"table: {name}, {how}"] = actions.rate(choice)
    return out


def gap_setup(root: Path, drafter: str) -> tuple:
    """(the shipped law policy's parameters, data/traces_timed's cost curve of the drafter's DDTree16 arm, the run.json
    of the arm the shipped policy ran with, its target)."""
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.payoff.cost import verify_curve
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    shipped = root / SHIPPED_LAW.format(drafter=drafter)
    source = TraceAnalysis(load_traces(root / "data/traces_timed"), n_boot=0)
    arm = [a for a in source.arms if a.startswith(drafter) and a.endswith("ddtree16")][0]
    curve = VerifyCost.from_config(verify_curve(source.cost_model(arm)))
    arm_meta = read_run_json(shipped.parent / RUN_FILE)
    return (json.loads(shipped.read_text())["policy"], curve, arm_meta,
            load_target(arm_meta.get("model_id") or "smollm2-135m"))


def gap_requests(root: Path, trace_set: Path, arm_meta: dict, target, drafter: str, tasks, sample: int, seed: int,
                 low: int = 0, high: int | None = None) -> list[dict]:
    """A seeded sample of ``sample`` requests per category of ``trace_set``'s AR run whose prompts have ``low`` tokens
    or more (and fewer than ``high``), as ``entropy-law controllers`` replays them: key, category, prompt, output, a
    factory of the replay drafter (``fresh``), the target's entropies, the replay's options."""
    from entropy_law.jobs.reference import decoded_requests, replay_drafter, workload_inputs

    ar = root / trace_set / "ar" if (root / trace_set / "ar").is_dir() else root / trace_set
    chosen = load_traces(ar).requests
    keep = (chosen["prompt_tokens"] >= low) & (chosen["prompt_tokens"] < (np.inf if high is None else high))
    chosen = chosen.loc[keep].groupby("category", observed=True, group_keys=False).apply(
        lambda g: g.sample(min(sample, len(g)), random_state=seed))
    meta, source, plain, prompts, outputs = workload_inputs(ar, arm_meta, target, tasks, None)
    tokens = load_traces(ar).tokens.sort_values(["request_id", "position"])
    entropies = {str(k): g["target_entropy_nats"].to_numpy(float) for k, g in tokens.groupby("request_id")}
    options = dict(eos_token_ids=plain.config["eos_token_ids"], max_new_tokens=meta.get("max_new_tokens"),
                   max_context=plain.adapter.max_context)
    out = []
    for rid, category, output in decoded_requests(outputs, chosen["request_id"].astype(str).tolist()):
        src = replay_drafter(source, target, prompts[rid], output)
        fresh = (lambda s=src: copy.deepcopy(s)) if drafter == "ngram" else (lambda s=src: s)
        out.append(dict(key=f"{Path(trace_set).name}:{rid}", category=category, prompt=prompts[rid], output=output,
                        fresh=fresh, entropies=entropies[str(rid)], options=options))
    return out


def replay_priced(request: dict, policy, arm_meta: dict, curve, draft_cost: float) -> tuple:
    """(the replay of ``request`` under ``policy``, its (tokens, rounds, modelled cost))."""
    from entropy_law.decoding.replay import replay_rounds
    from entropy_law.jobs.controllers import _priced

    result = replay_rounds(request["prompt"], request["output"], request["fresh"](), arm_meta.get("tree_policy", "chain"),
                           arm_meta.get("tree_budget"), policy=policy, verify_cost=curve, entropies=request["entropies"],
                           category=request["category"], **request["options"])
    return result, _priced(result, curve, draft_cost)


def run_controllers_gap(args, parser) -> dict:
    """Where does the law policy lose against the replay oracle, and could any signal close the distance?

    Over a workload as ``entropy-law controllers`` replays it (the same seeded sample and cost model): per round of
    the law policy's replay, the round in hindsight from the same start (``round_outcomes``) and the loss priced at
    the oracle's rate (tokens - rate x cost, summed by kind: drafts the oracle skips, skips it drafts, shallower or
    deeper trees); how well each signal tells the rounds where drafting pays (AUC); what always drafting with the
    budget in hindsight reaches (the price of deciding before drafting); table policies on the law's inputs, the
    drafter's confidence and optimistic history inputs (in sample: a bound); and candidate policies replayed.

        OMP_NUM_THREADS=1 python bench/policy.py controllers-gap --drafter block --out bench/results/policy-controllers-gap.txt
        OMP_NUM_THREADS=1 python bench/policy.py controllers-gap data/traces/ngram --drafter ngram --tasks spec_bench \\
            --min-prompt-tokens 800 --sample 8

    Prints the tables and ends with ONE JSON line.
    """
    from entropy_law.decoding.replay import round_outcomes

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0, root = time.process_time(), Path(__file__).resolve().parents[1]
    shipped, curve, arm_meta, target = gap_setup(root, args.drafter)
    law_params = json.loads(Path(args.policy).read_text()) if args.policy else shipped
    draft_cost, tree = float(law_params["draft_cost"]), arm_meta.get("tree_policy", "chain")
    candidates, law = gap_candidates(law_params, curve), LawPolicy(law_params, curve)
    requests, rows, priced, oracle = [], [], [], [0, 0.0]
    for trace_set in map(Path, args.traces):
        for request in gap_requests(root, trace_set, arm_meta, target, args.drafter, args.tasks, args.sample, args.seed,
                                    args.min_prompt_tokens):
            request["table"] = round_outcomes(request["prompt"], request["output"], request["fresh"](),
                                              budgets=GAP_BUDGETS, tree=tree, **request["options"])
            requests.append(request)
            best = oracle_rounds(request["prompt"], request["output"], request["fresh"](), budgets=GAP_BUDGETS,
                                 tree=tree, verify_cost=curve, draft_cost=draft_cost, **request["options"])
            oracle = [oracle[0] + sum(best.committed), oracle[1] + float(sum(best.cost))]
            for name, make in candidates.items():
                result, cost = replay_priced(request, make(), arm_meta, curve, draft_cost)
                priced.append((name, request["key"], *cost))
                if name == "law policy (shipped)":
                    rows += gap_rows(request, result.rounds, curve, draft_cost)
    return _gap_report(args, requests, pd.DataFrame(rows), priced, oracle, law, curve, draft_cost, t0)


def _gap_report(args, requests, rounds, priced, oracle, law, curve, draft_cost: float, t0: float) -> dict:
    """Prints ``controllers-gap``'s tables (``--out``: also to a file with its header); returns the JSON line."""
    from entropy_law.payoff.controllers import paired_ratio

    rate = oracle[0] / oracle[1]
    frame = pd.DataFrame(priced, columns=["config", "request", "tokens", "rounds", "cost"])
    sums = frame.groupby("config", sort=False)[["tokens", "cost"]].sum()
    lines = [f"{len(requests)} requests of {', '.join(map(str, args.traces))} ({args.drafter} DDTree16, seeded sample of "
             f"{args.sample} per category, seed {args.seed}, prompts >= {args.min_prompt_tokens} tokens); verify cost "
             f"{curve.describe()}; draft cost {draft_cost:.4f}", f"replay oracle {rate:.4f}x", "",
             "candidates replayed: modelled speedup, share of the oracle's, / the shipped law policy [95% paired request "
             "bootstrap]"]
    shipped = "law policy (shipped)"
    for name, s in sums.iterrows():
        ratio, lo, hi = paired_ratio(frame, name, shipped, seed=args.seed) if name != shipped else (1.0, 1.0, 1.0)
        lines.append(f"  {name:<62} {s['tokens'] / s['cost']:.4f}x  {s['tokens'] / s['cost'] / rate:6.1%}  "
                     f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]")
    rounds["loss"] = (rounds["best_committed"] - rate * rounds["best_cost"]) - (rounds["committed"] - rate * rounds["cost"])
    rounds["kind"] = np.select(
        [~rounds["drafted"] & (rounds["best"] == 0), ~rounds["drafted"],
         (rounds["nodes"] == 0) & (rounds["best"] == 0), rounds["best"] == 0, rounds["nodes"] < rounds["best"]],
        list(GAP_KINDS[:5]), GAP_KINDS[5])
    kinds = rounds.groupby("kind").agg(rounds=("loss", "size"), loss=("loss", "sum")).reindex(list(GAP_KINDS)).fillna(0)
    kinds["share of the loss"] = kinds["loss"] / kinds["loss"].sum()
    lines += ["", f"the shipped law policy's rounds against the round in hindsight from the same start (best rate of "
              f"budgets {GAP_BUDGETS}), loss = (tokens - {rate:.3f} x cost) of that round minus the law's",
              kinds.round(3).to_string()]
    pays = (rounds["best"] > 0).to_numpy()
    lines += ["", f"AUC for 'drafting pays in hindsight' ({pays.mean():.1%} of the law's rounds), by signal:"]
    signals = {"law's best chain rate (before drafting)": "law_rate", "window entropy (before drafting; low: pays)":
               "window_entropy", "calibration factor (request's history)": "calibration",
               "last drafted round's accepted drafts (history)": "last_accepted",
               "accepted-drafts EMA 0.3 (history)": "accepted_ema",
               "drafter's confidence, DDTree16 (before verifying)": "confidence"}
    aucs = {}
    for label, column in signals.items():
        score = rounds[column].astype(float).to_numpy() * (-1 if "entropy" in column else 1)
        aucs[column] = auc(pays, score)
        lines.append(f"  {label:<55} {aucs[column]:.3f}")
    tables = gap_tables(requests, law, curve, draft_cost, args.bins)
    lines += ["", f"walks over the round-outcome table (share of its replay oracle's {tables['table oracle']:.4f}x; "
              f"'in sample' tables are fitted on the requests they are scored on, {args.bins} bins: optimistic)"]
    lines += [f"  {name:<80} {value:.4f}x  {value / tables['table oracle']:6.1%}" for name, value in tables.items()]
    text = "\n".join(lines)
    print(text)
    result = {"bench": "policy_controllers_gap", "drafter": args.drafter, "requests": len(requests),
              "oracle": round(rate, 4), "of_oracle": {n: round(s["tokens"] / s["cost"] / rate, 4) for n, s in sums.iterrows()},
              "loss_share": kinds["share of the loss"].round(4).to_dict(), "auc": {k: round(v, 3) for k, v in aucs.items()},
              "tables_of_oracle": {k: round(v / tables["table oracle"], 4) for k, v in tables.items()},
              "cpu_s": round(time.process_time() - t0, 1)}
    if args.out:
        header = (f"# {Path(args.out).name}: python bench/policy.py controllers-gap {' '.join(map(str, args.traces))} "
                  f"--drafter {args.drafter}{f' --tasks {args.tasks}' if args.tasks else ''} --sample {args.sample} --seed "
                  f"{args.seed} --min-prompt-tokens {args.min_prompt_tokens}\n{measured_line()}\n\n")
        Path(args.out).write_text(header + text + "\n\n" + json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


# --- controllers-signals -----------------------------------------------------------------------------------------------
# Could prompt-lookup signals (the matched suffix, its source span's history) lift the law policy to 90% of the oracle?

SIGNAL_KEYS = ("match_len", "n_matches", "distance", "agree_depth", "agree1", "cont", "same_span")
SIGNALS = {"law's best chain rate (before drafting), ref": ("law_rate", 1),
           "drafter's confidence, DDTree16 (before verifying), ref": ("confidence", 1),
           "(1) copy-run continuation": ("cont", 1), "(2) matched suffix length n": ("match_len", 1),
           "(2) occurrences of the matched n-gram": ("n_matches", 1),
           "(2) agreement: share of matches agreeing at depth 1": ("agree1", 1),
           "(2) agreement: depths where all matches agree": ("agree_depth", 1),
           "(2) distance back to the match (shorter pays)": ("distance", -1),
           "(3) same source span earlier: -1 none / 0 rejected / 1 all": ("same_span", 1)}
SPAN_LOOKBACK = 16  # rounds scanned back for an earlier proposal from the same source span


def signals_arguments(parser) -> None:
    """The arguments of ``controllers-signals``."""
    parser.add_argument("--sample", type=int, default=8, metavar="K", help="long requests per Spec-Bench category")
    parser.add_argument("--fit-sample", type=int, default=6, metavar="K",
                        help="requests per category under --min-prompt-tokens the candidates' factors are fitted on")
    parser.add_argument("--open-sample", type=int, default=3, metavar="K", help="requests per category of each open set")
    parser.add_argument("--min-prompt-tokens", type=int, default=800, metavar="N")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default=None, metavar="FILE", help="also append the tables to this file, headed by "
                                                                   "the command, date, commit and machine")


class SignalLaw(LawPolicy):
    """The n-gram law policy plus prompt-lookup signals read from the context and the request's history (both passed
    by the ``RoundPolicy`` protocol) into its decision. ``scales``: level (``signal_level``) -> a factor on the plan's
    path probabilities (None: the law's decisions, the signals only recorded); ``rate_plan``: the plan keeps the prefix
    of nodes (by path probability) with the most ``1 + sum P - R c(k + 1)``, R the request's own rate so far."""

    def __init__(self, params: dict, curve, drafter_config: dict, scales: dict | None = None, rate_plan: bool = False):
        super().__init__(params, curve)
        self.config, self.scales, self.rate_plan = dict(drafter_config), scales, rate_plan
        self.rater, self.lookup = RateGatedLaw(params, curve, None), NgramDrafter(**self.config)

    def begin_request(self, state) -> None:
        self.lookup = NgramDrafter(**self.config)
        self.lookup.begin(list(state.prompt_ids))

    def signals(self, context, history) -> dict:
        """(1) the match continues the last round's fully accepted copy; (2) the matched suffix: length, occurrences,
        distance back, agreement of its matches; (3) an earlier proposal from the same source span and its outcome."""
        ng = self.lookup
        ng._extend_context(list(context))
        n = len(ng._tokens)
        ng._index_until(n - 1)
        length, ends = ng._find_matches()
        if not ends:
            return dict(match_len=0, n_matches=0, distance=np.nan, agree_depth=0, agree1=np.nan, cont=0, same_span=-1,
                        match_end=-1)
        best, rows, prev = ends[0], ng._candidates(ends), history[-1] if history else None
        conts = [ng._tokens[e + 1] if e + 1 < n else None for e in ends]
        end = ((prev.policy or {}) if prev is not None else {}).get("match_end", -1)
        cont = int(prev is not None and prev.round_index > 0 and prev.tree_nodes > 0
                   and prev.accepted == prev.tree_depth and end >= 0 and best == end + prev.committed)
        same = -1
        for r in list(history)[::-1][:SPAN_LOOKBACK]:
            e = (r.policy or {}).get("match_end", -1)
            if r.round_index > 0 and r.tree_nodes > 0 and 0 <= e < best <= e + r.tree_depth + 1:
                same = int(r.accepted == r.tree_depth)
                break
        return dict(match_len=length, n_matches=len(ng._index[length].get(tuple(ng._tokens[n - length:]), ())),
                    distance=float(n - 1 - best), agree1=float(np.mean([c == conts[0] for c in conts])),
                    agree_depth=next((d for d, row in enumerate(rows) if len(row) > 1), len(rows)), cont=cont,
                    same_span=same, match_end=best)

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        decision = {**super().before_draft(entropies, n_output, max_depth, history, context),
                    **self.signals(context, history)}
        if self.scales is not None:
            decision["level"] = signal_level(decision)
            decision["plan_calibration"] = decision.get("plan_calibration", 1.0) * self.scales.get(decision["level"], 1.0)
        if self.rate_plan:
            decision["opportunity_rate"] = self.rater._rate(history)
        return decision

    def plan(self, proposal, tree, decision):
        if not self.rate_plan or tree.n_nodes == 0:
            return super().plan(proposal, tree, decision)
        rate, curve = decision["opportunity_rate"], self.verify_cost

        def prefix(k: int, into: dict):  # the law's plan held to its k most probable nodes (a cost wall after them)
            self.verify_cost = lambda nodes: 1.0 if nodes <= k + 1 else np.inf
            try:
                return LawPolicy.plan(self, proposal, tree, into)
            finally:
                self.verify_cost = curve

        best_k, best = 0, 1.0 - rate * curve(1)
        for k in range(1, tree.n_nodes + 1):
            kept, expected = prefix(k, dict(decision))
            if (value := 1.0 + expected - rate * curve(kept.n_nodes + 1)) > best:
                best_k, best = k, value
        return prefix(best_k, decision)

    def to_config(self) -> dict:
        return {**super().to_config(), "scales": self.scales}


def signal_level(decision: dict) -> str:
    """The candidates' level: the matched suffix length (capped at 4) and the source span's state (``same_span``)."""
    return f"n{min(int(decision.get('match_len') or 0), 4)}s{int(decision.get('same_span', -1))}"


def fit_scales(rows: pd.DataFrame, shrink: float = 5.0, clip=(0.25, 4.0)) -> dict:
    """level -> accepted / expected drafts of the law's verified trees on that level (``shrink`` pseudo-drafts at 1)."""
    rows = rows.loc[rows["budget"] > 0]
    sums = rows.groupby([signal_level(r) for r in rows.to_dict("records")])[["accepted", "expected"]].sum()
    return {k: float(np.clip((s["accepted"] + shrink) / (s["expected"] + shrink), *clip)) for k, s in sums.iterrows()}


def run_controllers_signals(args, parser) -> dict:
    """Do prompt-lookup signals lift the n-gram law policy to 90% of the replay oracle on the long Spec-Bench prompts?

    ``controllers-gap``'s long-prompt workload (``--sample`` requests per category, prompts >= ``--min-prompt-tokens``):
    per round of the shipped law policy's replay, each signal's AUC for the rounds where drafting pays in hindsight;
    then candidates: the law's plan probabilities times a factor per level (suffix length x source span's state),
    fitted as accepted / expected drafts on ``--fit-sample`` shorter requests per category (held out: with the law
    refitted below ``--min-prompt-tokens``; in sample: on the long requests themselves), and that plus a plan at the
    request's own rate; shares of the oracle and paired intervals against the law policy and SGLang's EMA, and on the
    open-ended sets.

        OMP_NUM_THREADS=1 python bench/policy.py controllers-signals --out bench/results/policy-controllers-gap-long.txt

    Prints the two tables and ends with ONE JSON line.
    """
    from scipy.stats import spearmanr

    from entropy_law.decoding.controllers import AcceptLengthEMA
    from entropy_law.decoding.replay import round_outcomes
    from entropy_law.payoff.controllers import paired_ratio

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    t0, root = time.process_time(), Path(__file__).resolve().parents[1]
    shipped, curve, arm_meta, target = gap_setup(root, "ngram")
    below, config = policy_below(root, "ngram", args.min_prompt_tokens), arm_meta["drafter_config"]
    tree = arm_meta.get("tree_policy", "chain")
    spec = Path("data/traces/ngram")
    long = gap_requests(root, spec, arm_meta, target, "ngram", "spec_bench", args.sample, args.seed, args.min_prompt_tokens)
    fit = gap_requests(root, spec, arm_meta, target, "ngram", "spec_bench", args.fit_sample, args.seed, 0,
                       args.min_prompt_tokens)
    open_ = [r for w in OPEN_WORKLOADS for r in gap_requests(root, Path("data") / w, arm_meta, target, "ngram", None,
                                                             args.open_sample, args.seed)]

    def signal_rows(requests, law: dict) -> pd.DataFrame:  # the law's rounds, signals recorded, and in hindsight
        rows = []
        for r in requests:
            r = {**r, "table": round_outcomes(r["prompt"], r["output"], r["fresh"](), budgets=GAP_BUDGETS, tree=tree,
                                              **r["options"])}
            result, _ = replay_priced(r, SignalLaw(law, curve, config), arm_meta, curve, float(law["draft_cost"]))
            rows += gap_rows(r, result.rounds, curve, float(law["draft_cost"]))
        return pd.DataFrame(rows)

    def candidates(law: dict, scales: dict) -> dict:
        return {"law policy": lambda: LawPolicy(law, curve),
                "C1 span calibration": lambda: SignalLaw(law, curve, config, scales),
                "C2 C1 + plan at own rate": lambda: SignalLaw(law, curve, config, scales, rate_plan=True),
                "law + plan at own rate (ablation)": lambda: SignalLaw(law, curve, config, rate_plan=True)}

    def priced(requests, runs: dict) -> pd.DataFrame:  # runs: name -> (policy factory, its law's draft cost)
        out = []
        for r in requests:
            draft_cost = float(shipped["draft_cost"])
            best = oracle_rounds(r["prompt"], r["output"], r["fresh"](), budgets=GAP_BUDGETS, tree=tree,
                                 verify_cost=curve, draft_cost=draft_cost, **r["options"])
            out.append(("oracle", r["key"], sum(best.committed), len(best.committed), float(sum(best.cost))))
            for name, (make, cost) in {**runs, "SGLang EMA": (AcceptLengthEMA, draft_cost)}.items():
                out.append((name, r["key"], *replay_priced(r, make(), arm_meta, curve, cost)[1]))
        return pd.DataFrame(out, columns=["config", "request", "tokens", "rounds", "cost"])

    rows = signal_rows(long, shipped)
    pays, full = (rows["best"] > 0).to_numpy(), rows["full_accepted"].to_numpy()
    aucs = pd.DataFrame({label: {"AUC pays": auc(pays, x), "AUC acc>=1": auc(full >= 1, x), "AUC acc>=4": auc(full >= 4, x),
                                 "Spearman acc": spearmanr(x[np.isfinite(x)], full[np.isfinite(x)]).statistic}
                         for label, (column, sign) in SIGNALS.items()
                         for x in [rows[column].astype(float).to_numpy() * sign]}).T
    fit_rows = {"held out": signal_rows(fit, below), "open": signal_rows(fit, shipped)}
    scales = {"in sample": fit_scales(rows), **{k: fit_scales(v) for k, v in fit_rows.items()}}
    runs = {(how, name): (make, float(law["draft_cost"])) for how, law in (("in sample", shipped), ("held out", below))
            for name, make in candidates(law, scales[how]).items()}
    frames = {"long": priced(long, {f"{how}|{name}": v for (how, name), v in runs.items()}),
              "open": priced(open_, {f"open|{n}": (m, float(shipped["draft_cost"]))
                                     for n, m in candidates(shipped, scales["open"]).items() if "ablation" not in n})}
    table = {}
    for part, frame in frames.items():
        sums = frame.groupby("config", sort=False)[["tokens", "cost"]].sum()
        share = sums["tokens"] / sums["cost"] / (sums.loc["oracle", "tokens"] / sums.loc["oracle", "cost"])
        for config in share.index.drop(["oracle", "SGLang EMA"]):
            how, name = config.split("|")
            table.setdefault(name, {})[f"{how} share"] = round(share[config], 4)
            for other in ("law policy", "SGLang EMA"):
                if other != name and (how != "in sample" or other == "law policy"):
                    ratio = paired_ratio(frame, config, other if other == "SGLang EMA" else f"{how}|{other}",
                                         seed=args.seed)
                    table[name][f"{how} / {other.split()[0]}"] = "%.3f [%.3f, %.3f]" % ratio
    table = pd.DataFrame(table).T[[f"{how} {what}" for how in ("in sample", "held out", "open")
                                   for what in ("share", "/ law", "/ SGLang") if how != "in sample" or what != "/ SGLang"]]
    rates = {part: frame.groupby("config")[["tokens", "cost"]].sum().eval("tokens / cost").loc["oracle"]
             for part, frame in frames.items()}
    text = "\n".join([
        f"controllers-signals: n-gram DDTree16, {len(long)} Spec-Bench requests with prompts >= {args.min_prompt_tokens} "
        f"tokens ({args.sample} per category, seed {args.seed}); replay oracle {rates['long']:.4f}x; verify cost "
        f"{curve.describe()}", "",
        f"signals over the shipped law policy's {len(rows)} rounds ({pays.mean():.1%} pay in hindsight):",
        aucs.round(3).to_string(), "",
        f"candidates: share of the oracle's modelled speedup; paired request bootstrap intervals. Factors: in sample on "
        f"the long requests; held out: law refitted below {args.min_prompt_tokens} tokens, factors on {len(fit)} requests "
        f"under {args.min_prompt_tokens} ({args.fit_sample} per category); open-ended ({len(open_)} requests of "
        f"{len(OPEN_WORKLOADS)} sets, oracle {rates['open']:.4f}x): shipped law, factors as held out",
        table.fillna("").to_string()])
    text = text.replace(str(root) + "/", "")
    print(text)
    result = {"bench": "policy_controllers_signals", "requests": len(long), "fit_requests": len(fit),
              "open_requests": len(open_), "oracle": round(rates["long"], 4),
              "auc_pays": aucs["AUC pays"].round(3).to_dict(),
              "of_oracle": {n: {k: v for k, v in row.items() if k.endswith("share") and v == v} for n, row in table.iterrows()},
              "cpu_s": round(time.process_time() - t0, 1)}
    if args.out:
        header = (f"\n# controllers-signals: python bench/policy.py controllers-signals --sample {args.sample} --fit-sample "
                  f"{args.fit_sample} --open-sample {args.open_sample} --min-prompt-tokens {args.min_prompt_tokens} "
                  f"--seed {args.seed}\n{measured_line()}\n\n")
        with open(args.out, "a") as out:
            out.write(header + text + "\n\n" + json.dumps(result) + "\n")
    print(json.dumps(result))
    return result


COMMANDS = {  # subcommand: (adds its arguments, runs it)
    "policy": (policy_arguments, run_policy),
    "ceiling": (ceiling_arguments, run_ceiling),
    "replay": (replay_arguments, run_replay),
    "gate-vs-law": (gate_vs_law_arguments, run_gate_vs_law),
    "controllers": (controllers_arguments, run_controllers),
    "controllers-timed": (controllers_timed_arguments, run_controllers_timed),
    "controllers-loco": (controllers_loco_arguments, run_controllers_loco),
    "controllers-gap": (controllers_gap_arguments, run_controllers_gap),
    "controllers-signals": (signals_arguments, run_controllers_signals),
}


def main(argv=None):
    """Runs one subcommand with its arguments; returns what it returns."""
    return run_subcommand(__doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
