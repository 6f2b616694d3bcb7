"""One speculative round, written once: plan the tree, walk it, commit, stop.

Known here: the record of one round (``Round``), the rules every round obeys (``RoundRules``: the tree
policy and its budget, the drafting gate, the EOS set, the usable depth, the cut at EOS / the token budget,
the stop reason), the prefill round, and the round itself (``play_round``). Two drivers call it and differ
only in where the next correct token comes from:

- the online decoder (``decoder.SpeculativeDecoder``): one target forward over the root plus the tree,
  and the correct token after a node is the target's argmax there;
- offline replay (``replay.replay_rounds``): the correct token after a node at depth ``d`` is the next
  token of the recorded greedy output (greedy decoding is deterministic, so that is the target's argmax).

Because both drivers run this one function, a replay with the same drafter and rules makes exactly the
online rounds (``tests/test_replay_online.py`` checks it round by round).

Not known here: how drafters draft (``interface.Drafter``), how trees are shaped (``tree``), how the target
runs (``adapter``), how rounds are written to disk (``observers``, ``entropy_law.traces``).
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import torch

from entropy_law.decoding.gate import VerifyCost, plan_verification, truncate_proposal
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import TREE_POLICIES, Tree, build_tree, expected_accepted

DEFAULT_VERIFY_COST_RATIO = 2.0


@dataclass(frozen=True)
class Round:
    """One verify round (round 0 is the prefill: it commits the first new token and drafts nothing).

    Observers receive it with ``request_id``, ``block_size``, ``draft`` (the proposal the verified tree was
    built from, ``None`` when the round did not draft) and ``target_logits`` (``[committed, V]`` fp32: row
    ``j`` is the target's logit row at depth ``j`` of the committed path, which produced committed token
    ``j``) filled in; results keep the bare record (``bare()``), without tensors.
    """

    round_index: int
    start_position: int  # output position of committed_ids[0]
    context_len: int  # target cache length before the round (= absolute position of the root)
    tree_nodes: int
    tree_depth: int
    accepted: int  # tau: accepted drafts
    committed_ids: list[int]  # tokens kept (already cut at EOS / the token budget)
    ends_at_leaf: bool  # True: the last committed token followed a node without children (bonus)
    drafted: bool = False  # False: no proposal, or the gate declined: a plain one-token step
    expected_accepted: float = 0.0  # the gate's surrogate E (0 when nothing was proposed)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    overhead_ms: float = 0.0
    request_id: str = ""
    block_size: int = 1
    replayed: bool = False
    draft: DraftProposal | None = field(default=None, compare=False, repr=False)
    target_logits: torch.Tensor | None = field(default=None, compare=False, repr=False)
    policy: dict | None = field(default=None, compare=False, repr=False)  # the policy's decision and inputs

    @property
    def committed(self) -> int:
        return len(self.committed_ids)

    @property
    def prefill(self) -> bool:
        return self.round_index == 0

    def bare(self) -> "Round":
        """The record without its tensors (what results keep)."""
        return replace(self, draft=None, target_logits=None)


class RoundPolicy(Protocol):
    """Decides per round whether to draft and which drafted nodes to verify (``policy.LawPolicy``). It only
    chooses the verified tree; the acceptance rule stays the round's, so the output is unchanged."""

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        """The decision before drafting: a dict with ``"draft"`` (call the drafter?) and its inputs.
        ``history``: the request's earlier rounds (``Round`` records, their decisions in ``.policy``);
        ``context``: the prompt and the committed output, ending with the pending root."""

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        """The subtree of ``tree`` to verify and its expected accepted drafts; records its choice in ``decision``."""

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """Extend ``entropies`` (one per output position) with the newly committed positions."""


class Observer(Protocol):
    """Receives request boundaries and every round (with its tensors). Must not change what is decoded."""

    def on_request_start(self, request_id: str, info: dict) -> None: ...

    def on_round(self, record: Round) -> None: ...

    def on_request_end(self, request_id: str, info: dict) -> None: ...


def eos_set(eos_token_ids: Sequence[int] | int | None) -> frozenset[int]:
    if eos_token_ids is None:
        return frozenset()
    if isinstance(eos_token_ids, int):
        return frozenset([int(eos_token_ids)])
    return frozenset(int(t) for t in eos_token_ids)


@dataclass(frozen=True)
class RoundRules:
    """What every round obeys, online or replayed: the tree policy, the drafting gate, and when to stop.

    Build with ``RoundRules.make`` (checks the options and sets the gate's default threshold).
    """

    tree: str | Callable[[DraftProposal, int | None], Tree] = "chain"
    budget: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    max_context: int | None = None
    verify_cost: VerifyCost | None = None
    min_expected_accepted: float = 0.0
    should_draft: Callable[[DraftProposal, Tree], bool] | None = None
    policy: RoundPolicy | None = None

    @classmethod
    def make(cls, tree="chain", budget: int | None = None, *, drafting: bool = True, eos_token_ids=None,
             max_context: int | None = None, verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO,
             min_expected_accepted: float | None = None, verify_cost: VerifyCost | None = None,
             should_draft: Callable[[DraftProposal, Tree], bool] | None = None,
             policy: RoundPolicy | None = None) -> "RoundRules":
        """``verify_cost_ratio``: cost of a verify pass relative to a one-token forward; a round drafts only
        if the surrogate ``E >= verify_cost_ratio - 1``. ``min_expected_accepted`` sets that threshold
        directly; with a ``verify_cost`` curve it defaults to 0 and the gate verifies the best-value prefix
        (``gate.plan_verification``). ``should_draft(proposal, tree)`` replaces the gate when given;
        ``policy`` (``RoundPolicy``) replaces both: it decides before drafting and picks the verified nodes."""
        cls.check_tree(tree, budget, drafting=drafting)
        for name, value in (("verify_cost_ratio", verify_cost_ratio), ("min_expected_accepted", min_expected_accepted)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a VerifyCost, 'measure' or None, got {type(verify_cost).__name__}")
        if min_expected_accepted is None:
            min_expected_accepted = 0.0 if verify_cost is not None else max(0.0, float(verify_cost_ratio) - 1.0)
        return cls(tree=tree, budget=budget, eos_token_ids=eos_set(eos_token_ids), max_context=max_context,
                   verify_cost=verify_cost, min_expected_accepted=float(min_expected_accepted),
                   should_draft=should_draft, policy=policy)

    @staticmethod
    def check_tree(tree, budget: int | None, *, drafting: bool = True) -> None:
        """Refuse an unknown tree policy, a DDTree without a node budget, a budget that is not an int >= 0."""
        if not isinstance(tree, str) and not callable(tree):
            raise TypeError(f"tree must be one of {TREE_POLICIES} or a callable (proposal, budget) -> Tree, "
                            f"got {tree!r}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, numbers.Integral)):
            raise TypeError(f"budget must be an int (draft nodes per tree) or None, got {budget!r}")
        if isinstance(tree, str) and tree not in TREE_POLICIES:
            raise ValueError(f"unknown tree policy {tree!r}; use one of {TREE_POLICIES} or a callable")
        if tree == "ddtree" and budget is None and drafting:
            raise ValueError("tree='ddtree' needs a node budget, e.g. budget=16")
        if budget is not None and budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")

    def stop_reason(self, state: "RequestState") -> str | None:
        """Why decoding stops after the committed output so far, exactly as plain greedy decoding would."""
        if state.output[-1] in self.eos_token_ids:
            return "eos"
        if len(state.output) >= state.max_new_tokens:
            return "max_new_tokens"
        if self.max_context is not None and state.start >= self.max_context:  # the pending root would not fit
            return "context_full"
        return None

    def usable_depth(self, start: int, remaining: int) -> int:
        """Drafts deeper than the token budget or the context can never be committed."""
        usable_depth = remaining - 1
        if self.max_context is not None:
            usable_depth = min(usable_depth, self.max_context - 1 - start)
        return max(usable_depth, 0)

    def plan_tree(self, proposal: DraftProposal | None, start: int, remaining: int,
                  decision: dict | None = None) -> tuple[Tree, DraftProposal | None, float]:
        """The tree to verify (empty when drafting is not expected to pay), the proposal cut to its depth
        (``None`` when nothing is verified) and the gate's surrogate ``E`` (the policy's expectation with a
        policy, which records its choice in ``decision``)."""
        if decision is not None:
            decision.setdefault("budget", 0)
        if proposal is None or proposal.depth == 0:
            return Tree.empty(), None, 0.0
        proposal = truncate_proposal(proposal, self.usable_depth(start, remaining))
        if proposal.depth == 0:
            return Tree.empty(), None, 0.0
        candidate = self.tree(proposal, self.budget) if callable(self.tree) else build_tree(proposal, self.tree,
                                                                                            self.budget)
        if self.policy is not None and decision is not None:
            tree, expected = self.policy.plan(proposal, candidate, decision)
        elif self.should_draft is not None:
            expected = expected_accepted(proposal, candidate)
            tree = candidate if candidate.n_nodes > 0 and self.should_draft(proposal, candidate) else Tree.empty()
        else:
            tree, expected = plan_verification(proposal, candidate, verify_cost=self.verify_cost,
                                               min_expected_accepted=self.min_expected_accepted)
        if tree.n_nodes == 0:
            return Tree.empty(), None, expected
        return tree, truncate_proposal(proposal, tree.max_depth), expected

    def cut_at_stop(self, committed: list[int], remaining: int) -> list[int]:
        """Stop exactly where plain greedy decoding would: after the first EOS, at the token budget."""
        committed = committed[:remaining]
        for i, token in enumerate(committed):
            if token in self.eos_token_ids:
                return committed[: i + 1]
        return committed

    def config(self) -> dict:
        config = {"tree_policy": self.tree if isinstance(self.tree, str) else repr(self.tree), "budget": self.budget,
                  "min_expected_accepted": self.min_expected_accepted,
                  "verify_cost": None if self.verify_cost is None else self.verify_cost.to_config(),
                  "eos_token_ids": sorted(self.eos_token_ids)}
        if self.policy is not None:
            config["policy"] = self.policy.to_config() if hasattr(self.policy, "to_config") else repr(self.policy)
        return config


@dataclass
class RequestState:
    """One request in flight: the prompt, the committed output (its last token is the pending root, not yet
    in the target's cache) and the rounds so far."""

    prompt_ids: list[int]
    max_new_tokens: int
    output: list[int]
    start: int  # target cache length = absolute position of the pending root
    request_id: str = ""
    block_size: int = 1
    rounds: list[Round] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # target entropy per output position (for a policy)


class Verifier(Protocol):
    """Where the next correct token comes from: the target (online) or the recorded output (replay)."""

    def verify(self, state: RequestState, tree: Tree) -> Callable[[int, int], int | None]:
        """Check ``tree`` below the pending root; returns ``correct(node, depth)``: the target's next token
        after tree node ``node`` (0 = the root) at ``depth``, or ``None`` when it is not known."""

    def commit(self, state: RequestState, kept_nodes: list[int]) -> torch.Tensor | None:
        """Keep the root and the accepted nodes ``kept_nodes`` (their successors were committed); returns the
        target's logit rows at those nodes, when known."""


def prefill_round(state: RequestState, target_logits: torch.Tensor | None = None) -> Round:
    """Round 0: the prefill committed the first new token (no draft, no verify pass)."""
    return Round(round_index=0, start_position=0, context_len=len(state.prompt_ids) - 1, tree_nodes=0, tree_depth=0,
                 accepted=0, committed_ids=[state.output[0]], ends_at_leaf=True, request_id=state.request_id,
                 block_size=state.block_size, target_logits=target_logits)


def now_ms() -> float:
    return time.perf_counter() * 1000.0


def _no_clock() -> float:
    return 0.0


def play_round(state: RequestState, rules: RoundRules, propose: Callable[[list[int]], DraftProposal | None],
               verifier: Verifier, *, timed: bool = True) -> Round:
    """One speculative round: draft -> plan the tree -> verify -> walk -> commit (+ the bonus token).

    ``propose(tokens)`` drafts after ``tokens`` (prompt + committed output, ending with the pending root);
    ``None`` means no drafter. Updates ``state`` (output, cache length) and returns the round's record.
    """
    clock = now_ms if timed else _no_clock
    t0 = clock()
    remaining = state.max_new_tokens - len(state.output)  # tokens this request may still commit
    context = state.prompt_ids + state.output
    decision = None  # a policy may decline to draft before the drafter runs (its cost saved)
    if rules.policy is not None:
        decision = rules.policy.before_draft(state.entropies, len(state.output),
                                             rules.usable_depth(state.start, remaining), state.rounds,
                                             context=context)
    proposal = propose(context) if decision is None or decision["draft"] else None
    t1 = clock()
    tree, proposal, expected = rules.plan_tree(proposal, state.start, remaining, decision)
    t2 = clock()
    correct = verifier.verify(state, tree)
    t3 = clock()

    # Acceptance rule (greedy, lossless): start at the root; while the correct token after the current node
    # is one of its children, move to that child (an accepted draft). The correct token after the last node
    # reached is committed too: the bonus token if that node has no children, the correction otherwise.
    # Every committed token is thus the target's greedy choice.
    path = [0]
    while (token := correct(path[-1], len(path) - 1)) is not None and token in tree.children[path[-1]]:
        path.append(tree.children[path[-1]][token])
    committed = [tree.tokens[node - 1] for node in path[1:]] + ([token] if token is not None else [])
    committed = rules.cut_at_stop(committed, remaining)

    # Commit: the root and the accepted nodes whose successors were kept; the last committed token becomes
    # the next pending root.
    kept_nodes = path[: len(committed)]
    target_logits = verifier.commit(state, kept_nodes)
    start_position, context_len = len(state.output), state.start
    state.output.extend(committed)
    state.start += len(committed)
    if rules.policy is not None:
        rules.policy.observe(state.entropies, len(state.output), target_logits)
    t4 = clock()
    return Round(round_index=len(state.rounds), start_position=start_position, context_len=context_len,
                 tree_nodes=tree.n_nodes, tree_depth=tree.max_depth,
                 accepted=len(path) - 1 if len(committed) == len(path) else len(committed),
                 committed_ids=committed, ends_at_leaf=not tree.children[path[len(committed) - 1]],
                 drafted=proposal is not None, expected_accepted=expected,
                 draft_ms=t1 - t0, verify_ms=t3 - t2, overhead_ms=(t2 - t1) + (t4 - t3),
                 request_id=state.request_id, block_size=state.block_size, draft=proposal,
                 target_logits=target_logits,
                 policy=None if decision is None else {k: v for k, v in decision.items() if k != "acceptance"})
