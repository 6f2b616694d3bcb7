"""Target entropy from the top-k log-probabilities an engine returns: exact bounds and a point estimate.

Defines the tokens columns ``target_entropy_lower_nats``, ``target_entropy_upper_nats``,
``target_entropy_estimate_nats`` and ``target_topk`` (``docs/trace-schema.md``), vectorised over positions, and the
checks such input must pass. Knows no engine's field names (``entropy_law.importers``), files or tables. With
``p_1 >= ... >= p_k`` known, tail mass ``T = 1 - sum p_i`` on ``m = V - k`` tokens each at most ``p_k`` (admissible only
when ``T <= m p_k``): the lower bound packs the tail into as few tokens at ``p_k`` as possible (a concave function's
minimum over the polytope of tails lies at a vertex), the upper bound spreads it evenly (attained, as ``T / m <= p_k``);
both are attained, so they are the exact range of H given the top k, and ``k = V`` makes them the exact entropy. Point
estimates (``POINT_ESTIMATES``): ``"geometric"`` (the tail ``q_j = p_k rho^j``, ``rho = T / (T + p_k)``, clipped into
the bounds) or ``"midpoint"``. The formulas: ``docs/trace-schema.md``. numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUM_TOLERANCE = 1e-3  # probabilities of one position may sum to at most 1 + this (engines' rounding)
LOGPROB_TOLERANCE = 1e-6  # a log-probability in (0, this] is rounding and read as 0; above it is refused
FIT_TOLERANCE = 1e-5  # a tail mass up to this beyond what the other V - k tokens hold is rounding (clipped to fit)
RENORMALISED_TAIL = 1e-6  # a tail mass at or below this (with k < V) reads as a top-k the engine renormalised
POINT_ESTIMATES = ("geometric", "midpoint")


class TopkInputError(ValueError):
    """Top-k log-probabilities of one position that no distribution has (``row``: the position's index)."""

    def __init__(self, row: int, problem: str):
        super().__init__(f"position {row}: {problem}")
        self.row, self.problem = int(row), problem


@dataclass
class TopkEntropy:
    """Per position (float64 arrays): ``lower_nats`` <= H <= ``upper_nats`` and ``estimate_nats`` between them;
    ``k`` (entries read), ``tail_mass`` (1 - their sum, >= 0), ``top1_prob``, ``top2_prob`` and ``logit_gap``
    (log p1 - log p2), exact; NaN where k = 1 for the last two."""

    lower_nats: np.ndarray
    upper_nats: np.ndarray
    estimate_nats: np.ndarray
    k: np.ndarray
    tail_mass: np.ndarray
    top1_prob: np.ndarray
    top2_prob: np.ndarray
    logit_gap: np.ndarray


def _as_rows(logprobs) -> np.ndarray:
    array = np.asarray(logprobs, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"logprobs must be [positions, k] (-inf pads a position with fewer entries); "
                         f"got shape {array.shape}")
    return array


def topk_problems(logprobs, vocab_size: int | None) -> list[tuple[int, str]]:
    """Every position whose entries no distribution over ``vocab_size`` tokens has: ``[(row, problem), ...]``.
    Refused: a NaN or +inf, a log-probability above 0 (beyond ``LOGPROB_TOLERANCE``), no entry, more entries than
    the vocabulary, probabilities summing above ``1 + SUM_TOLERANCE``, and a tail that cannot fit on the other
    ``V - k`` tokens at most ``p_k`` each by more than ``FIT_TOLERANCE`` (these two only with ``vocab_size``).
    ``-inf`` marks an absent entry (a position with fewer)."""
    array = _as_rows(logprobs)
    problems: dict[int, str] = {}

    def flag(mask, text):
        for row in np.flatnonzero(mask):
            problems.setdefault(int(row), text(int(row)))

    flag(np.isnan(array).any(axis=1), lambda r: "a log-probability is NaN")
    flag(np.isposinf(array).any(axis=1), lambda r: "a log-probability is +inf")
    above = np.where(np.isfinite(array), array, -np.inf).max(axis=1) if array.shape[1] else np.full(len(array), -np.inf)
    flag(above > LOGPROB_TOLERANCE, lambda r: f"a log-probability is above 0 ({above[r]:.6g}); log-probabilities "
                                              "are <= 0")
    present = _present(array)
    k = present.sum(axis=1)
    flag(k == 0, lambda r: "no log-probability (an empty top-k list)")
    k_check = vocab_size is not None
    vocab_size = vocab_size if k_check else np.iinfo(np.int64).max
    flag(k_check & (k > vocab_size), lambda r: f"{k[r]} entries, more than the vocabulary of {vocab_size}")
    p = np.where(present, np.exp(np.minimum(np.where(present, array, 0.0), 0.0)), 0.0)
    total = p.sum(axis=1)
    flag(total > 1 + SUM_TOLERANCE, lambda r: f"the probabilities sum to {total[r]:.6g} > 1 + {SUM_TOLERANCE:g}")
    pk = np.where(present, p, np.inf).min(axis=1)
    tail = np.maximum(1.0 - total, 0.0)
    room = np.maximum(vocab_size - k, 0) * np.where(np.isfinite(pk), pk, 0.0)
    flag(k_check & (tail > room + FIT_TOLERANCE),
         lambda r: (f"a tail mass of {tail[r]:.6g} cannot lie on the other {vocab_size - k[r]} tokens at most "
                    f"p_k = {pk[r]:.6g} each: the vocabulary size {vocab_size} is too small, or the entries are "
                    "not the top k"))
    return sorted(problems.items())


def _present(array: np.ndarray) -> np.ndarray:
    """Finite entries whose exp does not underflow to 0 (vLLM writes -9999.0 for a masked token: absent)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(array) & (np.exp(np.where(np.isfinite(array), np.minimum(array, 0.0), 0.0)) > 0)


def _neg_xlogx(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, -x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def topk_entropy(logprobs, vocab_size: int, *, point: str = "geometric") -> TopkEntropy:
    """Bounds and a point estimate of the entropy (nats) at each position from its top-k log-probabilities.
    ``logprobs``: ``[positions, k]`` (a 1-D list is one position), in any order, ``-inf`` for an absent entry
    (fewer entries than requested: duplicates an engine merged; one whose probability underflows to 0 is absent);
    ``vocab_size``: V of the target. ``point``: ``"geometric"`` or ``"midpoint"`` (module docstring). Raises
    ``TopkInputError`` for the first position ``topk_problems`` refuses."""
    if point not in POINT_ESTIMATES:
        raise ValueError(f"point must be one of {POINT_ESTIMATES}; got {point!r}")
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1; got {vocab_size}")
    array = _as_rows(logprobs)
    problems = topk_problems(array, vocab_size)
    if problems:
        raise TopkInputError(*problems[0])
    present = _present(array)
    lp = -np.sort(-np.where(present, np.minimum(array, 0.0), -np.inf), axis=1)  # descending; absent entries last
    p = np.exp(lp)
    k = present.sum(axis=1)
    pk = p[np.arange(len(lp)), k - 1]
    h_top = _neg_xlogx(p).sum(axis=1)
    tail = np.maximum(1.0 - p.sum(axis=1), 0.0)
    m = (vocab_size - k).astype(np.float64)
    tail = np.minimum(tail, m * pk)  # k = V: the list is the distribution; a tail beyond FIT_TOLERANCE is refused
    n = np.minimum(np.floor(tail / pk * (1 + 1e-12)), m)  # tokens at p_k in the packed tail (1e-12: T = n p_k)
    rest = np.maximum(tail - n * pk, 0.0)
    lower = h_top + n * _neg_xlogx(pk) + _neg_xlogx(rest)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(tail > 0, tail * np.log(np.where(tail > 0, m / np.where(tail > 0, tail, 1.0), 1.0)), 0.0)
    upper = np.maximum(h_top + spread, lower)
    if point == "geometric":
        with np.errstate(divide="ignore", invalid="ignore"):
            safe = np.where(tail > 0, tail, 1.0)
            geometric = np.where(tail > 0, tail * np.log(1.0 / pk) + tail * (1 + tail / pk) * np.log1p(pk / safe), 0.0)
        estimate = np.clip(h_top + geometric, lower, upper)
    else:
        estimate = (lower + upper) / 2
    top2 = np.where(k >= 2, p[:, 1] if p.shape[1] > 1 else np.nan, np.nan)
    with np.errstate(invalid="ignore"):
        gap = np.where(k >= 2, lp[:, 0] - (lp[:, 1] if lp.shape[1] > 1 else np.nan), np.nan)
    return TopkEntropy(lower_nats=lower, upper_nats=upper, estimate_nats=estimate, k=k, tail_mass=tail,
                       top1_prob=p[:, 0], top2_prob=top2, logit_gap=gap)


def topk_logprobs_from_logits(logits, k: int) -> np.ndarray:
    """The top ``k`` log-probabilities (fp32 log-softmax, best first) of each row of ``logits`` ``[rows, V]``: what
    an engine asked for ``top_logprobs = k`` returns, to measure the estimator where the exact entropy is known."""
    array = np.asarray(logits, dtype=np.float32)
    if array.ndim != 2 or not 1 <= k <= array.shape[1]:
        raise ValueError(f"logits must be [rows, V] with 1 <= k <= V; got shape {array.shape} and k = {k}")
    shifted = array - array.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float32))
    top = -np.partition(-logp, k - 1, axis=1)[:, :k]
    return -np.sort(-top, axis=1)


def entropy_or_bound(tokens, column: str = "target_entropy_estimate_nats"):
    """``tokens`` with a null ``target_entropy_nats`` filled from ``column`` (the point estimate by default; a
    bound for a sensitivity fit): what the law fits as the entropy. Exact rows are kept; a copy where filled."""
    if column not in tokens.columns or "target_entropy_nats" not in tokens.columns:
        return tokens
    exact, bound = tokens["target_entropy_nats"], tokens[column]
    fill = exact.isna() & bound.notna()
    if not fill.any():
        return tokens
    tokens = tokens.copy()
    tokens["target_entropy_nats"] = exact.where(~fill, bound)
    return tokens


def pad_topk(rows) -> np.ndarray:
    """Ragged lists of log-probabilities (one per position) as ``[positions, max k]``, ``-inf`` padded (an array
    of that shape as it is)."""
    if isinstance(rows, np.ndarray) and rows.ndim == 2:
        return rows.astype(np.float64, copy=False)
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), -np.inf)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


__all__ = ["FIT_TOLERANCE", "LOGPROB_TOLERANCE", "entropy_or_bound", "POINT_ESTIMATES", "RENORMALISED_TAIL",
           "SUM_TOLERANCE", "TopkEntropy", "TopkInputError", "pad_topk", "topk_entropy", "topk_logprobs_from_logits",
           "topk_problems"]
