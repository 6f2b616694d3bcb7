"""The draft-length controllers serving engines and papers ship, as round policies (``round.RoundPolicy``).

Each is a short class with its published rule; its docstring says which constants are the source's and which are
ours. They only choose which drafted nodes are verified, so the output stays the greedy output. State carried from
round to round lives in the decision (``Round.policy``, read back from ``history``) or is rebuilt from ``history``,
so a controller replayed (``replay.replay_rounds``) makes its online rounds.

Each class's ``information`` names what it reads: ``BEFORE_DRAFTING`` (the committed entropies and the request's own
history), ``BEFORE_VERIFYING`` (that and the drafter's proposal: its confidences or its distribution).

Not known here: the law policy (``policy``), the gates (``gate``), the harness that compares them all
(``entropy_law.jobs.controllers``).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from entropy_law.decoding.gate import VerifyCost
from entropy_law.decoding.interface import DraftProposal, PolicyDefaults
from entropy_law.decoding.observers import row_entropies
from entropy_law.decoding.policy import LawPolicy
from entropy_law.decoding.tree import Tree, expected_accepted

BEFORE_DRAFTING = "before drafting"
BEFORE_VERIFYING = "before verifying"


def depth_cut(tree: Tree, depth: int) -> Tree:
    """The nodes of ``tree`` at depth <= ``depth`` (ancestor-closed: a node's parent is one level up)."""
    if depth >= tree.max_depth:
        return tree
    index, tokens, parents, depths = {0: 0}, [], [], []
    for i, (token, parent, d) in enumerate(zip(tree.tokens, tree.parents, tree.depths), start=1):
        if d <= depth and parent in index:
            index[i] = len(tokens) + 1
            tokens.append(token)
            parents.append(index[parent])
            depths.append(d)
    return Tree(tuple(tokens), tuple(parents), tuple(depths)) if tokens else Tree.empty()


def _last_decision(history: Sequence) -> tuple[dict, object]:
    """The previous round's decision (``{}`` at the start) and that round."""
    last = history[-1] if history else None
    return (getattr(last, "policy", None) or {}), last


class Controller(PolicyDefaults):
    """What the controllers share: drafting every round, nothing per request, no entropies tracked; ``plan`` verifies
    the drafted tree down to ``depth(...)``."""

    information = BEFORE_DRAFTING

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        return {"draft": True}

    def depth(self, proposal: DraftProposal, tree: Tree, decision: dict) -> int:
        return tree.max_depth

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        chosen = depth_cut(tree, self.depth(proposal, tree, decision)) if tree.n_nodes else Tree.empty()
        decision["budget"] = chosen.n_nodes
        return chosen, (expected_accepted(proposal, chosen) if chosen.n_nodes else 0.0)

    def to_config(self) -> dict:
        return {"kind": type(self).__name__, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


def _top_probs(proposal: DraftProposal, depth: int) -> list[float]:
    """The drafter's probability of its best candidate at depths 1 .. ``depth``."""
    return proposal.logprobs[:depth, 0].double().exp().tolist()


class ConfidenceThreshold(Controller):
    """transformers' assisted generation (``generation/candidate_generator.py``, dynamic speculation, PR #34156):
    drafting stops after the first draft whose drafter probability falls below ``assistant_confidence_threshold``
    (default 0.4; the judged draft is the last one kept), at most ``num_assistant_tokens`` drafts (default 20,
    schedule ``"constant"``; ``"heuristic"``: +2 after a round that accepted every draft, else -1, at least 1). The
    threshold is refitted online: over this request's verified drafts (accepted 1, the first rejected 0), the threshold
    of the ROC curve with the least ``fpr + 3 fnr`` (the source's weights), once both outcomes were seen. On a tree:
    the depth cut where its best path's probability falls below the threshold."""

    information = BEFORE_VERIFYING

    def __init__(self, threshold: float = 0.4, max_tokens: int = 20, schedule: str = "constant"):
        if schedule not in ("constant", "heuristic"):
            raise ValueError(f"schedule must be 'constant' or 'heuristic' (num_assistant_tokens_schedule), got "
                             f"{schedule!r}")
        self.threshold, self.max_tokens, self.schedule = float(threshold), int(max_tokens), schedule
        self._probs: list[float] = []
        self._matches: list[int] = []

    def begin_request(self, state) -> None:
        self._probs, self._matches = [], []

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        last, record = _last_decision(history)
        threshold, tokens = last.get("threshold", self.threshold), last.get("max_tokens", self.max_tokens)
        probs = last.get("probs") or []
        if probs:  # the last round verified drafts: its outcome refits the threshold and moves the length
            accepted = int(record.accepted)
            self._probs += probs[: accepted + 1]
            self._matches += ([1] * accepted + [0])[: len(probs[: accepted + 1])]
            if len(set(self._matches)) == 2:
                threshold = roc_threshold(np.array(self._probs), np.array(self._matches))
            if self.schedule == "heuristic":
                tokens = tokens + 2 if accepted == len(probs) else max(1, tokens - 1)
        return {"draft": True, "threshold": float(threshold), "max_tokens": int(tokens)}

    def depth(self, proposal, tree, decision) -> int:
        probs = _top_probs(proposal, min(tree.max_depth, decision["max_tokens"]))
        below = next((d for d, p in enumerate(probs, start=1) if p < decision["threshold"]), len(probs))
        decision["probs"] = probs[:below]
        return below


def roc_threshold(probs: np.ndarray, matches: np.ndarray, fn_weight: float = 3.0) -> float:
    """The probability threshold with the least ``fpr + fn_weight * fnr`` (drafts at or above it predicted accepted),
    among the observed probabilities and +inf (none predicted); ties to the higher threshold."""
    candidates = np.concatenate([[np.inf], np.unique(probs)[::-1]])
    pos, neg = max(int(matches.sum()), 1), max(int((1 - matches).sum()), 1)
    costs = [((probs >= t) & (matches == 0)).sum() / neg + fn_weight * ((probs < t) & (matches == 1)).sum() / pos
             for t in candidates]
    return float(candidates[int(np.argmin(costs))])


class DrafterEntropyStop(Controller):
    """AdaEDL (Agrawal, Jeon, Lee, arXiv 2410.18351): drafting stops before the first depth whose drafter entropy ``H``
    gives a lower bound on acceptance ``1 - sqrt(gamma * H)`` below ``lam``. ``gamma`` 0.2 (the paper's experiments);
    ``lam`` 0.5 is ours, and fixed (the paper also adapts it online from observed acceptance; not modelled here). Needs
    the drafter's whole distribution (the block drafter's ``proposal.logits``): the n-gram drafter has none."""

    information = BEFORE_VERIFYING

    def __init__(self, gamma: float = 0.2, lam: float = 0.5):
        self.gamma, self.lam = float(gamma), float(lam)

    def bind(self, adapter, drafter) -> "DrafterEntropyStop":
        if getattr(drafter, "drafter_id", None) == "ngram":
            raise ValueError("AdaEDL reads the drafter's entropy; the n-gram drafter has no distribution: use it with "
                             "the block drafter")
        return self

    def depth(self, proposal, tree, decision) -> int:
        if proposal.logits is None:
            raise ValueError("AdaEDL reads the drafter's entropy; this proposal carries no distribution (logits): "
                             "use the block drafter")
        entropies = row_entropies(proposal.logits[: tree.max_depth])
        stop = next((d for d, h in enumerate(entropies) if 1.0 - math.sqrt(self.gamma * max(h, 0.0)) < self.lam),
                    len(entropies))
        decision["drafter_entropy"] = entropies[:stop + 1]
        return stop


class AcceptLengthEMA(Controller):
    """SGLang's adaptive speculative steps (PRs #21599, #23336; roadmap #23705): an exponential moving average of the
    accepted drafts per verify round picks the draft length among tiers (default ``candidate_steps`` [1, 3, 7]),
    about ``round(ema) + 1``, with hysteresis: it steps up to the tier of ``round(ema - up) + 1`` and down to that of
    ``round(ema - down) + 1`` (our reading of the offsets), else stays. ``up`` 0.0 and ``down`` -0.25 as in an
    adaptive config quoted on the tracker (ormandj/sglang-glm53-flash-sm120#10); the EMA weight 0.2 and the start at
    the middle tier are ours. The engine keeps one EMA across requests; here it starts afresh with each request."""

    def __init__(self, tiers: Sequence[int] = (1, 3, 7), alpha: float = 0.2, up: float = 0.0, down: float = -0.25):
        self.tiers, self.alpha, self.up, self.down = sorted(int(t) for t in tiers), float(alpha), float(up), float(down)

    def _tier(self, steps: int) -> int:
        return next((t for t in self.tiers if t >= steps), self.tiers[-1])

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        last, record = _last_decision(history)
        ema, steps = last.get("ema"), last.get("steps", self.tiers[len(self.tiers) // 2])
        if record is not None and record.tree_nodes > 0:
            ema = float(record.accepted) if ema is None else self.alpha * record.accepted + (1 - self.alpha) * ema
            up, down = self._tier(round(ema - self.up) + 1), self._tier(round(ema - self.down) + 1)
            steps = up if up > steps else down if down < steps else steps
        return {"draft": True, "ema": ema, "steps": int(steps)}

    def depth(self, proposal, tree, decision) -> int:
        return decision["steps"]


def profile_length(acceptance: Sequence[float], verify_cost: VerifyCost, draft_cost: float = 0.0) -> int:
    """The draft length ``k`` (0: none) with the most expected tokens per unit cost, ``(1 + sum_{i<=k} a_i) /
    (c(k + 1) + draft_cost)``, from a per-position acceptance profile ``a_i`` (the share of rounds that drafted
    position ``i`` and accepted it: vLLM's ``num_accepted_tokens_per_pos / num_drafts``)."""
    best, rate, expected = 0, 1.0, 0.0
    for k, a in enumerate(acceptance, start=1):
        expected += float(a)
        if (1.0 + expected) / (verify_cost(k + 1) + draft_cost) > rate:
            best, rate = k, (1.0 + expected) / (verify_cost(k + 1) + draft_cost)
    return best


class WorkloadLength(Controller):
    """vLLM's dynamic speculative decoding at batch size 1 (``spec_decode/dynamic/generate_config.py``): one draft
    length per workload, chosen offline from the per-position acceptance profile of other requests and the cost of a
    verify (``profile_length``). ``lengths``: the length per workload (``RequestState.category``); ``default`` for a
    workload it has none for. Length 0 does not call the drafter."""

    def __init__(self, lengths: Mapping[str, int], default: int):
        self.lengths, self.default = {str(k): int(v) for k, v in lengths.items()}, int(default)
        self._length = self.default

    def begin_request(self, state) -> None:
        self._length = self.lengths.get(str(getattr(state, "category", "")), self.default)

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        return {"draft": self._length > 0, "length": self._length}

    def depth(self, proposal, tree, decision) -> int:
        return decision["length"]


class EntropyGate(Controller):
    """The entropy gate asked for on vLLM (#54082), SGLang (#36715) and llama.cpp (#27821): draft the whole tree or
    nothing from the target's entropy at the last committed position, with hysteresis: drafting stops once it exceeds
    ``off`` nats and restarts once it falls below ``on`` (``on`` <= ``off``). The requests give no constants: ``on``
    1.0 and ``off`` 2.0 are ours. Starts drafting; an unknown entropy keeps the state."""

    def __init__(self, on: float = 1.0, off: float = 2.0):
        if on > off:
            raise ValueError(f"the entropy gate needs on <= off (hysteresis), got on={on}, off={off}")
        self.on, self.off = float(on), float(off)

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None) -> dict:
        drafting = _last_decision(history)[0].get("draft", True)
        h = float(entropies[n_output - 1]) if 0 < n_output <= len(entropies) else math.nan
        if not math.isnan(h):
            drafting = h < self.on or (drafting and h <= self.off)
        return {"draft": bool(drafting), "entropy": h}

    def observe(self, entropies, n_output, target_logits) -> None:
        """Append the entropies of the newly committed positions (only the last is computed; NaN before it)."""
        if target_logits is None or len(entropies) >= n_output or n_output - len(entropies) != target_logits.shape[0]:
            return
        entropies.extend([math.nan] * (target_logits.shape[0] - 1) + row_entropies(target_logits[-1:]))


class LawStopProbability(LawPolicy):
    """An ablation of our law policy, not a field controller: SpecDec++'s stopping rule (Huang et al., arXiv
    2405.19715: stop drafting once the predicted probability that some draft so far is rejected exceeds a threshold
    ``h``) with our law in place of its trained head. The law policy's decision before drafting; after drafting, the
    best path's per-depth acceptance ``a(H_w, d)^(1-w) q^w`` (the law blended with the drafter's confidence, as
    ``LawPolicy.plan``) and its survival ``S_d``; the tree is cut at the deepest ``d`` with ``1 - S_d <= h``.
    ``threshold``: ``h`` (default 0.7, ours; the paper tunes it per setting). The in-request calibration, where the
    parameters have one, scales the survival as it scales ``LawPolicy.plan``'s path probabilities."""

    information = BEFORE_VERIFYING

    def __init__(self, params: dict, verify_cost: VerifyCost | None = None, threshold: float = 0.7):
        super().__init__(params, verify_cost)
        self.threshold = float(threshold)

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        if tree.n_nodes == 0:
            decision.update(budget=0)
            return Tree.empty(), 0.0
        survival, depth, raw, w = 1.0, 0, 0.0, self.confidence_weight
        scale = decision.get("plan_calibration", 1.0)  # the in-request calibration, as LawPolicy.plan applies it
        for d, q in enumerate(_top_probs(proposal, tree.max_depth), start=1):
            survival *= min(1.0, self._at_depth(decision["acceptance"], d) ** (1 - w) * q ** w)
            if 1.0 - min(1.0, scale * survival) > self.threshold:
                break
            depth, raw = d, raw + survival
        chosen = depth_cut(tree, depth) if depth else Tree.empty()
        decision.update(budget=chosen.n_nodes, stop_depth=depth, expected_raw=raw,
                        law_expected_raw=self.law_expected_depth(decision["acceptance"], depth))
        return chosen, (expected_accepted(proposal, chosen) if chosen.n_nodes else 0.0)

    def to_config(self) -> dict:
        return {**super().to_config(), "stop_threshold": self.threshold}
