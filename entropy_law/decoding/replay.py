"""Offline replay: target statistics and speculative rounds from a prompt and its greedy output.

One teacher-forced target pass gives the logits at every output position; ``replay_rounds`` plays the decoder's
own round (``round.play_round``) with the greedy output as the correct tokens. Replayed rounds report 0 ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import pandas as pd
import torch

from entropy_law.decoding.gate import RatioGate, VerifyCost, make_gate
from entropy_law.decoding.interface import DraftProposal, Drafter, drafter_run_config
from entropy_law.decoding.loading import model_of
from entropy_law.decoding.observers import distribution_stats
from entropy_law.decoding.policy import HybridLawPolicy, LawPolicy, check_policy, make_policy
from entropy_law.decoding.round import (DEFAULT_VERIFY_COST_RATIO, Observer, RequestState, Round, RoundRules,
                                        eos_set, play_round, policy_config, prefill_round)
from entropy_law.decoding.tree import Tree, build_tree
from entropy_law.traces.stats import TARGET_STAT_KEYS

TARGET_STAT_COLUMNS = tuple(f"target_{key}" for key in TARGET_STAT_KEYS)

@torch.no_grad()
def teacher_forced_logits(target, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
    """``[len(output_ids), V]`` fp32: row i is the target's logit row after prompt + output[:i] (one forward)."""
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids:
        raise ValueError("empty prompt: the first output token needs at least one prompt token")
    if not output_ids:
        raise ValueError("empty output: nothing to replay")
    model = model_of(target)
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids + output_ids[:-1]], dtype=torch.long, device=device)
    out = model(input_ids=input_ids, use_cache=False, logits_to_keep=len(output_ids))
    logits = out.logits[0, -len(output_ids):].float()
    if logits.shape[0] != len(output_ids):
        raise RuntimeError(f"expected {len(output_ids)} logit rows, got {logits.shape[0]}")
    return logits.cpu()


def target_stats(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row ``observers.distribution_stats`` under the trace column names (``target_entropy_nats`` ...)."""
    stats = distribution_stats(logits)
    return {f"target_{key}": value for key, value in stats.items()}


def teacher_forced_target_stats(target, prompt_ids: Sequence[int], output_ids: Sequence[int], *,
                                logits: torch.Tensor | None = None) -> pd.DataFrame:
    """One row per output position: ``position``, ``token_id``, ``target_argmax``, ``is_greedy`` and the target
    statistics that produced that token (``TARGET_STAT_COLUMNS``). ``logits`` given: no forward pass."""
    if logits is None:
        logits = teacher_forced_logits(target, prompt_ids, output_ids)
    stats = target_stats(logits)
    argmax = logits.argmax(dim=-1)
    frame = pd.DataFrame({
        "position": range(len(output_ids)),
        "token_id": [int(t) for t in output_ids],
        "target_argmax": argmax.tolist(),
    })
    frame["is_greedy"] = frame["token_id"] == frame["target_argmax"]
    for column in TARGET_STAT_COLUMNS:
        frame[column] = stats[column].numpy()
    return frame

@dataclass
class ReplayResult:
    """Rounds of one replayed request, with the proposals and trees behind them."""

    prompt_ids: list[int]
    output_ids: list[int]
    rounds: list[Round]  # bare records
    proposals: list[DraftProposal | None]  # the proposal each round verified (None: no draft)
    trees: list[Tree]
    stop_reason: str
    config: dict = field(default_factory=dict)

    @property
    def accepted_lengths(self) -> list[int]:  # tau of every round after the prefill
        return [r.accepted for r in self.rounds if r.round_index > 0]

    @property
    def mean_committed_per_round(self) -> float:
        decode_rounds = [r for r in self.rounds if r.round_index > 0]
        return sum(r.committed for r in decode_rounds) / len(decode_rounds) if decode_rounds else float("nan")

    def round_proposals(self) -> pd.DataFrame:
        """The proposal of every round that verified a draft, in ``replay_proposals``' columns plus ``round_index``."""
        rows = []
        for record, proposal, tree in zip(self.rounds, self.proposals, self.trees):
            if proposal is None or tree.n_nodes == 0:
                continue
            depth = tree.max_depth
            rows += [(record.round_index, record.start_position, depth, d, p)
                     for d, p in enumerate(proposal_top1(proposal, depth), start=1)]
        frame = pd.DataFrame(rows, columns=["round_index", *PROPOSAL_COLUMNS])
        return frame.astype({"round_index": "int32", "start_position": "int32", "proposal_depth": "int16",
                             "depth": "int16", "top1_prob": "float32"})

    @property
    def summary(self) -> pd.DataFrame:  # one row per round
        rows = []
        for r in self.rounds:
            row = {key: value for key, value in asdict(r).items() if key not in ("draft", "target_logits")}
            row["committed_ids"] = list(r.committed_ids)
            row["committed"] = r.committed
            rows.append(row)
        return pd.DataFrame(rows)


def replay_rounds(prompt_ids: Sequence[int], output_ids: Sequence[int], drafter: Drafter,
                  tree: str | Callable[[DraftProposal, int | None], Tree] = "chain", budget: int | None = None, *,
                  eos_token_ids: Sequence[int] | int | None = None, max_new_tokens: int | None = None,
                  max_context: int | None = None, verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO,
                  min_expected_accepted: float | None = None, verify_cost: VerifyCost | None = None,
                  should_draft: Callable[[DraftProposal, Tree], bool] | None = None, policy=None,
                  entropies: Sequence[float] | None = None, category: str = "", dataset: str = "") -> ReplayResult:
    """Simulate the decoder's rounds on a known greedy output (``output_ids``: the new tokens, ending with EOS or at
    ``max_new_tokens``, default their number) with a context-only ``drafter``. The gate settings build the gate as
    ``gate.make_gate``; ``policy`` (a ``RoundPolicy`` or law parameters) replaces them, a law policy reading the
    target entropy per output position from ``entropies``. ``category`` / ``dataset``: the workload it sees."""
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids:
        raise ValueError("empty prompt")
    if not output_ids:
        raise ValueError("empty output: the prefill always commits one token")
    if policy is not None:
        policy = make_policy(policy, verify_cost, drafter)
    else:
        policy = make_gate(verify_cost_ratio=verify_cost_ratio, min_expected_accepted=min_expected_accepted,
                           verify_cost=verify_cost, should_draft=should_draft)
    if isinstance(policy, (LawPolicy, HybridLawPolicy)):
        check_policy(policy, drafter, None)
    rules = RoundRules.make(tree, budget, eos_token_ids=eos_token_ids, max_context=max_context,
                            policy=policy.bind(None, drafter) if callable(getattr(policy, "bind", None)) else policy)
    max_new = len(output_ids) if max_new_tokens is None else int(max_new_tokens)
    if len(output_ids) > max_new:
        raise ValueError(f"output has {len(output_ids)} tokens, more than max_new_tokens={max_new}")
    _check_no_early_eos(output_ids, rules.eos_token_ids)
    drafter.begin(prompt_ids, None)
    state = RequestState(prompt_ids=prompt_ids, max_new_tokens=max_new, output=output_ids[:1], start=len(prompt_ids),
                         block_size=int(getattr(drafter, "block_size", 1)), category=category, dataset=dataset)
    rules.policy.begin_request(state)
    if entropies is not None:
        if len(entropies) != len(output_ids):
            raise ValueError(f"entropies has {len(entropies)} values for {len(output_ids)} output tokens")
        state.entropies = [float(h) for h in entropies]
    proposals, trees, stop = _play_recorded(state, rules, drafter, output_ids, max_new)
    if len(state.output) != len(output_ids):
        raise ValueError(f"decoding would stop ({stop}) after {len(state.output)} tokens but the output has "
                         f"{len(output_ids)}: pass the eos_token_ids / max_new_tokens it was decoded with")
    config = _replay_config(drafter, tree, budget, rules, max_new, max_context)
    return ReplayResult(prompt_ids=prompt_ids, output_ids=output_ids, rounds=state.rounds, proposals=proposals,
                        trees=trees, stop_reason=stop, config=config)


def _play_recorded(state: RequestState, rules: RoundRules, drafter: Drafter, output_ids: list[int], max_new: int):
    """Play the prefill and every round against the recorded output: the proposals, trees and stop reason."""
    state.rounds.append(prefill_round(state))
    proposals: list[DraftProposal | None] = [None]
    trees: list[Tree] = [Tree.empty()]
    recorded = _RecordedOutput(output_ids)
    stop = rules.stop_reason(state)
    while stop is None:
        if len(state.output) >= len(output_ids):
            raise ValueError(f"the output ends after {len(output_ids)} tokens without EOS, before "
                             f"max_new_tokens={max_new} and a full context: it is not a complete greedy output")
        record = play_round(state, rules, lambda tokens: drafter.propose(tokens, None), recorded, timed=False)
        state.rounds.append(record.bare())
        proposals.append(record.draft)
        trees.append(recorded.tree)
        stop = rules.stop_reason(state)
    return proposals, trees, stop


def _replay_config(drafter: Drafter, tree, budget, rules: RoundRules, max_new: int, max_context) -> dict:
    """The replayed run's settings, as a recorded run's ``run.json`` holds them."""
    return {"drafter_id": getattr(drafter, "drafter_id", type(drafter).__name__),
            "drafter_config": drafter_run_config(drafter),
            "tree_policy": tree if isinstance(tree, str) else repr(tree), "budget": budget,
            **policy_config(rules.policy), "eos_token_ids": sorted(rules.eos_token_ids), "max_new_tokens": max_new,
            "max_context": max_context, "replayed": True}


def _check_no_early_eos(output_ids: list[int], eos_token_ids) -> None:
    early_eos = [i for i, t in enumerate(output_ids[:-1]) if t in eos_token_ids]
    if early_eos:
        raise ValueError(f"output has EOS at position {early_eos[0]} before its end; greedy decoding stops there")


class _RecordedOutput:
    """The offline source of correct tokens: the recorded greedy output's next token. Nothing to commit."""

    def __init__(self, output_ids: list[int]):
        self.output_ids = output_ids
        self.tree = Tree.empty()

    def verify(self, state: RequestState, tree: Tree):
        self.tree, n_out, output = tree, len(state.output), self.output_ids
        return lambda node, depth: output[n_out + depth] if n_out + depth < len(output) else None

    def commit(self, state: RequestState, kept_nodes: list[int]) -> None:
        return None


@dataclass
class OracleResult:
    """The hindsight-best budget of every round of one replayed request (``oracle_rounds``)."""

    budgets: list[int]  # the verified budget of each decode round (0: a plain step)
    committed: list[int]  # tokens committed by each decode round
    cost: list[float]  # its modelled cost in one-token forwards: c(N + 1), plus the drafter's cost when it drafted
    accepted: list[int] = field(default_factory=list)  # drafts accepted by each decode round

    @property
    def tokens_per_round(self) -> float:
        return sum(self.committed) / len(self.committed) if self.committed else float("nan")

    @property
    def modelled_speedup(self) -> float:
        """Committed tokens per unit of modelled cost: the rate over AR (1 token per one-token forward)."""
        return sum(self.committed) / sum(self.cost) if self.cost else float("nan")


def oracle_rounds(prompt_ids: Sequence[int], output_ids: Sequence[int], drafter: Drafter, *,
                  budgets: Sequence[int] = (0, 1, 2, 4, 8, 16, 32), tree: str = "ddtree",
                  verify_cost: VerifyCost, draft_cost: float = 0.0, eos_token_ids=None,
                  max_new_tokens: int | None = None, max_context: int | None = None) -> OracleResult:
    """The replay oracle: each round, in hindsight, the budget ``N`` in ``budgets`` (0: no draft) whose round commits
    the most tokens per modelled cost ``c(N + 1) (+ draft_cost)`` (greedy per round). Context-only drafters."""
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids or not output_ids:
        raise ValueError("the oracle needs a prompt and a non-empty greedy output")
    budgets, rules, plain = _budget_rules(budgets, tree, eos_token_ids, max_context)
    max_new = len(output_ids) if max_new_tokens is None else int(max_new_tokens)
    drafter.begin(prompt_ids, None)
    state = RequestState(prompt_ids=prompt_ids, max_new_tokens=max_new, output=output_ids[:1],
                         start=len(prompt_ids), block_size=int(getattr(drafter, "block_size", 1)))
    recorded = _RecordedOutput(output_ids)
    result = OracleResult([], [], [])
    while plain.stop_reason(state) is None:
        if len(state.output) >= len(output_ids):
            raise ValueError("the output ends without EOS before max_new_tokens: not a complete greedy output")
        best = None
        for n, record, trial in _budget_trials(state, drafter, budgets, rules, plain, recorded):
            cost = verify_cost(record.tree_nodes + 1) + (draft_cost if n > 0 else 0.0)
            if best is None or record.committed / cost > best[0] + 1e-12:
                best = (record.committed / cost, n, record, trial, cost)
        _, n, record, trial, cost = best
        state.output, state.start = trial.output, trial.start
        result.budgets.append(record.tree_nodes)
        result.committed.append(record.committed)
        result.cost.append(cost)
        result.accepted.append(record.accepted)
    return result


class HindsightPolicy:
    """The replay oracle of one request (its greedy ``output_ids`` and ``oracle_rounds``' ``oracle``) as a round
    policy, so its rounds run on the target and are timed: the drafter runs unless the oracle's round here was a
    plain step, then ``oracle_rounds``' rule picks the budget. ``decision["scheduled"]``: the oracle's budget here."""

    def __init__(self, output_ids: Sequence[int], oracle: OracleResult, *, verify_cost: VerifyCost,
                 draft_cost: float = 0.0, budgets: Sequence[int] = (0, 1, 2, 4, 8, 16, 32), tree: str = "ddtree",
                 max_new_tokens: int | None = None):
        self.output_ids = [int(t) for t in output_ids]
        if not self.output_ids:
            raise ValueError("the hindsight policy needs the request's non-empty greedy output")
        self.budgets = sorted({int(b) for b in budgets})
        if self.budgets[0] < 0:
            raise ValueError(f"budgets must be >= 0, got {self.budgets}")
        self.verify_cost, self.draft_cost, self.tree = verify_cost, float(draft_cost), tree
        self.max_new_tokens = len(self.output_ids) if max_new_tokens is None else int(max_new_tokens)
        self.schedule, position = {}, 1  # the oracle's budget from each output position a round of it started at
        for budget, committed in zip(oracle.budgets, oracle.committed):
            self.schedule[position] = int(budget)
            position += int(committed)

    def bind(self, adapter, drafter) -> "HindsightPolicy":
        return self

    def begin_request(self, state: RequestState) -> None:
        """Nothing to reset: the policy serves the one request whose output it was given."""

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        scheduled = self.schedule.get(int(n_output))
        return {"draft": scheduled is None or scheduled > 0, "scheduled": scheduled, "position": int(n_output)}

    def _committed(self, tree: Tree, position: int) -> int:
        """Tokens a round verifying ``tree`` from ``position`` commits of the known output (the bonus included)."""
        node, depth = 0, 0
        while position + depth < len(self.output_ids) and self.output_ids[position + depth] in tree.children[node]:
            node = tree.children[node][self.output_ids[position + depth]]
            depth += 1
        return max(0, min(depth + 1, len(self.output_ids) - position, self.max_new_tokens - position))

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        position, best = decision["position"], None
        for n in self.budgets:
            candidate = build_tree(proposal, self.tree, n) if n > 0 else Tree.empty()
            cost = self.verify_cost(candidate.n_nodes + 1) + (self.draft_cost if n > 0 else 0.0)
            rate = self._committed(candidate, position) / cost
            if best is None or rate > best[0] + 1e-12:
                best = (rate, candidate)
        chosen = best[1]
        decision.update(budget=chosen.n_nodes, expected=float(self._committed(chosen, position) - 1))
        return (chosen, decision["expected"]) if chosen.n_nodes else (Tree.empty(), 0.0)

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """Nothing to track: the policy reads the known output, not the target's entropies."""

    def to_config(self) -> dict:
        return {"kind": "hindsight oracle", "budgets": list(self.budgets), "draft_cost": self.draft_cost,
                "tree": self.tree, "verify_cost": self.verify_cost.to_config()}


def _budget_rules(budgets: Sequence[int], tree: str, eos_token_ids, max_context: int | None):
    """(budgets sorted and checked, each drafting budget's ungated ``RoundRules``, the plain step's)."""
    budgets = sorted({int(b) for b in budgets})
    if budgets[0] < 0:
        raise ValueError(f"budgets must be >= 0, got {budgets}")
    eos = eos_set(eos_token_ids)
    rules = {n: RoundRules.make(tree, n, eos_token_ids=eos, max_context=max_context,
                                policy=RatioGate(min_expected_accepted=0.0)) for n in budgets if n > 0}
    return budgets, rules, RoundRules.make("chain", None, drafting=False, eos_token_ids=eos, max_context=max_context)


def _budget_trials(state: RequestState, drafter: Drafter, budgets: Sequence[int], rules: dict, plain: RoundRules,
                   recorded: "_RecordedOutput") -> list[tuple[int, Round, RequestState]]:
    """``[(budget, record, state after it)]``: each budget's round from a copy of ``state``, from one proposal."""
    proposal = drafter.propose(state.prompt_ids + state.output, None)
    out = []
    for n in budgets:
        trial = RequestState(prompt_ids=state.prompt_ids, max_new_tokens=state.max_new_tokens,
                             output=list(state.output), start=state.start, block_size=state.block_size)
        record = play_round(trial, rules.get(n, plain), lambda tokens: proposal if n > 0 else None, recorded,
                            timed=False)
        out.append((n, record, trial))
    return out


OUTCOME_COLUMNS = ("start_position", "budget", "tree_nodes", "accepted", "committed", "expected_accepted")


def round_outcomes(prompt_ids: Sequence[int], output_ids: Sequence[int], drafter: Drafter, *,
                   budgets: Sequence[int] = (0, 1, 2, 4, 8, 16), tree: str = "ddtree", eos_token_ids=None,
                   max_new_tokens: int | None = None, max_context: int | None = None) -> pd.DataFrame:
    """What a round of each budget would do from EVERY output position of a known greedy output: one row per
    (start ``s``, budget ``N``; 0: a plain step), every drafted node verified, with ``tree_nodes``, ``accepted``,
    ``committed`` and the drafter's surrogate ``expected_accepted``. Context-only drafters; see ``walk_outcomes``."""
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids or not output_ids:
        raise ValueError("round_outcomes needs a prompt and a non-empty greedy output")
    budgets, rules, plain = _budget_rules(budgets, tree, eos_token_ids, max_context)
    max_new = len(output_ids) if max_new_tokens is None else int(max_new_tokens)
    _check_no_early_eos(output_ids, plain.eos_token_ids)
    drafter.begin(prompt_ids, None)
    recorded = _RecordedOutput(output_ids)
    rows = []
    for s in range(1, len(output_ids) + 1):
        state = RequestState(prompt_ids=prompt_ids, max_new_tokens=max_new, output=output_ids[:s],
                             start=len(prompt_ids) + s - 1, block_size=int(getattr(drafter, "block_size", 1)))
        if plain.stop_reason(state) is not None:
            break
        if s == len(output_ids):
            raise ValueError("the output ends without EOS before max_new_tokens: not a complete greedy output")
        rows += [(s, n, r.tree_nodes, r.accepted, r.committed, float(r.expected_accepted))
                 for n, r, _ in _budget_trials(state, drafter, budgets, rules, plain, recorded)]
    frame = pd.DataFrame(rows, columns=list(OUTCOME_COLUMNS))
    return frame.astype({"start_position": "int32", "budget": "int16", "tree_nodes": "int16", "accepted": "int16",
                         "committed": "int16", "expected_accepted": "float64"})


def walk_outcomes(outcomes: pd.DataFrame, choose: Callable[[pd.DataFrame], int]) -> pd.DataFrame:
    """The rows a policy plays over one request's ``round_outcomes``: from start 1, ``choose(rows)`` (that start's
    rows, indexed by budget) names the budget; the next round starts where that one ends."""
    by_start = {int(s): part.set_index("budget") for s, part in outcomes.groupby("start_position", sort=True)}
    chosen, s = [], 1
    while s in by_start:
        rows = by_start[s]
        n = int(choose(rows))
        if n not in rows.index:
            raise ValueError(f"choose named budget {n}, not one of the table's {sorted(rows.index.tolist())}")
        row = rows.loc[n]
        chosen.append({"start_position": s, "budget": n, **{c: row[c] for c in OUTCOME_COLUMNS[2:]}})
        s += int(row["committed"])
    return pd.DataFrame(chosen, columns=list(OUTCOME_COLUMNS))


PROPOSAL_COLUMNS = ("start_position", "proposal_depth", "depth", "top1_prob")


def proposal_top1(proposal: DraftProposal, depth: int) -> list[float]:
    """The drafter's probability of its own top proposal at depths 1 .. ``depth`` (``draft_top1_prob``)."""
    if proposal.logits is not None:
        return torch.softmax(proposal.logits[:depth].float(), dim=-1).amax(dim=-1).tolist()
    return proposal.logprobs[:depth].float().amax(dim=-1).exp().tolist()


def replay_proposals(prompt_ids: Sequence[int], output_ids: Sequence[int], drafter: Drafter,
                     tree: str | Callable = "chain", budget: int | None = None, *, eos_token_ids=None,
                     max_new_tokens: int | None = None, max_context: int | None = None,
                     min_expected_accepted: float = 0.0) -> pd.DataFrame:
    """The drafter's proposal for a round starting at EVERY output position ``s`` = 1 .. T-1 of a complete greedy
    output (``law.transfer``'s depths ``"replayed"``; context-only drafters): a row per drafted depth ``d`` of the
    tree the policy picks, with ``top1_prob`` (``proposal_top1``); nothing drafted: one row of depth 0, null
    ``top1_prob``. ``min_expected_accepted``: the ratio gate's threshold (``run_gate_threshold``; 0: none)."""
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids or not output_ids:
        raise ValueError("replay_proposals needs a prompt and a non-empty greedy output")
    rules = RoundRules.make(tree, budget, eos_token_ids=eos_token_ids, max_context=max_context,
                            policy=RatioGate(min_expected_accepted=float(min_expected_accepted)))
    max_new = len(output_ids) if max_new_tokens is None else int(max_new_tokens)
    _check_no_early_eos(output_ids, rules.eos_token_ids)
    drafter.begin(prompt_ids, None)
    rows = []
    for s in range(1, min(len(output_ids), max_new)):
        state_start = len(prompt_ids) + s - 1  # cache length with the root pending
        proposal = drafter.propose(prompt_ids + output_ids[:s], None)
        verified, proposal, _ = rules.plan_tree(proposal, state_start, max_new - s)
        if proposal is None or verified.n_nodes == 0:
            rows.append((s, 0, 0, float("nan")))
            continue
        depth = verified.max_depth
        rows += [(s, depth, d, float(p)) for d, p in enumerate(proposal_top1(proposal, depth), start=1)]
    frame = pd.DataFrame(rows, columns=list(PROPOSAL_COLUMNS))
    return frame.astype({"start_position": "int32", "proposal_depth": "int16", "depth": "int16",
                         "top1_prob": "float32"})


def replay_request(target, prompt_ids: Sequence[int], output_ids: Sequence[int], drafter: Drafter,
                   tree: str | Callable = "chain", budget: int | None = None, *, observers: Sequence[Observer] = (),
                   request_id: str = "replay", category: str = "", dataset: str = "", question_id: str = "",
                   image_tokens: int = 0, logits: torch.Tensor | None = None, **round_options) -> ReplayResult:
    """``replay_rounds`` handed to observers as the decoder would, with ``target_logits`` from one teacher-forced
    pass (or ``logits``), 0 ms timings and ``replayed=True`` (see ``replay_run_metadata``)."""
    result = replay_rounds(prompt_ids, output_ids, drafter, tree, budget, category=category, dataset=dataset,
                           **round_options)
    if logits is None:
        logits = teacher_forced_logits(target, prompt_ids, output_ids)
    if logits.shape[0] != len(result.output_ids):
        raise ValueError(f"logits have {logits.shape[0]} rows for {len(result.output_ids)} output tokens")
    info = {"category": category, "dataset": dataset, "question_id": question_id,
            "prompt_tokens": len(result.prompt_ids), "prompt_ids": [int(t) for t in result.prompt_ids],
            "image_tokens": image_tokens, "config": result.config}
    for obs in observers:
        obs.on_request_start(request_id, info)
    for r, proposal in zip(result.rounds, result.proposals):
        record = replace(r, request_id=request_id, replayed=True, draft=proposal,
                         target_logits=logits[r.start_position:r.start_position + r.committed])
        for obs in observers:
            obs.on_round(record)
    end_info = {"new_tokens": len(result.output_ids), "stop_reason": result.stop_reason,
                "prefill_ms": 0.0, "decode_ms": 0.0}
    for obs in observers:
        obs.on_request_end(request_id, end_info)
    return result


def replay_run_metadata(drafter: Drafter, tree: str, budget: int | None, **extra) -> dict:
    """Run metadata for a ``TraceRecorder`` that receives replayed rounds (``replayed=True``)."""
    return {"drafter_id": getattr(drafter, "drafter_id", type(drafter).__name__),
            "drafter_config": drafter_run_config(drafter),
            "tree_policy": tree if isinstance(tree, str) else repr(tree),
            "tree_budget": budget, "replayed": True, **extra}

class PrecomputedBlockDrafter:
    """A ``Drafter`` for ``replay_rounds``: the block drafter's proposals at every anchor of one known sequence from
    one ``block_logits`` pass, equal (up to float noise) to the live drafter's at anchor ``len(tokens) - 1``."""

    feature_layers: tuple[int, ...] = ()  # replay passes no features; they are precomputed

    def __init__(self, drafter, prompt_ids: Sequence[int], output_ids: Sequence[int], features: torch.Tensor,
                 *, chunk: int = 64):
        self.drafter = drafter
        self.drafter_id = drafter.drafter_id
        self.block_size = drafter.block_size
        self.config = dict(drafter.config)
        self.provenance = dict(getattr(drafter, "provenance", {}) or {})  # its checkpoint, as the live one's
        self.sequence = [int(t) for t in prompt_ids] + [int(t) for t in output_ids]
        self.prompt_len = len(prompt_ids)
        s = len(self.sequence)
        if features.shape[0] < s - 1:
            raise ValueError(f"need features for positions 0..{s - 2}, got {features.shape[0]} rows")
        anchors = list(range(self.prompt_len, s))
        ids = torch.tensor([self.sequence])
        feats = features[None, : s - 1].float()  # anchor s-1 needs features 0..s-2; chunked to bound memory
        self.vocab = drafter.sequence_vocab(ids)
        rows = []
        with torch.no_grad():
            for lo in range(0, len(anchors), chunk):
                a = torch.tensor([anchors[lo: lo + chunk]])
                rows.append(drafter.block_logits(ids, feats, a, vocab=self.vocab)[0])
        self.logits = torch.cat(rows)  # [n_anchors, B-1, Vd]

    def begin(self, prompt_ids, prompt_features) -> None:
        if [int(t) for t in prompt_ids] != self.sequence[: self.prompt_len]:
            raise ValueError("replay prompt differs from the precomputed sequence's prompt")

    def propose(self, tokens, new_features) -> DraftProposal:
        n = len(tokens)
        if n <= self.prompt_len or [int(t) for t in tokens] != self.sequence[:n]:
            raise ValueError("tokens are not a prefix of the precomputed sequence beyond its prompt")
        return self.drafter.proposal_from_logits(self.logits[n - 1 - self.prompt_len], self.vocab)

    def chain_accepted(self) -> list[int]:
        """Accepted chain drafts if a round started at each anchor ``prompt_len .. len(sequence) - 2``."""
        drafts = self.drafter.draft_tokens(self.logits.argmax(-1), self.vocab).tolist()  # [n_anchors, B-1]
        accepted = []
        for anchor in range(self.prompt_len, len(self.sequence) - 1):
            following = self.sequence[anchor + 1:]
            tau = 0
            for draft, token in zip(drafts[anchor - self.prompt_len], following):
                if draft != token:
                    break
                tau += 1
            accepted.append(tau)
        return accepted


@dataclass
class ChainReplay:
    """Offline chain replay of one greedy sequence by a block drafter (``replay_chain``)."""

    anchor_positions: list[int]  # every response anchor replayed
    accepted_at_anchor: list[int]  # accepted drafts if a round started there
    round_anchors: list[int]  # anchors (pending-root positions) of the rounds the chain decoder runs
    round_accepted: list[int]  # accepted drafts per round (tau)
    round_committed: list[int]  # committed tokens per round (tau + 1, cut at the end of the sequence)


@torch.no_grad()
def replay_chain(drafter, input_ids: torch.Tensor, features: torch.Tensor, prompt_len: int, *,
                 chunk: int = 64) -> ChainReplay:
    """The ungated chain rounds of a decoder with ``drafter`` on one greedy sequence ``input_ids [S]`` (features
    ``[>= S-1, n*H]``), and the acceptance at every response anchor."""
    sequence = [int(t) for t in input_ids.tolist()]
    prompt, output = sequence[:prompt_len], sequence[prompt_len:]
    source = PrecomputedBlockDrafter(drafter, prompt, output, features, chunk=chunk)
    result = replay_rounds(prompt, output, source, "chain", min_expected_accepted=0.0)
    rounds = result.rounds[1:]  # round 0 is the prefill
    return ChainReplay(anchor_positions=list(range(prompt_len, len(sequence) - 1)),
                       accepted_at_anchor=source.chain_accepted(),
                       round_anchors=[prompt_len + r.start_position - 1 for r in rounds],
                       round_accepted=[r.accepted for r in rounds], round_committed=[r.committed for r in rounds])


def run_gate_threshold(meta: dict) -> float | None:
    """The ratio gate's threshold a run was decoded with, from its ``run.json`` (as stored, else
    ``verify_cost_ratio - 1``); ``None`` for the cost gate and for a law policy."""
    if meta.get("gate") == "cost" or meta.get("verify_cost") or meta.get("policy"):
        return None
    if meta.get("min_expected_accepted") is not None:
        return float(meta["min_expected_accepted"])
    return max(0.0, float(meta.get("verify_cost_ratio", DEFAULT_VERIFY_COST_RATIO)) - 1.0)
