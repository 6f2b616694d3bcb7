"""Per-token statistics of a next-token distribution: how the trace columns ``target_*`` and ``draft_*`` are computed
from logits (or a drafter's candidates), and the context's copyability (``context_match``). Entropies in nats over the
full vocabulary (fp32 log-softmax, temperature 1). Inputs: arrays or torch tensors; torch is never imported."""

from __future__ import annotations

from typing import Sequence

import numpy as np

TARGET_STAT_KEYS = ("entropy_nats", "renyi2_nats", "top1_prob", "top2_prob", "logit_gap")
DRAFT_STAT_KEYS = ("prob", "rank", "entropy_nats", "top1_prob")

# Rows processed at once; bounds the temporary [rows, V] arrays.
_CHUNK_ROWS = 64


def _as_float32_2d(logits, name: str) -> np.ndarray:
    if hasattr(logits, "detach"):  # a torch tensor: leave the autograd graph, move to host
        logits = logits.detach().cpu().float().numpy()
    array = np.asarray(logits, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, vocab]; got shape {tuple(array.shape)}")
    if array.shape[1] < 2:
        raise ValueError(f"{name} needs a vocabulary of at least 2 entries; got shape {tuple(array.shape)}")
    for bad, problem in ((np.isnan, "contains NaN (first in row {}); check the model's output"),
                         (np.isposinf, "contains +inf (first in row {}); check the model's output"),
                         (lambda a: ~np.isfinite(a.max(axis=1, keepdims=True)),
                          "row {} is entirely -inf: no token has probability > 0")):
        rows = np.flatnonzero(bad(array).any(axis=1))
        if rows.size:
            raise ValueError(f"{name} " + problem.format(int(rows[0])))
    return array


def _log_softmax(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (shifted logits z - max, log-sum-exp of the shifted logits, log-probabilities)."""
    shifted = chunk - chunk.max(axis=1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float32))
    return shifted, lse, shifted - lse


def _entropy_from_logprobs(logp: np.ndarray) -> np.ndarray:
    p = np.exp(logp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * logp, np.float32(0))
    return np.maximum(-terms.sum(axis=1, dtype=np.float32), np.float32(0))


def target_stats_from_logits(logits) -> dict[str, np.ndarray]:
    """Float32 arrays of length ``rows`` for ``logits`` ``[rows, V]``: ``entropy_nats`` (Shannon), ``renyi2_nats``
    (-log sum p^2), ``top1_prob``, ``top2_prob`` and ``logit_gap`` (z_(1) - z_(2)). ``-inf`` logits have p = 0."""
    array = _as_float32_2d(logits, "target logits")
    rows = array.shape[0]
    out = {key: np.empty(rows, dtype=np.float32) for key in TARGET_STAT_KEYS}
    for lo in range(0, rows, _CHUNK_ROWS):
        chunk = array[lo : lo + _CHUNK_ROWS]
        shifted, lse, logp = _log_softmax(chunk)
        top2 = -np.partition(-shifted, 1, axis=1)[:, :2]  # [n, 2]: largest (= 0) and second largest
        p = np.exp(logp)
        out["entropy_nats"][lo : lo + len(chunk)] = _entropy_from_logprobs(logp)
        collision = np.square(p).sum(axis=1, dtype=np.float32)
        out["renyi2_nats"][lo : lo + len(chunk)] = np.maximum(-np.log(collision), np.float32(0))
        out["top1_prob"][lo : lo + len(chunk)] = np.exp(top2[:, 0] - lse[:, 0])
        out["top2_prob"][lo : lo + len(chunk)] = np.exp(top2[:, 1] - lse[:, 0])
        with np.errstate(invalid="ignore"):
            gap = top2[:, 0] - top2[:, 1]  # +inf when only one token has probability > 0
        out["logit_gap"][lo : lo + len(chunk)] = gap
    return out


def draft_stats(draft_logits=None, committed_ids=(), candidates=None, candidate_logprobs=None) -> dict[str, np.ndarray]:
    """Drafter statistics of each committed token of one round, depth ``d`` scored against row ``d - 1``.

    With ``draft_logits`` ``[depth, V]``: ``prob`` of the committed token, ``rank`` (tokens with a larger logit) and
    ``entropy_nats``. With ``candidates`` ``[depth, K]`` (best first) and optional ``candidate_logprobs`` (``-inf``:
    unused): ``rank`` among them (-1: absent) and ``prob``, no entropy. ``top1_prob``: the drafter's probability of its
    own best proposal. Arrays of length ``len(committed_ids)``, ``rank`` float64, the others float32; null is NaN.
    """
    ids = np.asarray(committed_ids, dtype=np.int64).reshape(-1)
    n = len(ids)
    prob = np.full(n, np.nan, dtype=np.float32)
    rank = np.full(n, np.nan, dtype=np.float64)
    entropy = np.full(n, np.nan, dtype=np.float32)
    top1 = np.full(n, np.nan, dtype=np.float32)
    if draft_logits is not None:
        array = _as_float32_2d(draft_logits, "draft logits")
        rows = min(n, array.shape[0])
        if rows:
            if ids[:rows].min() < 0 or ids[:rows].max() >= array.shape[1]:
                raise ValueError(f"committed token ids must lie in [0, {array.shape[1]}) for draft logits of "
                                 f"vocabulary {array.shape[1]}; got {ids[:rows].tolist()}")
            shifted, lse, logp = _log_softmax(array[:rows])
            chosen = shifted[np.arange(rows), ids[:rows]]
            prob[:rows] = np.exp(chosen - lse[:, 0])
            rank[:rows] = (shifted > chosen[:, None]).sum(axis=1)
            entropy[:rows] = _entropy_from_logprobs(logp)
            top1[:rows] = np.exp(-lse[:, 0])  # the largest shifted logit is 0
        return {"prob": prob, "rank": rank, "entropy_nats": entropy, "top1_prob": top1}
    if candidates is None:
        if candidate_logprobs is not None:
            raise ValueError("candidate_logprobs given without candidates; pass both (or draft_logits)")
        return {"prob": prob, "rank": rank, "entropy_nats": entropy, "top1_prob": top1}
    if hasattr(candidates, "detach"):
        candidates = candidates.detach().cpu().numpy()
    cand = np.asarray(candidates, dtype=np.int64)
    if cand.ndim != 2:
        raise ValueError(f"draft candidates must be 2-D [depth, K]; got shape {tuple(cand.shape)}")
    valid = np.ones(cand.shape, dtype=bool)
    logprobs = None
    if candidate_logprobs is not None:
        if hasattr(candidate_logprobs, "detach"):
            candidate_logprobs = candidate_logprobs.detach().cpu().float().numpy()
        logprobs = np.asarray(candidate_logprobs, dtype=np.float32)
        if logprobs.shape != cand.shape:
            raise ValueError(f"draft logprobs shape {tuple(logprobs.shape)} must equal candidates shape "
                             f"{tuple(cand.shape)}")
        if np.isnan(logprobs).any() or (logprobs > 1e-6).any():
            raise ValueError("draft logprobs must be <= 0 and not NaN (use -inf for unused slots)")
        valid = np.isfinite(logprobs)
    rows = min(n, cand.shape[0])
    if rows:
        match = (cand[:rows] == ids[:rows, None]) & valid[:rows]
        found = match.any(axis=1)
        first = match.argmax(axis=1)
        rank[:rows] = np.where(found, first, -1)
        if logprobs is not None:
            picked = logprobs[np.arange(rows), first]
            prob[:rows] = np.where(found, np.exp(np.minimum(picked, 0)), np.nan)
            best = np.where(valid[:rows], logprobs[:rows], -np.inf).max(axis=1)
            top1[:rows] = np.where(np.isfinite(best), np.exp(np.minimum(best, 0)), np.nan)
    return {"prob": prob, "rank": rank, "entropy_nats": entropy, "top1_prob": top1}


# the longest suffix match the copyability tells apart (``context_match``; longer ones are recorded as this)
CONTEXT_MATCH_MAX = 8


def context_match_length(tokens: Sequence[int], max_length: int, end: int | None = None) -> int:
    """The length (0..``max_length``) of the longest suffix of ``tokens[:end]`` that also occurs earlier in it: the
    context's copyability, what a prompt-lookup drafter looks up."""
    n = len(tokens) if end is None else int(end)
    if max_length < 1 or n < 2:
        return 0
    last, best = tokens[n - 1], 0
    for i in range(n - 2, -1, -1):  # earlier occurrences of the last token, nearest first
        if tokens[i] != last:
            continue
        k = 1
        while k < max_length and k <= i and tokens[i - k] == tokens[n - 1 - k]:
            k += 1
        if k > best:
            best = k
            if best >= max_length:
                break
    return best


def context_matches_of_output(prompt_ids: Sequence[int], output_ids: Sequence[int],
                              max_length: int = CONTEXT_MATCH_MAX) -> np.ndarray:
    """``context_match_length`` before every output position: ``[len(output_ids)]`` int16, entry ``p`` for the
    prompt and ``output_ids[:p]`` (what a round starting at ``p`` sees before drafting)."""
    context = np.concatenate([np.asarray(prompt_ids, dtype=np.int64).reshape(-1),
                              np.asarray(output_ids, dtype=np.int64).reshape(-1)])
    n_prompt, n, out = len(prompt_ids), len(context), np.zeros(len(output_ids), dtype=np.int16)
    ends = np.arange(max(n_prompt, 2), n)  # the context before output position end - n_prompt is context[:end]
    token = np.unique(context, return_inverse=True)[1].reshape(-1)
    gram, matched = token, np.ones(ends.size, dtype=bool)
    for k in range(1, max_length + 1):  # gram[i]: an exact id of the k-gram ending at i + k - 1
        first = np.unique(gram, return_index=True, return_inverse=True)
        first = first[1][first[2].reshape(-1)]  # where each k-gram first ends (less k - 1)
        at = ends - k  # the suffix of length k of context[:end] starts at end - k: seen if it occurred before
        matched &= at >= 1
        matched[matched] = first[at[matched]] < at[matched]  # a suffix seen before has every shorter one seen too
        if not matched.any():
            break
        out[ends - n_prompt] += matched
        gram = np.unique(gram[:-1] * n + token[k:], return_inverse=True)[1].reshape(-1)
    return out
