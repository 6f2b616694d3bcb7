"""One proposal from two drafters: the n-gram drafter's matches and the block drafter's candidates.

``HybridDrafter`` runs the block forward only when the n-gram chain's expected accepted drafts are below
``skip_block_at`` (or a policy routes the round, ``route``); the proposals are merged per depth
(``merge_proposals``). Features committed while the block forward was skipped reach it at its next call.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch

from entropy_law.decoding.interface import DraftProposal, drafter_run_config


def chain_confidence(proposal: DraftProposal) -> float:
    """Expected accepted drafts of the proposal's top-1 chain under its own probabilities."""
    if proposal.depth == 0:
        return 0.0
    top = proposal.logprobs[:, 0].to(torch.float64).exp()
    return float(torch.cumprod(top, dim=0).sum())


def merge_proposals(first: DraftProposal, second: DraftProposal, *, weight: float, top_k: int) -> DraftProposal:
    """Per depth: the union of both proposals' candidates scored by ``weight p_first + (1 - weight) p_second``,
    best first (ties: ``first``'s order), at most ``top_k``; ``-inf`` pads unused slots. A proposal of depth 0
    leaves the other unchanged."""
    if first.depth == 0 or second.depth == 0:  # one drafter proposes nothing: the other's proposal as it is
        return second if first.depth == 0 else first
    depth = max(first.depth, second.depth)
    rows: list[list[tuple[float, int]]] = []
    for d in range(depth):
        scores: dict[int, float] = {}  # in order of first appearance
        for proposal, w in ((first, weight), (second, 1.0 - weight)):
            if d >= proposal.depth:
                continue
            for token, logprob in zip(proposal.tokens[d].tolist(), proposal.logprobs[d].tolist()):
                if logprob != -math.inf:
                    scores[token] = scores.get(token, 0.0) + w * math.exp(logprob)
        ranked = sorted(((p, i, t) for i, (t, p) in enumerate(scores.items()) if p > 0), key=lambda x: (-x[0], x[1]))
        rows.append([(p, t) for p, _, t in ranked[:top_k]])
    rows = list(itertools.takewhile(bool, rows))  # a depth without candidates ends the proposal
    kept = len(rows)
    if not rows:
        return DraftProposal.empty()
    width = max(len(row) for row in rows)
    tokens = torch.zeros((kept, width), dtype=torch.long)
    logprobs = torch.full((kept, width), -math.inf, dtype=torch.float32)
    for d, row in enumerate(rows):
        used = {t for _, t in row}
        fillers = (t for t in range(width + len(row) + 1) if t not in used)  # distinct ids for the padding
        for j in range(width):
            if j < len(row):
                tokens[d, j], logprobs[d, j] = row[j][1], math.log(min(row[j][0], 1.0))
            else:
                tokens[d, j] = next(fillers)
    return DraftProposal(tokens=tokens, logprobs=logprobs)


class HybridDrafter:
    """The n-gram drafter and the block drafter behind one ``Drafter`` (module docstring); ``skip_block_at``:
    ``math.inf`` never skips; ``block_calls`` / ``block_skips`` count the decisions."""

    ROUTES = ("ngram", "block")

    drafter_id = "hybrid"

    def __init__(self, ngram, block, *, ngram_weight: float = 0.5, skip_block_at: float = 2.0, top_k: int = 8):
        if not 0.0 <= ngram_weight <= 1.0:
            raise ValueError(f"ngram_weight must lie in [0, 1], got {ngram_weight}")
        if not skip_block_at >= 0:
            raise ValueError(f"skip_block_at must be >= 0 (math.inf: never skip), got {skip_block_at}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.ngram, self.block = ngram, block
        self.ngram_weight, self.skip_block_at, self.top_k = float(ngram_weight), float(skip_block_at), int(top_k)
        self.feature_layers = tuple(getattr(block, "feature_layers", ()))
        self.block_size = max(int(ngram.block_size), int(block.block_size))
        self.pending: torch.Tensor | None = None
        self.block_calls = self.block_skips = 0
        self._route: str | None = None
        self._peeked: tuple[int, DraftProposal] | None = None  # (context length, the n-gram proposal there)

    @property
    def config(self) -> dict:
        return {"ngram": drafter_run_config(self.ngram), "block": drafter_run_config(self.block),
                "ngram_weight": self.ngram_weight, "skip_block_at": self.skip_block_at, "top_k": self.top_k}

    def begin(self, prompt_ids: Sequence[int], prompt_features: torch.Tensor | None) -> None:
        self.ngram.begin(prompt_ids, None)
        self.block.begin(prompt_ids, prompt_features)
        self.pending = None
        self._route = None
        self._peeked = None

    def with_block(self, block) -> "HybridDrafter":
        """The same settings and n-gram drafter around another block drafter (e.g. a ``PrecomputedBlockDrafter``)."""
        return HybridDrafter(self.ngram, block, ngram_weight=self.ngram_weight, skip_block_at=self.skip_block_at,
                             top_k=self.top_k)

    def ngram_proposal(self, tokens: Sequence[int]) -> DraftProposal:
        """The n-gram proposal after ``tokens``, made once per round: a policy may look before ``propose`` uses it."""
        if self._peeked is None or self._peeked[0] != len(tokens):
            self._peeked = (len(tokens), self.ngram.propose(tokens, None))
        return self._peeked[1]

    def route(self, which: str | None) -> None:
        """The drafter of the next ``propose`` only: ``"ngram"`` (its proposal alone, the block forward skipped),
        ``"block"`` (the block forward, merged with the n-gram proposal) or ``None`` (``skip_block_at`` decides)."""
        if which is not None and which not in self.ROUTES:
            raise ValueError(f"route must be one of {self.ROUTES} or None, got {which!r}")
        self._route = which

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None) -> DraftProposal:
        if new_features is not None:
            self.pending = new_features if self.pending is None else torch.cat([self.pending, new_features])
        route, self._route = self._route, None
        ngram, self._peeked = self.ngram_proposal(tokens), None
        if route is None:
            skip = ngram.depth > 0 and chain_confidence(ngram) >= self.skip_block_at
        else:
            skip = route == "ngram"
        if skip:
            self.block_skips += 1
            return ngram
        block = self.block.propose(tokens, self.pending)
        self.pending = None
        self.block_calls += 1
        return merge_proposals(ngram, block, weight=self.ngram_weight, top_k=self.top_k)
