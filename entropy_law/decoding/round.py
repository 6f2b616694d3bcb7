"""One speculative round, written once: plan the tree, walk it, commit, stop.

The record of a round (``Round``), the decision interface of every drafting policy (``RoundPolicy``), the rules
every round obeys (``RoundRules``) and the round itself (``play_round``). Its two drivers differ only in where the
next correct token comes from: the target's argmax (``decoder.SpeculativeDecoder``) or the recorded greedy output
(``replay.replay_rounds``), so a replay with the same drafter and rules makes exactly the online rounds.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import torch

from entropy_law.decoding.gate import DEFAULT_VERIFY_COST_RATIO, Gate, RatioGate, VerifyCost, truncate_proposal
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import TREE_POLICIES, Tree, build_tree


@dataclass(frozen=True)
class Round:
    """One verify round (round 0: the prefill). Observers receive it with ``draft`` (the proposal verified, or
    ``None``) and ``target_logits`` (``[committed, V]`` fp32, row ``j`` produced committed token ``j``); results
    keep the ``bare()`` record."""

    round_index: int
    start_position: int  # output position of committed_ids[0]
    context_len: int  # target cache length before the round (= absolute position of the root)
    tree_nodes: int
    tree_depth: int
    accepted: int  # tau: accepted drafts
    committed_ids: list[int]  # tokens kept (already cut at EOS / the token budget)
    ends_at_leaf: bool  # True: the last committed token followed a node without children (bonus)
    drafted: bool = False  # False: no proposal, or the policy declined: a plain one-token step
    expected_accepted: float = 0.0  # the policy's expected accepted drafts E (0 when nothing was proposed)
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
    """The one drafting decision of a round: whether to call the drafter, and which drafted nodes to verify.

    Implemented by the gates (``gate``), the law policies (``policy``) and the replay oracle
    (``replay.HindsightPolicy``). It only chooses the verified tree, so the output is the greedy output whatever it
    decides; online and replay call it in the same order with the same arguments. The calls, in order:

    - ``bind(adapter, drafter)``, once per decoder (replay: ``adapter`` is ``None``): the policy to use.
    - ``begin_request(state)``: a request starts (its ``RequestState``: id, workload, prompt, token budget).
    - ``before_draft(entropies, n_output, max_depth, history, context)``: the target entropy per output position
      (NaN where unknown), the output length, the deepest committable draft, the request's earlier ``Round``
      records (each with this policy's decision in ``.policy``) and the prompt plus committed output. Returns a
      dict with ``"draft"`` and what to keep with the round, or ``None`` (draft, keep nothing).
    - ``plan(proposal, tree, decision)``: the proposal, the candidate tree built from it and the decision. Returns
      an ancestor-closed subtree to verify (empty: a plain step) and its expected accepted drafts.
    - ``observe(entropies, n_output, target_logits)``: extend ``entropies`` with the newly committed positions
      (``target_logits`` ``None`` in replay, where they are given up front).
    - ``to_config()``: its settings as stored with a run.
    """

    def bind(self, adapter, drafter) -> "RoundPolicy": ...

    def begin_request(self, state: "RequestState") -> None: ...

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict | None: ...

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]: ...

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None: ...

    def to_config(self) -> dict: ...


def policy_config(policy: RoundPolicy) -> dict:
    """The keys a round policy adds to a run's config: a gate's settings (``Gate.to_config``), or any other
    policy's ``to_config()`` under ``policy`` with the verify-cost curve it prices by."""
    if isinstance(policy, Gate):
        return policy.to_config()
    curve = getattr(policy, "verify_cost", None)
    return {"verify_cost_ratio": None, "min_expected_accepted": None,
            "verify_cost": curve.to_config() if isinstance(curve, VerifyCost) else None,
            "policy": policy.to_config() if hasattr(policy, "to_config") else repr(policy)}


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


POLICY_METHODS = ("bind", "begin_request", "before_draft", "plan", "observe")


@dataclass(frozen=True)
class RoundRules:
    """What every round obeys, online or replayed: the tree policy, the round policy, and when to stop (build with
    ``RoundRules.make``)."""

    tree: str | Callable[[DraftProposal, int | None], Tree] = "chain"
    budget: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    max_context: int | None = None
    policy: RoundPolicy = field(default_factory=RatioGate)

    @classmethod
    def make(cls, tree="chain", budget: int | None = None, *, drafting: bool = True, eos_token_ids=None,
             max_context: int | None = None, policy: RoundPolicy | None = None) -> "RoundRules":
        """``policy``: the ``RoundPolicy`` that decides each round (default ``gate.RatioGate()``), already bound
        (``RoundPolicy.bind``)."""
        cls.check_tree(tree, budget, drafting=drafting)
        policy = RatioGate() if policy is None else policy
        missing = [name for name in POLICY_METHODS if not callable(getattr(policy, name, None))]
        if missing:
            raise TypeError(f"policy must be a RoundPolicy (round.RoundPolicy: {', '.join(POLICY_METHODS)}), "
                            f"{type(policy).__name__} lacks {missing}")
        return cls(tree=tree, budget=budget, eos_token_ids=eos_set(eos_token_ids), max_context=max_context,
                   policy=policy)

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
        """The tree the policy verifies (maybe empty), the proposal cut to its depth (``None``: nothing verified) and
        the policy's expected accepted drafts ``E``."""
        if decision is not None:
            decision.setdefault("budget", 0)
        if proposal is None or proposal.depth == 0:
            return Tree.empty(), None, 0.0
        proposal = truncate_proposal(proposal, self.usable_depth(start, remaining))
        if proposal.depth == 0:
            return Tree.empty(), None, 0.0
        candidate = self.tree(proposal, self.budget) if callable(self.tree) else build_tree(proposal, self.tree,
                                                                                            self.budget)
        tree, expected = self.policy.plan(proposal, candidate, decision)
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
        return {"tree_policy": self.tree if isinstance(self.tree, str) else repr(self.tree), "budget": self.budget,
                **policy_config(self.policy), "eos_token_ids": sorted(self.eos_token_ids)}


@dataclass
class RequestState:
    """One request in flight: prompt, workload, committed output (its last token the pending root, not yet in the
    target's cache) and rounds so far."""

    prompt_ids: list[int]
    max_new_tokens: int
    output: list[int]
    start: int  # target cache length = absolute position of the pending root
    request_id: str = ""
    block_size: int = 1
    rounds: list[Round] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # target entropy per output position (for a policy)
    category: str = ""
    dataset: str = ""


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


def _no_clock() -> float:  # an untimed round (replay): one module function, not a closure made every round
    return 0.0


def play_round(state: RequestState, rules: RoundRules, propose: Callable[[list[int]], DraftProposal | None],
               verifier: Verifier, *, timed: bool = True) -> Round:
    """One speculative round: draft -> plan the tree -> verify -> walk -> commit (+ the bonus token).
    ``propose(tokens)`` drafts after the prompt + committed output (``None``: no draft). Updates ``state``."""
    clock = now_ms if timed else _no_clock
    t0 = clock()
    remaining = state.max_new_tokens - len(state.output)  # tokens this request may still commit
    context = state.prompt_ids + state.output
    decision = rules.policy.before_draft(state.entropies, len(state.output), rules.usable_depth(state.start, remaining),
                                         state.rounds, context=context)
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
