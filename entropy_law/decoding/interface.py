"""The narrow interface of the decoding layer to its draft sources: what a drafter is and what it proposes.

Known here: the drafter contract (two methods, frozen), the per-depth proposal it returns, and what a trace
run records about a drafter. Not known here: how trees are built from a proposal (``tree``), how the
target verifies them (``adapter``), what a round is and what observers receive (``round``), or how rounds
are written to disk (``entropy_law.traces``). Every drafter (n-gram, block drafter, a user's own) plugs in through
``Drafter``; the decoder never branches on a drafter's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class DraftProposal:
    """Per-depth candidate tokens with log-probabilities for the next ``depth`` positions.

    Row ``d`` (0-based) holds candidates for the token at depth ``d + 1`` after the root (the pending
    token). Candidates are sorted by log-probability, best first. A chain is the special case of one
    candidate per depth. ``logits`` (optional, ``[depth, V]``) is the drafter's full distribution per
    depth, used only for recording drafter entropy and ranks; drafters without one leave it ``None``.
    An empty proposal (``depth == 0``) means "do not draft this round".
    """

    tokens: torch.LongTensor  # [depth, K] candidate token ids, best first
    logprobs: torch.FloatTensor  # [depth, K] their log-probabilities (-inf pads unused slots)
    logits: torch.FloatTensor | None = None  # [depth, V] full per-depth distribution, if any

    @property
    def depth(self) -> int:
        return int(self.tokens.shape[0])

    @staticmethod
    def empty() -> "DraftProposal":
        return DraftProposal(
            tokens=torch.zeros((0, 1), dtype=torch.long),
            logprobs=torch.zeros((0, 1), dtype=torch.float32),
        )


@runtime_checkable
class Drafter(Protocol):
    """A draft source. Two methods; the decoder calls nothing else.

    ``feature_layers``: indices of target decoder layers whose output hidden states the drafter
    reads (empty tuple: none). The decoder captures them and passes them in, one row per committed
    position, concatenated along features (``[rows, len(feature_layers) * hidden]``).
    ``block_size``: the most tokens one round can commit with this drafter (drafts + 1).
    """

    drafter_id: str
    feature_layers: tuple[int, ...]
    block_size: int

    def begin(self, prompt_ids: Sequence[int], prompt_features: torch.Tensor | None) -> None:
        """Start a new request: the prompt's token ids and, if requested, its target features."""

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None) -> DraftProposal:
        """Propose drafts after ``tokens`` (prompt + committed output + the pending root token).

        ``new_features`` holds the target features of committed positions the drafter has not yet
        been given (the accepted path of the last round, root included), or ``None``.
        """


def drafter_run_config(drafter) -> dict:
    """What a trace run records about ``drafter`` (run metadata ``drafter_config``): its ``config`` (constructor
    arguments or architecture) plus its ``provenance`` where it has one (a loaded checkpoint's file name and
    SHA-256, so two checkpoints of one architecture are told apart)."""
    if drafter is None:
        return {}
    return {**dict(getattr(drafter, "config", {}) or {}), **dict(getattr(drafter, "provenance", {}) or {})}
