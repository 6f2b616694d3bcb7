"""Prompt-lookup (n-gram) drafting with self-calibrated probabilities.

Earlier occurrences of the context's last n tokens give per-depth candidates; per (match length n, depth d) the
hit rate per rank, shrunk towards n's pooled rate, gives the log-probabilities. The counts restart with every
request unless ``keep_calibration``, so proposals depend only on the request's context, as replay needs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from entropy_law.decoding.interface import DraftProposal


@dataclass
class _PendingProposal:
    """A proposal whose outcome is not fully known yet (its committed continuation is still short)."""

    root_position: int  # index of the root token in the context
    match_len: int  # n of the best match
    candidate_ranks: list[dict[int, int]]  # per depth: token -> rank
    next_depth: int = 1  # first depth not yet checked


class NgramDrafter:
    """Prompt-lookup drafter: copies what followed earlier occurrences of the context's last n-gram.

    ``max_ngram`` / ``min_ngram``: n-gram lengths tried, longest first; ``block_size``: drafts + 1; ``max_matches``:
    occurrences feeding the candidates (1: a chain); ``min_path_prob``: the proposal ends at the first depth whose
    best path probability falls below it. ``prior_*``: the prior (``prior_rates``) and its pseudo-trials;
    ``pool_weight``: pseudo-trials towards the pooled rate; ``keep_calibration``: keep counts across requests."""

    drafter_id = "ngram"
    feature_layers: tuple[int, ...] = ()

    def __init__(self, *, max_ngram: int = 4, min_ngram: int = 1, block_size: int = 11, max_matches: int = 4,
                 min_path_prob: float = 0.05, prior_hit_rate: float = 0.25, prior_miss_decay: float = 0.6,
                 prior_weight: float = 2.0, pool_weight: float = 2.0, keep_calibration: bool = False):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (at least one draft token), got {block_size}")
        if max_matches < 1:
            raise ValueError(f"max_matches must be >= 1, got {max_matches}")
        if not 0.0 <= min_path_prob < 1.0:
            raise ValueError(f"min_path_prob must be in [0, 1), got {min_path_prob}")
        if not 0.0 < prior_hit_rate < 1.0 or not 0.0 < prior_miss_decay <= 1.0 or prior_weight <= 0 \
                or pool_weight < 0:
            raise ValueError("need 0 < prior_hit_rate < 1, 0 < prior_miss_decay <= 1, prior_weight > 0 and "
                             "pool_weight >= 0")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)
        self.block_size = int(block_size)
        self.max_matches = int(max_matches)
        self.min_path_prob = float(min_path_prob)
        self.prior_hit_rate = float(prior_hit_rate)
        self.prior_miss_decay = float(prior_miss_decay)
        self.prior_weight = float(prior_weight)
        self.pool_weight = float(pool_weight)
        self.keep_calibration = bool(keep_calibration)
        self._reset_calibration()
        self._reset_context([])

    @property
    def config(self) -> dict:  # the constructor's arguments (the run's drafter_config)
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram, "block_size": self.block_size,
                "max_matches": self.max_matches, "min_path_prob": self.min_path_prob,
                "prior_hit_rate": self.prior_hit_rate, "prior_miss_decay": self.prior_miss_decay,
                "prior_weight": self.prior_weight, "pool_weight": self.pool_weight,
                "keep_calibration": self.keep_calibration}

    @property
    def max_drafts(self) -> int:
        return self.block_size - 1

    def begin(self, prompt_ids: Sequence[int], prompt_features: torch.Tensor | None = None) -> None:
        """Start a request: forget the previous context (and the counts unless ``keep_calibration``)."""
        if not self.keep_calibration:
            self._reset_calibration()
        self._reset_context(_as_int_list(prompt_ids))

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None = None) -> DraftProposal:
        """Candidates for the ``block_size - 1`` positions after ``tokens`` (its last token is the root)."""
        self._extend_context(tokens)
        n_tokens = len(self._tokens)
        if n_tokens == 0:
            return DraftProposal.empty()
        self._index_until(n_tokens - 1)  # every position but the root's own
        match_len, match_ends = self._find_matches()
        if not match_ends:
            return DraftProposal.empty()
        candidates = self._candidates(match_ends)
        self._pending.append(_PendingProposal(
            root_position=n_tokens - 1, match_len=match_len,
            candidate_ranks=[{tok: rank for rank, tok in enumerate(row)} for row in candidates],
        ))
        return self._proposal(candidates, match_len)

    def _reset_calibration(self) -> None:
        shape = (self.max_ngram + 1, self.max_drafts)
        self._trials = np.zeros(shape)  # [n, depth-1]
        self._hits = np.zeros(shape + (self.max_matches,))  # [n, depth-1, rank]

    def prior_rates(self, match_len: int) -> np.ndarray:
        """``[rank]`` prior hit rates for best matches of length ``match_len``: rank 0 ``p0 = 1 - (1 -
        prior_hit_rate) * prior_miss_decay ** (match_len - 1)``, rank r >= 1 ``min(p0, 1 - p0) / 2 ** r``."""
        rank0 = 1.0 - (1.0 - self.prior_hit_rate) * self.prior_miss_decay ** (match_len - 1)
        rates = min(rank0, 1.0 - rank0) / 2.0 ** np.arange(self.max_matches)
        rates[0] = rank0
        return rates

    def hit_rates(self, match_len: int) -> np.ndarray:
        """``[depth, rank]`` hit rates for best matches of length ``match_len``, shrunk as the module says."""
        hits, trials = self._hits[match_len], self._trials[match_len]  # [depth, rank], [depth]
        pooled = (hits.sum(axis=0) + self.prior_weight * self.prior_rates(match_len)) / (
            trials.sum() + self.prior_weight)  # [rank]
        return (hits + self.pool_weight * pooled[None, :]) / (trials[:, None] + self.pool_weight)

    def calibration_counts(self) -> dict[str, np.ndarray]:
        """Copies of the raw counts: ``trials[n, depth-1]`` and ``hits[n, depth-1, rank]``."""
        return {"trials": self._trials.copy(), "hits": self._hits.copy()}

    def _resolve_pending(self) -> None:
        """Score pending proposals against the committed tokens known now; drop finished ones."""
        n_tokens = len(self._tokens)
        still_pending = []
        for pending in self._pending:
            while pending.next_depth <= len(pending.candidate_ranks):
                depth = pending.next_depth
                position = pending.root_position + depth
                if position >= n_tokens:  # not committed yet: look again later
                    still_pending.append(pending)
                    break
                self._trials[pending.match_len, depth - 1] += 1
                rank = pending.candidate_ranks[depth - 1].get(self._tokens[position])
                pending.next_depth += 1
                if rank is None:
                    break
                self._hits[pending.match_len, depth - 1, rank] += 1
        self._pending = still_pending

    def _reset_context(self, tokens: list[int]) -> None:
        self._tokens: list[int] = list(tokens)
        self._indexed = 0  # positions < _indexed are in the index
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._pending: list[_PendingProposal] = []

    def _extend_context(self, tokens) -> None:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.reshape(-1).tolist()
        known = len(self._tokens)
        # the prefix check is one C-level list comparison; only the new tail is converted
        if len(tokens) >= known and list(tokens[:known]) == self._tokens:
            self._tokens.extend(int(t) for t in tokens[known:])
            self._resolve_pending()
        else:  # not a continuation of what we saw (a new request without begin): start over
            self._reset_context(_as_int_list(tokens))

    def _index_until(self, end: int) -> None:
        """Add the n-grams ending at positions ``_indexed .. end - 1``."""
        toks = self._tokens
        for position in range(self._indexed, end):
            for n, table in self._index.items():
                if position - n + 1 >= 0:
                    table.setdefault(tuple(toks[position - n + 1:position + 1]), []).append(position)
        self._indexed = max(self._indexed, end)

    def _find_matches(self) -> tuple[int, list[int]]:
        """(best match length, ends of up to ``max_matches`` matches: longer n-grams first, then most recent)."""
        toks = self._tokens
        n_tokens = len(toks)
        ends: list[int] = []
        seen: set[int] = set()
        best_len = 0
        for n in range(min(self.max_ngram, n_tokens), self.min_ngram - 1, -1):
            occurrences = self._index[n].get(tuple(toks[n_tokens - n:]))
            if not occurrences:
                continue
            for end in reversed(occurrences):
                if end not in seen:
                    seen.add(end)
                    ends.append(end)
                    best_len = best_len or n
                    if len(ends) == self.max_matches:
                        return best_len, ends
        return best_len, ends

    def _candidates(self, match_ends: list[int]) -> list[list[int]]:
        """Per depth, distinct candidate tokens: the best match's first, then by votes, then match order. A match
        ending at ``j`` predicts ``tokens[j + d]``, periodically past the root (period ``root - j``)."""
        toks = self._tokens
        root = len(toks) - 1
        continuations = []
        for end in match_ends:
            period = root - end
            continuations.append([toks[end + (d - 1) % period + 1] for d in range(1, self.max_drafts + 1)])
        rows = []
        for depth in range(self.max_drafts):
            votes = Counter(cont[depth] for cont in continuations)  # insertion order = match order
            first = continuations[0][depth]
            rows.append([first] + sorted((tok for tok in votes if tok != first), key=lambda tok: -votes[tok]))
        return rows

    def _proposal(self, candidates: list[list[int]], match_len: int) -> DraftProposal:
        rates = self.hit_rates(match_len)  # [depth, rank]
        width = max(len(row) for row in candidates)
        tokens = np.zeros((len(candidates), width), dtype=np.int64)
        logprobs = np.full((len(candidates), width), -np.inf, dtype=np.float32)
        path_prob = 1.0
        depth_kept = 0
        for d, row in enumerate(candidates):
            probs = np.minimum.accumulate(rates[d, :len(row)])  # rank 0 stays the most probable
            path_prob *= probs[0]
            if path_prob < self.min_path_prob:
                break
            used = set(row)  # padding slots get distinct unused ids with probability 0
            fillers = (t for t in range(len(row) + width) if t not in used)
            tokens[d] = row + [next(fillers) for _ in range(width - len(row))]
            logprobs[d, :len(row)] = np.log(probs)
            depth_kept = d + 1
        if depth_kept == 0:
            return DraftProposal.empty()
        return DraftProposal(tokens=torch.from_numpy(tokens[:depth_kept]),
                             logprobs=torch.from_numpy(logprobs[:depth_kept]))


def _as_int_list(tokens) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        return [int(t) for t in tokens.reshape(-1).tolist()]
    return [int(t) for t in tokens]
