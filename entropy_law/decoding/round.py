"""One speculative round, written once: plan the tree, walk it, commit, stop.

Known here: the record of one round (``Round``), the decision interface every drafting policy implements
(``RoundPolicy``: the gates of ``gate``, the law policy of ``policy``, the replay oracle of ``replay``), the
rules every round obeys (``RoundRules``: the tree policy and its budget, the round policy, the EOS set, the usable
depth, the cut at EOS / the token budget, the stop reason), the prefill round, and the round itself
(``play_round``). Two drivers call it and differ
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

from entropy_law.decoding.gate import DEFAULT_VERIFY_COST_RATIO, Gate, RatioGate, VerifyCost, truncate_proposal
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import TREE_POLICIES, Tree, build_tree



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
    """The one drafting decision of a round: whether to call the drafter, and which drafted nodes to verify. The
    gates (``gate.RatioGate``, the default; ``gate.CostGate``; ``gate.PredicateGate``), the law policies
    (``policy.LawPolicy``, ``policy.HybridLawPolicy``) and the replay oracle (``replay.HindsightPolicy``) implement
    it, and ``RoundRules`` asks it and nothing else. A policy only chooses the verified tree; the acceptance rule
    stays the round's, so the output is the greedy output whatever it decides. The online decoder and replay call
    it in the same order with the same arguments, so a policy replayed makes its online rounds.

    What a policy is given, in the order of the calls (all it will be given: a controller finds its inputs here):

    - ``bind(adapter, drafter)``, once, when a decoder is built (replay: ``adapter`` is ``None``): returns the
      policy to use (itself, or a copy completed for this machine and drafter: ``CostGate`` times the verify
      cost, ``HybridLawPolicy`` binds the drafter it routes).
    - ``begin_request(state)``, at each request's start: the ``RequestState`` (``request_id``, the workload:
      ``category`` and ``dataset``, ``prompt_ids``, ``max_new_tokens``). Settings chosen per workload (a table
      fitted offline per category, say) are chosen here; per-request state is reset here.
    - ``before_draft(entropies, n_output, max_depth, history, context)``, each round before the drafter runs:
      the target entropy at each output position so far (``entropies``; NaN where unknown), the output length,
      the deepest draft that can still be committed, the request's earlier rounds (``history``: ``Round``
      records, round 0 the prefill, each with its outcome: ``tree_nodes``, ``tree_depth``, ``accepted``,
      ``committed_ids``, ``expected_accepted``, and this policy's own decision in ``.policy``) and the context
      (prompt and committed output, ending with the pending root). Returns the decision: a dict with ``"draft"``
      (call the drafter?) and whatever the policy wants kept with the round (``Round.policy``, hence in the next
      rounds' ``history``; the trace keeps the columns of ``observers.round_columns``), or ``None``: draft, and
      keep no decision (the gates: their traces carry no policy columns).
    - ``plan(proposal, tree, decision)``, after drafting: the drafter's proposal, its confidences included
      (``proposal.logprobs``: log-probabilities of its candidates at each drafted depth; ``proposal.logits``:
      its whole distribution per depth where the drafter has one, e.g. the block drafter; per tree node
      ``decoding.tree.node_logprobs``), the candidate tree built from it (cut to ``max_depth``) and the
      decision ``before_draft`` returned (a dict ``plan`` may add to). Returns an ancestor-closed subtree of
      ``tree`` to verify (empty: a plain step) and its expected accepted drafts (the round's ``expected_accepted``).
    - ``observe(entropies, n_output, target_logits)``, after each commit (and after the prefill): extend
      ``entropies`` with the newly committed positions, from their target logit rows (``None`` in replay, where
      the entropies are given up front).
    - ``to_config()``: its settings as stored with a run (``policy_config``).
    """

    def bind(self, adapter, drafter) -> "RoundPolicy":
        """The policy a decoder with this target adapter (``None`` in replay) and drafter uses."""

    def begin_request(self, state: "RequestState") -> None:
        """A request starts: its id, workload (``category``, ``dataset``), prompt and token budget."""

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict | None:
        """The decision before drafting: a dict with ``"draft"`` (call the drafter?) and its inputs, or ``None``
        (draft; nothing recorded)."""

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]:
        """The subtree of ``tree`` to verify and its expected accepted drafts; may record its choice in ``decision``."""

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """Extend ``entropies`` (one per output position) with the newly committed positions."""

    def to_config(self) -> dict:
        """The policy's settings, JSON-ready."""


def policy_config(policy: RoundPolicy) -> dict:
    """The keys a round policy adds to a decoder's (or a replay's) config: a gate's settings where runs have always
    kept them (``verify_cost_ratio``, ``min_expected_accepted``, ``verify_cost``: ``Gate.to_config``); any other
    policy's ``to_config()`` under ``policy``, with the verify-cost curve it prices by (``verify_cost``)."""
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
    """What every round obeys, online or replayed: the tree policy, the round policy, and when to stop.

    Build with ``RoundRules.make`` (checks the options; the default policy is ``gate.RatioGate()``).
    """

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
        """The tree to verify (the policy's choice; empty when drafting is not expected to pay), the proposal cut
        to its depth (``None`` when nothing is verified) and the policy's expected accepted drafts ``E`` (the
        policy may record its choice in ``decision``)."""
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
    """One request in flight: the prompt, its workload (``category``, ``dataset``), the committed output (its
    last token is the pending root, not yet in the target's cache) and the rounds so far."""

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
    # the policy may decline to draft before the drafter runs (its cost saved); None: draft, record nothing
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
