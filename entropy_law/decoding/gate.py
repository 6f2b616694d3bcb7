"""When a drafted tree is worth verifying: the decoder's drafting gate and the verify-cost curve.

Known here: the relative cost of one target forward over ``n`` tokens (``VerifyCost``, measured on the
running machine by ``measure_verify_cost``), and the rule that turns a drafted tree into the tree that
is actually verified (``plan_verification``). Both the online decoder and offline replay call the same
rule, so a replay with the same cost curve makes the same decisions.

The rule. A round that verifies the root plus ``k`` draft nodes costs ``c(k + 1)`` one-token forwards
and commits, in expectation under the drafter's surrogate, ``1 + E_k`` tokens, where ``E_k`` is the sum
of the ``k`` nodes' path probabilities (``tree.expected_accepted``). A plain step (no draft) commits 1
token for cost ``c(1) = 1``. Tree nodes come in non-increasing path probability (chain and DDTree
both), and any prefix of the node list is ancestor-closed (parents come first), so the gate verifies the
prefix ``k`` that maximises the expected tokens per unit cost ``(1 + E_k) / c(k + 1)``, and no draft at
all when no prefix beats ``1``. With a constant cost ``c(n) = r`` for ``n >= 2`` (the simpler gate of
``verify_cost_ratio``) this reduces to "verify the whole tree iff ``E_N >= r - 1``", which is what the
decoder does when no curve is given. Gating changes speed, never the output.

The gates are round policies (``round.RoundPolicy``), like the law policy and the replay oracle: ``RatioGate``
(the decoder's default: the constant-cost rule), ``CostGate`` (the best-value prefix under a measured curve) and
``PredicateGate`` (a caller's ``should_draft(proposal, tree)``). They decide after drafting only: the drafter always
runs, and a round records no policy decision (``before_draft`` returns ``None``). ``make_gate`` builds the gate that
a run's settings name (``verify_cost_ratio``, ``min_expected_accepted``, ``verify_cost``, ``should_draft``).

Not known here: how the target verifies (``adapter``), how trees are built (``tree``), the round (``round``).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import Tree, chain_tree, expected_accepted, node_logprobs

DEFAULT_VERIFY_COST_RATIO = 2.0

# every size a chain or a DDTree16 verifies (17 tokens: root + 16 nodes), then coarser: a CPU's forward cost is not
# monotone in the tokens (kernel shapes), so sizes in between are not interpolated (measure_verify_cost)
DEFAULT_COST_SIZES = tuple(range(1, 18)) + (24, 32)


@dataclass(frozen=True)
class VerifyCost:
    """Relative cost ``c(n)`` of one target forward over ``n`` tokens; ``c(1) = 1`` (a one-token step).

    Piecewise linear through ``(sizes, costs)``, extended past the last point with the slope of the last
    segment (flat when there is one point). ``sizes`` must start at 1 and increase; ``costs`` are
    normalised so that ``c(1) = 1``. ``clock``: the clock ``measure_verify_cost`` timed it by (``"cpu"`` /
    ``"wall"``), kept with the run for provenance; ``None`` for a curve given by hand. Two curves with the same
    points are equal whatever their clock.
    """

    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    clock: str | None = field(default=None, compare=False)

    def __post_init__(self):
        sizes = tuple(int(s) for s in self.sizes)
        costs = tuple(float(c) for c in self.costs)
        if not sizes or len(sizes) != len(costs):
            raise ValueError(f"need as many costs as sizes (at least one), got {len(sizes)} sizes, {len(costs)} costs")
        if sizes[0] != 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"sizes must start at 1 and increase, got {list(sizes)}")
        if any(not math.isfinite(c) or c <= 0 for c in costs):
            raise ValueError(f"costs must be finite and > 0, got {list(costs)}")
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "costs", tuple(c / costs[0] for c in costs))

    def __call__(self, n_tokens: int) -> float:
        n = int(n_tokens)
        if n < 1:
            raise ValueError(f"a forward covers at least 1 token, got {n}")
        sizes, costs = self.sizes, self.costs
        if len(sizes) == 1:
            return costs[0]
        for i in range(1, len(sizes)):
            if n <= sizes[i] or i == len(sizes) - 1:
                lo, hi = sizes[i - 1], sizes[i]
                return costs[i - 1] + (costs[i] - costs[i - 1]) * (n - lo) / (hi - lo)
        raise AssertionError("unreachable")

    def describe(self) -> str:
        """The measured points as one line, ``"1: 1.00, 2: 1.48, ..."`` (one-token forwards)."""
        return ", ".join(f"{n}: {c:.2f}" for n, c in zip(self.sizes, self.costs))

    def to_config(self) -> dict:
        """JSON-ready form (run metadata); ``VerifyCost.from_config`` reads it back."""
        config = {"sizes": list(self.sizes), "costs": [round(c, 6) for c in self.costs]}
        return config if self.clock is None else {**config, "clock": self.clock}

    @classmethod
    def from_config(cls, config: dict) -> "VerifyCost":
        try:
            return cls(tuple(config["sizes"]), tuple(config["costs"]), clock=config.get("clock"))
        except (KeyError, TypeError) as err:
            raise ValueError(f"a verify-cost config needs 'sizes' and 'costs' lists, got {config!r}") from err


CLOCKS = ("auto", "cpu", "wall")


def timer_for(adapter, clock: str):
    """The clock ``measure_verify_cost`` and ``decoder.measure_draft_cost`` time by, and its name. ``cpu``: the
    calling thread's CPU clock (``time.thread_time``), which neither other processes nor the process's other
    threads move; ``wall``: ``time.perf_counter``. ``auto``: ``cpu`` where the forward runs on this thread alone (a
    model on the CPU with one torch thread), else ``wall``: a model on an accelerator is waited on, not computed
    here, and with several torch threads this thread's CPU time is only its share of the work."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "auto":
        device = next((p.device.type for p in adapter.model.parameters()), "cpu")
        clock = "cpu" if device == "cpu" and torch.get_num_threads() == 1 else "wall"
    return (time.thread_time if clock == "cpu" else time.perf_counter), clock


@torch.inference_mode()
def measure_verify_cost(adapter, *, sizes: Sequence[int] = DEFAULT_COST_SIZES, context_len: int = 384,
                        repeats: int = 5, seed: int = 0, clock: str = "auto") -> VerifyCost:
    """Time chain verifies of ``n`` tokens (root + ``n - 1`` nodes) at a ``context_len`` cache, relative to
    a one-token step, on this machine and thread count: the fastest of ``repeats`` passes over all sizes
    (after one warm-up pass; the minimum is the least disturbed by other load on the machine).

    ``clock`` (``CLOCKS``, ``timer_for``): ``"auto"`` (default) times a model on the CPU with one torch thread (the
    setting for a shared machine) by the calling thread's CPU clock, anything else by the wall clock; ``"cpu"`` /
    ``"wall"`` force one. On a shared CPU the wall clock also counts the time other processes hold the core, so
    every repeat of a forward is disturbed and the minimum does not help; the CPU clock is not moved by them. A
    cost gate or policy that trusts a deflated curve verifies trees that do not pay, and an inflated one stops
    drafting where it pays.

    Uses random token ids (the cost of a forward does not depend on which tokens). The costs are kept as
    timed, not made non-decreasing: on a CPU a bigger verify can really cost less than a smaller one (kernel
    shapes), and the gate and the law policy scan every prefix size, so they pick the cheaper one. For the same
    reason every size up to 17 tokens (a chain or a DDTree16 with its root) is timed by default, none
    interpolated: a CPU's cost is not monotone in between.
    A model with a short context is timed at a shorter ``context_len`` and sizes up to half its context.
    Leaves the adapter's cache empty (call ``prefill`` before decoding, as ``generate`` does).
    """
    sizes = tuple(sorted({int(s) for s in sizes} | {1}))
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    max_ctx = adapter.max_context
    if max_ctx is not None and context_len + sizes[-1] >= max_ctx:  # a short-context model: scale down
        sizes = tuple(s for s in sizes if s <= max(1, max_ctx // 2))
        context_len = min(context_len, max_ctx - sizes[-1] - 1)
        if context_len < 1:
            raise ValueError(f"the model's context ({max_ctx}) is too short to time verifies")
    vocab = int(adapter.model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (context_len + sizes[-1],), generator=gen).tolist()
    adapter.prefill(ids[:context_len])
    trees = []
    for n in sizes:
        drafts = torch.tensor(ids[context_len:context_len + n - 1], dtype=torch.long).reshape(-1, 1)
        trees.append(chain_tree(DraftProposal(tokens=drafts, logprobs=torch.zeros(n - 1, 1))) if n > 1
                     else Tree.empty())
    now, clock = timer_for(adapter, clock)
    best = [math.inf] * len(sizes)
    for rep in range(repeats + 1):  # sizes interleaved, so that a burst of load hits every size alike
        for i, tree in enumerate(trees):
            t0 = now()
            adapter.verify(ids[context_len - 1], tree, context_len)
            elapsed = now() - t0
            adapter.truncate(context_len)
            if rep:  # the first pass warms up
                best[i] = min(best[i], elapsed)
    adapter.cache = None
    if not best[0] > 0:
        raise RuntimeError(f"a one-token verify took no measurable time on the {clock} clock; time by "
                           "clock='wall'")
    return VerifyCost(sizes, tuple(t / best[0] for t in best), clock=clock)


def truncate_proposal(proposal: DraftProposal, depth: int) -> DraftProposal:
    """The first ``depth`` rows of a proposal (drafts deeper than can be committed or verified)."""
    if proposal.depth <= depth:
        return proposal
    return DraftProposal(tokens=proposal.tokens[:depth], logprobs=proposal.logprobs[:depth],
                         logits=None if proposal.logits is None else proposal.logits[:depth])


def plan_verification(proposal: DraftProposal, tree: Tree, *, verify_cost: VerifyCost | None,
                      min_expected_accepted: float) -> tuple[Tree, float]:
    """The tree to verify this round (possibly empty) and the gate's surrogate ``E``: of the verified
    tree when it drafts, of the whole drafted tree when it does not.

    ``verify_cost=None``: verify all of ``tree`` iff ``E >= min_expected_accepted``. With a cost curve:
    verify the node prefix with the most expected tokens per unit cost (module docstring), provided its
    ``E_k >= min_expected_accepted``; an empty tree when no prefix beats a plain step.
    """
    if tree.n_nodes == 0:
        return Tree.empty(), 0.0
    probs = [math.exp(score) for score in node_logprobs(proposal, tree)]
    expected = float(sum(probs))
    if verify_cost is None:
        return (tree, expected) if expected >= min_expected_accepted else (Tree.empty(), expected)
    best_k, best_rate, cumulative = 0, 1.0, 0.0
    for k, p in enumerate(probs, start=1):
        cumulative += p
        rate = (1.0 + cumulative) / verify_cost(k + 1)
        if rate > best_rate * (1.0 + 1e-9) and cumulative >= min_expected_accepted:
            best_k, best_rate = k, rate
    if best_k == 0:
        return Tree.empty(), expected
    return tree.prefix(best_k), float(sum(probs[:best_k]))


# --- the gates as round policies ----------------------------------------------------------------------

def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


class Gate:
    """What the three gates share: no decision before drafting (the drafter always runs and the round records no
    policy decision: ``before_draft`` returns ``None``), nothing to track per request or per round; ``plan``
    (each gate's own) picks the verified tree. ``to_config``: the gate's settings under the run-metadata keys
    runs have always had (``verify_cost_ratio``, ``min_expected_accepted``, ``verify_cost``)."""

    verify_cost_ratio: float | None = None
    min_expected_accepted: float | None = None
    verify_cost: VerifyCost | None = None

    def bind(self, adapter, drafter) -> "Gate":
        return self

    def begin_request(self, state) -> None:
        return None

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> None:
        return None

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        return None

    def to_config(self) -> dict:
        return {"verify_cost_ratio": self.verify_cost_ratio, "min_expected_accepted": self.min_expected_accepted,
                "verify_cost": None if self.verify_cost is None else self.verify_cost.to_config()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_config()})"


class RatioGate(Gate):
    """The decoder's default gate: verify the whole drafted tree iff its surrogate expected accepted drafts
    ``E >= verify_cost_ratio - 1`` (the module's rule under a constant cost ``c(n) = verify_cost_ratio``), else a
    plain step. ``min_expected_accepted`` sets the threshold directly (0: verify whatever was drafted)."""

    def __init__(self, verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO, *,
                 min_expected_accepted: float | None = None):
        self.verify_cost_ratio = _number("verify_cost_ratio", verify_cost_ratio)
        self.min_expected_accepted = (max(0.0, self.verify_cost_ratio - 1.0) if min_expected_accepted is None
                                      else _number("min_expected_accepted", min_expected_accepted))

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]:
        return plan_verification(proposal, tree, verify_cost=None, min_expected_accepted=self.min_expected_accepted)


class CostGate(Gate):
    """The cost gate: verify the prefix of the drafted tree with the most expected tokens per unit of verify cost
    under the curve ``verify_cost``, or nothing (``plan_verification``), provided that prefix's expected accepted
    drafts reach ``min_expected_accepted``. ``verify_cost``: a ``VerifyCost``, or ``"measure"`` / ``None``: this
    machine's curve, timed by ``measure_verify_cost`` on the decoder's target when the decoder is built (``bind``)."""

    def __init__(self, verify_cost: VerifyCost | str | None = "measure", *, min_expected_accepted: float = 0.0):
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost) and verify_cost != "measure":
            raise ValueError(f"verify_cost must be a VerifyCost, 'measure' or None (this machine's curve, timed when "
                             f"the decoder is built), got {verify_cost!r}")
        self.verify_cost = verify_cost if isinstance(verify_cost, VerifyCost) else None
        self.min_expected_accepted = _number("min_expected_accepted", min_expected_accepted)

    def bind(self, adapter, drafter) -> "CostGate":
        """The gate priced with this machine's curve, measured on ``adapter`` now where none was given (no drafter:
        nothing to gate, nothing measured)."""
        if self.verify_cost is not None or drafter is None:
            return self
        if adapter is None:
            raise ValueError("a cost gate without a curve measures the target's verify cost: pass the curve the run "
                             "used (VerifyCost.from_config) to replay it")
        return CostGate(measure_verify_cost(adapter), min_expected_accepted=self.min_expected_accepted)

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]:
        if self.verify_cost is None:
            raise RuntimeError("CostGate: no verify-cost curve (the decoder measures it when built: bind)")
        return plan_verification(proposal, tree, verify_cost=self.verify_cost,
                                 min_expected_accepted=self.min_expected_accepted)


class PredicateGate(Gate):
    """A caller's gate: verify the whole drafted tree iff ``should_draft(proposal, tree)``; the round's ``E`` is the
    tree's surrogate expected accepted drafts (``tree.expected_accepted``) either way."""

    def __init__(self, should_draft: Callable[[DraftProposal, Tree], bool]):
        if not callable(should_draft):
            raise TypeError(f"should_draft must be a callable (proposal, tree) -> bool, got {should_draft!r}")
        self.should_draft = should_draft

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]:
        expected = expected_accepted(proposal, tree)
        return (tree if tree.n_nodes > 0 and self.should_draft(proposal, tree) else Tree.empty()), expected

    def to_config(self) -> dict:
        return {**super().to_config(), "should_draft": repr(self.should_draft)}


def make_gate(*, verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO, min_expected_accepted: float | None = None,
              verify_cost: VerifyCost | str | None = None,
              should_draft: Callable[[DraftProposal, Tree], bool] | None = None) -> Gate:
    """The gate a run's settings name: ``should_draft`` given, a ``PredicateGate``; a ``verify_cost`` curve (or
    ``"measure"``), a ``CostGate`` (``min_expected_accepted`` default 0, ``verify_cost_ratio`` unused); else a
    ``RatioGate``."""
    if should_draft is not None:
        return PredicateGate(should_draft)
    if verify_cost is not None:
        return CostGate(verify_cost, min_expected_accepted=0.0 if min_expected_accepted is None
                        else min_expected_accepted)
    return RatioGate(verify_cost_ratio, min_expected_accepted=min_expected_accepted)
