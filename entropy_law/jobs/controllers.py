"""The law policy against the controllers engines ship: every one replayed over the same recorded requests.

``replay_controllers`` replays, over each request of a workload run (its greedy output; the drafter of a drafting
arm), the field's controllers (``decoding.controllers``), our law policy and its stop-probability ablation, fixed
trees, the cost gate and the replay oracle, and prices each round by one verify-cost curve: one row per
(configuration, request) for ``payoff.controllers.controller_table``. Replay makes the decoder's own rounds
(``tests/test_controllers.py``), so nothing here is timed: the speedups are modelled.

The per-workload draft length (vLLM's, ``WorkloadLength``) is chosen from the per-position acceptance profile of the
other requests: the requests are split into two seeded folds and each is decided by the other fold's profile (of its
category, else of the whole fold), measured on the fixed tree's replayed rounds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Collection

import numpy as np
import pandas as pd

from entropy_law.decoding.controllers import (BEFORE_DRAFTING, BEFORE_VERIFYING, AcceptLengthEMA,
                                              ConfidenceThreshold, DrafterEntropyStop, EntropyGate,
                                              LawStopProbability, WorkloadLength, profile_length)
from entropy_law.decoding.gate import CostGate, RatioGate, VerifyCost
from entropy_law.decoding.policy import LawPolicy
from entropy_law.decoding.replay import oracle_rounds, replay_rounds
from entropy_law.jobs.reference import decoded_requests, replay_drafter, workload_inputs
from entropy_law.payoff.controllers import ORACLE
from entropy_law.traces.reader import load_traces

LAW = "law policy"
STOP = "law stop-probability (SpecDec++-style ablation of ours)"
GATE = "cost gate (ours: drafter's confidences)"
VLLM = "vLLM per-workload length (other fold's profile)"
HINDSIGHT, NONE = "hindsight (the round's outcome)", "none (fixed)"
FIXED_BUDGETS = (4, 8, 16)
ORACLE_BUDGETS = (0, 1, 2, 4, 8, 16)


def field_controllers(law_params: dict, curve: VerifyCost, drafter_id: str) -> dict:
    """name -> (a factory of the round policy, the information it reads): the field's controllers, the law policy
    and its ablation. AdaEDL only for a drafter with a distribution (not the n-gram drafter)."""
    out = {"transformers confidence threshold (0.4, ROC refit)": (ConfidenceThreshold, BEFORE_VERIFYING),
           "SGLang accept-length EMA (tiers 1/3/7)": (AcceptLengthEMA, BEFORE_DRAFTING),
           "entropy gate k or 0 (on 1.0, off 2.0 nats)": (EntropyGate, BEFORE_DRAFTING),
           LAW: (lambda: LawPolicy(law_params, curve), BEFORE_VERIFYING),
           STOP: (lambda: LawStopProbability(law_params, curve), BEFORE_VERIFYING),
           GATE: (lambda: CostGate(curve), BEFORE_VERIFYING)}
    if drafter_id != "ngram":
        out["AdaEDL drafter-entropy stop (gamma 0.2)"] = (DrafterEntropyStop, BEFORE_VERIFYING)
    return out


def is_field(config: str) -> bool:
    """Whether a configuration is one of the field's controllers (not ours, a fixed tree or the oracle)."""
    return config not in (LAW, STOP, GATE, ORACLE) and not config.startswith("fixed ")


def _priced(result, curve: VerifyCost, draft_cost: float) -> tuple[int, int, float]:
    """(tokens after the prefill, decode rounds, modelled cost) of a replay: ``c(nodes + 1)`` per round, plus the
    drafter's cost where it was called (a round policy's ``"draft"``; a gate always calls it)."""
    rounds = [r for r in result.rounds if r.round_index > 0]
    cost = sum(curve(r.tree_nodes + 1) + (draft_cost if r.policy is None or r.policy.get("draft", True) else 0.0)
               for r in rounds)
    return sum(r.committed for r in rounds), len(rounds), float(cost)


def acceptance_profile(rounds: list) -> list[float]:
    """vLLM's per-position acceptance: accepted drafts at position i per drafting round."""
    drafting = [r.accepted for r in rounds if r.tree_nodes > 0]
    depth = max(drafting, default=0)
    return [sum(a >= i for a in drafting) / len(drafting) for i in range(1, depth + 1)] if drafting else []


def replay_controllers(workload_dir: str | Path, arm_meta: dict, target, law_params: dict, curve: VerifyCost, *,
                       requests: Collection[str] | None = None, seed: int = 0, workload: str = "",
                       tasks: str | None = None) -> pd.DataFrame:
    """Every configuration replayed over each request of ``workload_dir`` (its greedy outputs) with the drafter and
    tree of ``arm_meta`` (a drafting arm's ``run.json``), priced by ``curve`` plus the law's ``draft_cost`` per
    drafter call. Rows as ``payoff.controllers.ROW_COLUMNS`` (``request``: ``workload:request_id``). ``tasks``: the
    prompts' task file where the run's run.json names none."""
    meta, drafter, plain, prompts, outputs = workload_inputs(workload_dir, arm_meta, target, tasks, None)
    tree, budget = arm_meta.get("tree_policy", "chain"), arm_meta.get("tree_budget")
    draft_cost = float(law_params["draft_cost"])
    options = dict(eos_token_ids=plain.config["eos_token_ids"], max_new_tokens=meta.get("max_new_tokens"),
                   max_context=plain.adapter.max_context)
    tokens = load_traces(workload_dir).tokens.sort_values(["request_id", "position"])
    entropies = {str(rid): g["target_entropy_nats"].to_numpy(float) for rid, g in tokens.groupby("request_id")}
    controllers = field_controllers(law_params, curve, arm_meta.get("drafter_id"))
    decoded = list(decoded_requests(outputs, requests))
    fold = dict(zip([rid for rid, _, _ in decoded], np.random.default_rng(seed).permutation(len(decoded)) % 2))
    rows, profiles, sources = [], {}, {}
    for rid, category, output in decoded:
        source = replay_drafter(drafter, target, prompts[rid], output)
        fresh = (lambda s=source: copy.deepcopy(s)) if arm_meta.get("drafter_id") == "ngram" else (lambda s=source: s)
        sources[rid] = (category, output, fresh)

        def replay(policy, name, information, n=budget):
            result = replay_rounds(prompts[rid], output, fresh(), tree, n, policy=policy, verify_cost=curve,
                                   entropies=entropies.get(str(rid)), category=category, **options)
            rows.append((name, information, category, f"{workload}:{rid}", *_priced(result, curve, draft_cost)))
            return result

        for n in FIXED_BUDGETS:
            result = replay(RatioGate(min_expected_accepted=0.0), f"fixed {tree} {n} (every round)", NONE, n)
            if n == max(FIXED_BUDGETS):
                profiles[rid] = result.rounds[1:]
        for name, (make, information) in controllers.items():
            replay(make(), name, information)
        oracle = oracle_rounds(prompts[rid], output, fresh(), budgets=ORACLE_BUDGETS, tree=tree, verify_cost=curve,
                               draft_cost=draft_cost, **options)
        rows.append((ORACLE, HINDSIGHT, category, f"{workload}:{rid}", sum(oracle.committed), len(oracle.committed),
                     float(sum(oracle.cost))))
    for rid, (category, output, fresh) in sources.items():  # vLLM's length from the other fold's profile
        other = [r for o, rounds in profiles.items() if fold[o] != fold[rid] for r in rounds
                 if sources[o][0] == category] or [r for o, rs in profiles.items() if fold[o] != fold[rid] for r in rs]
        length = profile_length(acceptance_profile(other), curve, draft_cost)
        result = replay_rounds(prompts[rid], output, fresh(), tree, budget, policy=WorkloadLength({}, length),
                               verify_cost=curve, category=category, **options)
        rows.append((VLLM, BEFORE_DRAFTING, category,
                     f"{workload}:{rid}", *_priced(result, curve, draft_cost)))
    return pd.DataFrame(rows, columns=["config", "information", "category", "request", "tokens", "rounds", "cost"])
