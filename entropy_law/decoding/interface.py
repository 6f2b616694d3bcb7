"""The narrow interfaces of the decoding layer: what a drafter proposes and what an observer receives.

Known here: the drafter contract (two methods, frozen), the per-depth proposal it returns, and the one
small dataclass an observer gets per verify round. Not known here: how trees are built from a
proposal (``tree``), how the target verifies them (``adapter``), or how rounds are written to disk
(``entropy_law.traces``). Every drafter (n-gram, block drafter, a user's own) plugs in through
``Drafter``; the decoder never branches on a drafter's type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class RoundRecord:
    """What an observer receives after each verify round (one per round, small).

    ``target_logits[j]`` is the target's fp32 logit row at depth ``j`` of the committed path (row 0
    at the root); it produced the committed token at depth ``j + 1``. ``draft`` is the proposal the
    tree was built from (``None`` when the round did not draft). ``committed_ids`` are the tokens
    actually kept (already cut at EOS / the token budget).
    """

    request_id: str
    round_index: int
    start_position: int  # output position of committed_ids[0]
    context_len: int  # target cache length before the round (= absolute position of the root)
    block_size: int
    tree_nodes: int
    tree_depth: int
    accepted: int  # tau
    committed_ids: list[int]
    ends_at_leaf: bool  # True: the last committed token followed a node without children (bonus)
    target_logits: torch.Tensor  # [len(committed_ids), V] fp32
    draft: DraftProposal | None
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    extra: dict = field(default_factory=dict)


class Observer(Protocol):
    """Receives rounds and request boundaries. Must not change what is decoded."""

    def on_request_start(self, request_id: str, info: dict) -> None: ...

    def on_round(self, record: RoundRecord) -> None: ...

    def on_request_end(self, request_id: str, info: dict) -> None: ...


def drafter_run_config(drafter) -> dict:
    """What a trace run records about ``drafter`` (run metadata ``drafter_config``): its ``config`` (constructor
    arguments or architecture) plus its ``provenance`` where it has one (a loaded checkpoint's file name and
    SHA-256, so two checkpoints of one architecture are told apart)."""
    if drafter is None:
        return {}
    return {**dict(getattr(drafter, "config", {}) or {}), **dict(getattr(drafter, "provenance", {}) or {})}
