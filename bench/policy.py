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
  drafter whose own fitted law promises the higher rate, its cost included, or none: ``law.policy.hybrid_policy``);
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

The law policy's parameters are fitted here (``entropy_law.law.policy.fit_policy``) from the reference traces
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
then each law policy against its oracle twice: measured against modelled (the issue's reading) and modelled against
modelled (the policy's own rounds priced as the oracle prices its rounds: ``c(N + 1)`` plus the drafter's cost per
round it ran, no per-round overhead), measured against the oracle's modelled rate with the prefill priced in (each
prompt's prefill in one-token steps, from AR's reference decode of it: a measured speedup counts the prefill, which
every arm pays, and the decode-only model does not) and measured against the timed oracle (paired per request too),
then the cost model against the measurement for every drafting arm (its own rounds priced, with and without the
prefill, against its measured speedup: JSON ``cost_model``), then the goals, and ONE JSON line.

    OMP_NUM_THREADS=1 python bench/policy.py --limit 2 --max-new-tokens 128        # small
    OMP_NUM_THREADS=1 python bench/policy.py --limit 5 --max-new-tokens 256 --block # the issue's setting
    OMP_NUM_THREADS=1 python bench/policy.py --model gemma3-270m --no-chat-template --traces runs/gemma  # its own law
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from entropy_law.decoding.adapter import TargetAdapter  # noqa: E402
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder, measure_draft_cost  # noqa: E402
from entropy_law.decoding.gate import measure_verify_cost  # noqa: E402
from entropy_law.decoding.loading import load_target  # noqa: E402
from entropy_law.decoding.replay import HindsightPolicy, oracle_rounds  # noqa: E402
from entropy_law.drafters.block import BlockDrafter, default_drafter_path  # noqa: E402
from entropy_law.drafters.ngram import NgramDrafter  # noqa: E402
from entropy_law.jobs.record import prompt_encoder  # noqa: E402
from entropy_law.jobs.speed import ALL, decoder_arm, format_speedup, paired_speedups, print_progress, time_arms  # noqa: E402
from entropy_law.law.policy import borrow_policy, fit_policy, hybrid_policy  # noqa: E402
from entropy_law.prompts.paths import data_dir  # noqa: E402
from entropy_law.prompts.text import load_tasks, sample_per_category  # noqa: E402
from entropy_law.traces.layout import file_sha256  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402

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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
                             "policy (each round the drafter whose own fitted law pays more: law.policy.hybrid_policy)")
    parser.add_argument("--hybrid-skip", type=float, default=None, metavar="E",
                        help="with --hybrid: HybridDrafter(skip_block_at=E), the n-gram chain confidence at which the "
                             "block forward is skipped (0: whenever the n-gram proposes anything) (default: the "
                             "drafter's own default)")
    parser.add_argument("--context-match", action="store_true",
                        help="the law policies read the context's copyability before each round (fit_policy("
                             "context_match=): the law per level of the longest repeated suffix of the context)")
    parser.add_argument("--only", nargs="+", default=None, metavar="ARM", help="run only these arms (and AR)")
    parser.add_argument("--sets", nargs="+", default=["spec_bench", "open_ended"])
    args = parser.parse_args(argv)
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

    fixed = dict(min_expected_accepted=0.0)
    arms = {AR: ours(lambda: ARDecoder(target)),
            "ngram chain": ours(lambda: SpeculativeDecoder(target, ngram(), tree="chain", **fixed))}
    for n in FIXED_BUDGETS:
        arms[f"ngram ddtree{n}"] = ours(lambda n=n: SpeculativeDecoder(target, ngram(), tree="ddtree", budget=n,
                                                                       **fixed))
    arms["ngram ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, ngram(), tree="ddtree", budget=16,
                                                                       verify_cost=verify_cost))

    def law_variants(name, drafter):
        """The law policy of ``name`` as fitted, with its calibration never fading, and without calibration."""
        for arm, change in ((f"{name} law", {}), (f"{name} law {NO_FORGETTING}", {"calibration_half_life": None}),
                            (f"{name} law {UNCALIBRATED}", {"calibration_prior": None})):
            arms[arm] = ours(lambda change=change: SpeculativeDecoder(
                target, drafter(), tree="ddtree", budget=POLICY_MAX_NODES, verify_cost=verify_cost,
                policy={**laws[name], **change}))
    law_variants("ngram", ngram)
    if args.block:
        def block():
            return BlockDrafter.load(block_path, target, compute_dtype=args.compute_dtype)
        if args.block_fixed:
            arms["block chain"] = ours(lambda: SpeculativeDecoder(target, block(), tree="chain", **fixed))
            arms["block ddtree16"] = ours(lambda: SpeculativeDecoder(target, block(), tree="ddtree", budget=16,
                                                                     **fixed))
        arms["block ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, block(), tree="ddtree", budget=16,
                                                                           verify_cost=verify_cost))
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
                                                                            **fixed))
            arms[f"{label} ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(
                target, other(), tree="ddtree", budget=16, verify_cost=verify_cost))

    routes = Counter()  # the hybrid law's rounds by the drafter it ran ("none": declined)
    if args.hybrid:
        from entropy_law.drafters.hybrid import HybridDrafter

        def hybrid():
            skip = {} if args.hybrid_skip is None else {"skip_block_at": args.hybrid_skip}
            return HybridDrafter(NgramDrafter(), BlockDrafter.load(block_path, target,
                                                                   compute_dtype=args.compute_dtype), **skip)
        arms["hybrid ddtree16 cost gate"] = ours(lambda: SpeculativeDecoder(target, hybrid(), tree="ddtree", budget=16,
                                                                            verify_cost=verify_cost))
        # each round the drafter whose own law pays more (prompt lookup nearly free, the block forward not)
        routed = ours(lambda: SpeculativeDecoder(target, hybrid(), tree="ddtree", budget=POLICY_MAX_NODES,
                                                 verify_cost=verify_cost,
                                                 policy=hybrid_policy(laws["ngram"], laws["block"])))

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
                                                               budget=POLICY_MAX_NODES, verify_cost=verify_cost,
                                                               policy=policy))(prompt_ids, max_new_tokens)
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
    set_of = {t.request_id: t.dataset for t in tasks}  # each prompt set's own overall row (#19: "on Spec-Bench")
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
        # what can be measured (bench/aa_noise.py: AR against itself falls below 1.00 in about half the
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


if __name__ == "__main__":
    main()
