"""When a drafted tree is worth verifying: the decoder's drafting gate and the verify-cost curve.

The rule (online and in replay alike): verifying the root plus ``k`` draft nodes costs ``c(k + 1)`` one-token
forwards (``VerifyCost``, ``measure_verify_cost``) and commits ``1 + E_k`` tokens in expectation, ``E_k`` the sum of
the ``k`` nodes' surrogate path probabilities. Nodes come in non-increasing path probability and every prefix is
ancestor-closed, so the gate verifies the prefix with the most ``(1 + E_k) / c(k + 1)``, or nothing when none
beats a plain step (1). With a constant ``c(n) = r`` this is "verify the whole tree iff ``E_N >= r - 1``", the
default. Gating changes speed, never the output.

The gates are round policies (``round.RoundPolicy``) that decide after drafting only: ``RatioGate`` (the
constant-cost rule), ``CostGate`` (a measured curve) and ``PredicateGate`` (a caller's ``should_draft``).
``make_gate`` builds the one a run's settings name.
"""

from __future__ import annotations

import bisect
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from entropy_law.decoding.interface import DraftProposal, PolicyDefaults
from entropy_law.decoding.tree import Tree, chain_tree, expected_accepted, node_logprobs

DEFAULT_VERIFY_COST_RATIO = 2.0

# every size up to a DDTree16 with its root, then coarser: a CPU's forward cost is not monotone in between
DEFAULT_COST_SIZES = tuple(range(1, 18)) + (24, 32)


@dataclass(frozen=True)
class VerifyCost:
    """Relative cost ``c(n)`` of one target forward over ``n`` tokens, piecewise linear through ``(sizes, costs)``
    (sizes from 1, increasing; costs normalised to ``c(1) = 1``), extended with the last segment's slope.
    ``clock``: what ``measure_verify_cost`` timed it by (provenance only, not compared)."""

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
        i = min(max(bisect.bisect_left(sizes, n), 1), len(sizes) - 1)  # the segment ending at or after n
        return costs[i - 1] + (costs[i] - costs[i - 1]) * (n - sizes[i - 1]) / (sizes[i] - sizes[i - 1])

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
    """The timer (and its name) costs are measured by: ``cpu``, the calling thread's CPU clock; ``wall``,
    ``time.perf_counter``; ``auto``: ``cpu`` for a model on the CPU with one torch thread, else ``wall``."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "auto":
        device = next((p.device.type for p in adapter.model.parameters()), "cpu")
        clock = "cpu" if device == "cpu" and torch.get_num_threads() == 1 else "wall"
    return (time.thread_time if clock == "cpu" else time.perf_counter), clock


@torch.inference_mode()
def measure_verify_cost(adapter, *, sizes: Sequence[int] = DEFAULT_COST_SIZES, context_len: int = 384,
                        repeats: int = 5, seed: int = 0, clock: str = "auto") -> VerifyCost:
    """Time chain verifies of ``n`` random tokens at a ``context_len`` cache, relative to a one-token step: the
    fastest of ``repeats`` interleaved passes after a warm-up, by ``clock`` (``timer_for``). Costs are kept as
    timed (a bigger verify can cost less on a CPU). A short-context model is timed at a shorter ``context_len``
    and sizes up to half its context. Leaves the adapter's cache empty.
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
    for rep in range(repeats + 1):
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
    """The tree to verify (maybe empty) and the surrogate ``E`` (of the verified tree, else the drafted one):
    ``verify_cost=None``, all of ``tree`` iff ``E >= min_expected_accepted``; else the best-value prefix (module
    docstring) with ``E_k >= min_expected_accepted``."""
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

def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


class Gate(PolicyDefaults):
    """What the gates share: no decision before drafting (``before_draft`` returns ``None``), nothing to track;
    ``to_config``: the settings under the run-metadata keys."""

    verify_cost_ratio: float | None = None
    min_expected_accepted: float | None = None
    verify_cost: VerifyCost | None = None

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> None:
        return None

    def to_config(self) -> dict:
        return {"verify_cost_ratio": self.verify_cost_ratio, "min_expected_accepted": self.min_expected_accepted,
                "verify_cost": None if self.verify_cost is None else self.verify_cost.to_config()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_config()})"


class RatioGate(Gate):
    """The default gate: verify the whole drafted tree iff ``E >= verify_cost_ratio - 1`` (or
    ``min_expected_accepted``, given), else a plain step."""

    def __init__(self, verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO, *,
                 min_expected_accepted: float | None = None):
        self.verify_cost_ratio = _number("verify_cost_ratio", verify_cost_ratio)
        self.min_expected_accepted = (max(0.0, self.verify_cost_ratio - 1.0) if min_expected_accepted is None
                                      else _number("min_expected_accepted", min_expected_accepted))

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict | None) -> tuple[Tree, float]:
        return plan_verification(proposal, tree, verify_cost=None, min_expected_accepted=self.min_expected_accepted)


class CostGate(Gate):
    """Verify the best-value prefix under ``verify_cost`` (``plan_verification``); ``"measure"`` / ``None``: this
    machine's curve, timed on the decoder's target when it is built (``bind``)."""

    def __init__(self, verify_cost: VerifyCost | str | None = "measure", *, min_expected_accepted: float = 0.0):
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost) and verify_cost != "measure":
            raise ValueError(f"verify_cost must be a VerifyCost, 'measure' or None (this machine's curve, timed when "
                             f"the decoder is built), got {verify_cost!r}")
        self.verify_cost = verify_cost if isinstance(verify_cost, VerifyCost) else None
        self.min_expected_accepted = _number("min_expected_accepted", min_expected_accepted)

    def bind(self, adapter, drafter) -> "CostGate":
        """The gate priced with a curve measured on ``adapter`` now, where none was given and there is a drafter."""
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
    """Verify the whole drafted tree iff ``should_draft(proposal, tree)``; ``E`` is the tree's surrogate either way."""

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
    """The gate a run's settings name: ``should_draft``: ``PredicateGate``; ``verify_cost``: ``CostGate``
    (``min_expected_accepted`` default 0); else ``RatioGate``."""
    if should_draft is not None:
        return PredicateGate(should_draft)
    if verify_cost is not None:
        return CostGate(verify_cost, min_expected_accepted=0.0 if min_expected_accepted is None
                        else min_expected_accepted)
    return RatioGate(verify_cost_ratio, min_expected_accepted=min_expected_accepted)
