"""Observers that turn decoding rounds into trace rows (``RecorderObserver``: a ``Round`` -> one
``TraceRecorder.log_round``), and the target statistics they record (torch, fp32 over the full vocabulary; the
trace layer's numpy ``target_stats_from_logits`` agrees). Observers never change what is decoded.
"""

from __future__ import annotations

import numpy as np
import torch

from entropy_law.decoding.round import Round
from entropy_law.traces.schema import POLICY_COLUMNS
from entropy_law.traces.stats import TARGET_STAT_KEYS


def _softmax_and_entropy(z: torch.Tensor, shift: torch.Tensor):
    """``p = softmax(z)`` and the Shannon entropy per row of fp32 logits ``z [rows, V]``, with one
    ``exp`` pass; ``shift [rows, 1]`` is the row maximum. ``0 log 0 = 0`` (masked ``-inf`` logits)."""
    shifted = z - shift
    p = shifted.exp()
    total = p.sum(dim=-1, keepdim=True)
    p.div_(total)
    logp = shifted.sub_(total.log())
    entropy = -(p * logp).nan_to_num_(nan=0.0).sum(dim=-1)  # p = 0, log p = -inf: nan -> 0
    return p, entropy


@torch.inference_mode()
def distribution_stats(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row statistics of ``softmax(logits)`` for logits ``[rows, V]`` in fp32: ``entropy_nats`` = -sum p log p;
    ``renyi2_nats`` = -log sum p^2; ``top1_prob``, ``top2_prob``; ``logit_gap`` = z_(1) - z_(2)."""
    z = logits.float().reshape(-1, logits.shape[-1])  # a single row as [1, V]
    top_logits, top_index = z.topk(2, dim=-1)
    p, entropy = _softmax_and_entropy(z, top_logits[:, :1])
    top_p = p.gather(-1, top_index)
    stats = {
        "entropy_nats": entropy,
        "renyi2_nats": -torch.log((p * p).sum(dim=-1)),
        "top1_prob": top_p[:, 0],
        "top2_prob": top_p[:, 1],
        "logit_gap": top_logits[:, 0] - top_logits[:, 1],
    }
    return {key: stats[key] for key in TARGET_STAT_KEYS}  # the trace schema's keys, in its order


def row_entropies(logits: torch.Tensor) -> list[float]:
    """Shannon entropy (nats, fp32 softmax over the full vocabulary) of each row of ``[rows, V]`` logits."""
    z = logits.float().reshape(-1, logits.shape[-1])
    return _softmax_and_entropy(z, z.amax(dim=-1, keepdim=True))[1].tolist()


@torch.inference_mode()
def committed_token_draft_stats(draft_logits: torch.Tensor, committed_ids) -> dict[str, torch.Tensor]:
    """Per committed token ``d``, from row ``d`` of ``draft_logits [depth, V]``: ``prob``, ``rank`` (tokens with a
    strictly larger logit), the row's ``entropy_nats`` and ``top1_prob``; NaN deeper than the draft."""
    ids = torch.as_tensor(list(committed_ids), dtype=torch.long)
    n, rows = len(ids), min(len(ids), int(draft_logits.shape[0]))
    out = {key: torch.full((n,), float("nan")) for key in ("prob", "rank", "entropy_nats", "top1_prob")}
    if rows:
        z = draft_logits[:rows].float()
        chosen = z.gather(-1, ids[:rows, None])
        out["rank"][:rows] = (z > chosen).sum(dim=-1).float()
        p, entropy = _softmax_and_entropy(z, z.amax(dim=-1, keepdim=True))
        out["prob"][:rows] = p.gather(-1, ids[:rows, None])[:, 0]
        out["entropy_nats"][:rows] = entropy
        out["top1_prob"][:rows] = p.amax(dim=-1)
    return out


def _numpy_stats(stats: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy().astype(np.float32) for key, value in stats.items()}


class RecorderObserver:
    """Feeds a ``TraceRecorder`` from decoder events: ``target_stats``, never raw logits, and the drafter's
    ``draft_stats`` where it returned full distributions, else its candidates and log-probabilities."""

    def __init__(self, recorder):
        self.recorder = recorder

    def on_request_start(self, request_id: str, info: dict) -> None:
        self.recorder.begin_request(request_id, category=info.get("category", ""), dataset=info.get("dataset", ""),
                                    question_id=info.get("question_id", ""), prompt_tokens=int(info["prompt_tokens"]),
                                    image_tokens=int(info.get("image_tokens", 0)), prompt_ids=info.get("prompt_ids"))

    def on_round(self, record: Round) -> None:
        draft = record.draft
        draft_kwargs = {}
        if draft is not None and draft.depth > 0:
            if draft.logits is not None:
                draft_kwargs["draft_stats"] = _numpy_stats(committed_token_draft_stats(draft.logits,
                                                                                      record.committed_ids))
            else:
                rows = min(draft.depth, len(record.committed_ids))  # depth d + 1 <-> committed token d
                draft_kwargs["draft_candidates"] = draft.tokens[:rows].cpu().numpy()
                draft_kwargs["draft_logprobs"] = draft.logprobs[:rows].float().cpu().numpy()
        self.recorder.log_round(
            record.request_id, round_index=record.round_index, start_position=record.start_position,
            context_len=record.context_len, block_size=record.block_size, tree_nodes=record.tree_nodes,
            tree_depth=record.tree_depth, accepted=record.accepted, token_ids=list(record.committed_ids),
            ends_at_leaf=record.ends_at_leaf, target_stats=_numpy_stats(distribution_stats(record.target_logits)),
            draft_ms=record.draft_ms, verify_ms=record.verify_ms, overhead_ms=record.overhead_ms, **draft_kwargs,
            **({"policy": round_columns(record.policy)} if record.policy is not None else {}))

    def on_request_end(self, request_id: str, info: dict) -> None:
        self.recorder.end_request(request_id, new_tokens=int(info["new_tokens"]), stop_reason=info["stop_reason"],
                                  prefill_ms=float(info["prefill_ms"]), decode_ms=float(info["decode_ms"]),
                                  decode_cpu_ms=info.get("decode_cpu_ms"))


def round_columns(decision: dict | None) -> dict:
    """The round's policy columns of the trace (``traces.schema.POLICY_COLUMNS``); none without a policy."""
    if decision is None:
        return {}
    values = (decision.get("entropy"), decision.get("window_entropy"), decision.get("confidence"),
              decision.get("expected"), decision.get("budget", 0), bool(decision.get("draft")),
              decision.get("calibration"), decision.get("plan_calibration"), decision.get("context_match"),
              decision.get("route"))
    return dict(zip(POLICY_COLUMNS, values))
