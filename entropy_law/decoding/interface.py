"""The narrow interface of the decoding layer to its draft sources: the ``Drafter`` contract (two methods), the
per-depth proposal it returns, and what a trace run records about a drafter. The decoder never branches on a
drafter's type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class DraftProposal:
    """Per-depth candidate tokens, best first, with log-probabilities (row ``d``: depth ``d + 1`` after the root);
    ``logits``: the full per-depth distribution, for recording only. ``depth == 0``: do not draft this round."""

    tokens: torch.LongTensor  # [depth, K] candidate token ids, best first
    logprobs: torch.FloatTensor  # [depth, K] their log-probabilities (-inf pads unused slots)
    logits: torch.FloatTensor | None = None  # [depth, V] full per-depth distribution, if any

    @property
    def depth(self) -> int:
        return int(self.tokens.shape[0])

    @staticmethod
    def empty() -> "DraftProposal":
        return DraftProposal(tokens=torch.zeros((0, 1), dtype=torch.long),
                             logprobs=torch.zeros((0, 1), dtype=torch.float32))


@runtime_checkable
class Drafter(Protocol):
    """A draft source: two methods, the decoder calls nothing else. ``feature_layers``: target layers it reads (one
    row per committed position, concatenated; empty: none); ``block_size``: drafts + 1."""

    drafter_id: str
    feature_layers: tuple[int, ...]
    block_size: int

    def begin(self, prompt_ids: Sequence[int], prompt_features: torch.Tensor | None) -> None:
        """Start a new request: the prompt's token ids and, if requested, its target features."""

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None) -> DraftProposal:
        """Propose drafts after ``tokens`` (prompt + committed output + the pending root); ``new_features``: the
        target features of committed positions not yet given (or ``None``)."""


class PolicyDefaults:
    """The no-op defaults of a ``round.RoundPolicy`` (the gates' and the controllers' base; here, not in ``round``,
    which imports the gates): used as bound, nothing per request, no entropies tracked."""

    def bind(self, adapter, drafter):
        return self

    def begin_request(self, state) -> None:
        return None

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        return None


def drafter_run_config(drafter) -> dict:
    """A run's ``drafter_config``: the drafter's ``config`` plus its ``provenance`` (a checkpoint's name, SHA-256)."""
    if drafter is None:
        return {}
    return {**dict(getattr(drafter, "config", {}) or {}), **dict(getattr(drafter, "provenance", {}) or {})}
