"""Block-level consequences of per-position acceptance probabilities (research notes, section 5.2): E[tau] of a
block, the exact expected rounds of a request by dynamic programming (full blocks, or a drafted depth drawn per
round start), and the i.i.d. formula with its inverse ``alpha_eff``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq


def expected_accepted(acceptance: np.ndarray) -> np.ndarray:
    """E[tau] for blocks with per-depth acceptance ``acceptance[..., d-1]`` (last axis: depth)."""
    a = np.asarray(acceptance, dtype=float)
    return np.cumprod(a, axis=-1).sum(axis=-1)


def tau_distribution(acceptance_matrix: np.ndarray, depth_probs: np.ndarray | None = None) -> np.ndarray:
    """``P(tau = k | round starts at t)`` for k = 0..D_max, shape ``[T, D_max + 1]``.

    ``acceptance_matrix[t, j]``: acceptance at depth j + 1 of a round starting at t, or ``[D - 1, t, j]`` for a law in
    the drafted depth D. ``depth_probs[t, D]``: P(a round at t drafts D tokens); None: always D_max. With S(m) = P(D >=
    m) and R(k) = prod_{j<k} a_{t,j}: P(tau = k) = S(k + 1) (R(k) - R(k + 1)) + P(D = k) R(k).
    """
    a = np.asarray(acceptance_matrix, dtype=float)
    if a.ndim == 3:
        return _tau_distribution_by_depth(a, depth_probs)
    length, depth = a.shape
    reach, p_full = _reach(a)
    if depth_probs is None:
        return p_full
    pi = _check_depth_probs(depth_probs, length, depth)
    tail = np.cumsum(pi[:, ::-1], axis=1)[:, ::-1]  # S(m) = P(D >= m), m = 0..depth
    p_tau = pi * reach
    p_tau[:, :-1] += tail[:, 1:] * (reach[:, :-1] - reach[:, 1:])
    return p_tau


def _reach(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """R(k) = prod_{j<k} a_j (k = 0..depth) and P(tau = k) when every round drafts the full depth."""
    reach = np.concatenate([np.ones((a.shape[0], 1)), np.cumprod(a, axis=1)], axis=1)
    p_tau = reach.copy()
    p_tau[:, :-1] -= reach[:, 1:]
    return reach, p_tau


def _check_depth_probs(pi: np.ndarray, length: int, depth: int) -> np.ndarray:
    pi = np.asarray(pi, dtype=float)
    if pi.shape != (length, depth + 1):
        raise ValueError(f"depth_probs must have shape {(length, depth + 1)} (positions x drafted depth 0..{depth}), "
                         f"got {pi.shape}")
    if np.any(pi < -1e-12) or not np.allclose(pi.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("depth_probs rows must be probability distributions over the drafted depth 0..D_max")
    return pi


def _tau_distribution_by_depth(a: np.ndarray, depth_probs: np.ndarray | None) -> np.ndarray:
    """``tau_distribution`` for acceptance ``a[D - 1, t, j]`` that depends on the drafted depth D."""
    depth, length, width = a.shape
    if width != depth:
        raise ValueError(f"acceptance by drafted depth must have shape (D_max, T, D_max), got {a.shape}")
    if depth_probs is None:
        return tau_distribution(a[-1])
    pi = _check_depth_probs(depth_probs, length, depth)
    p_tau = np.zeros((length, depth + 1))
    p_tau[:, 0] = pi[:, 0]
    for d in range(1, depth + 1):
        p_tau[:, : d + 1] += pi[:, [d]] * _reach(a[d - 1, :, :d])[1]
    return p_tau


def expected_round_counts(acceptance_matrix: np.ndarray, depth_probs: np.ndarray | None = None) -> tuple[float, float]:
    """(expected rounds, expected drafting rounds) to produce T tokens, with the arguments of
    ``tau_distribution``: V(t) = 1 + sum_k P(tau = k | t) V(t + k + 1), V(t >= T) = 0, and W(t) = P(D_t > 0) +
    sum_k P(tau = k | t) W(t + k + 1)."""
    p_tau = tau_distribution(acceptance_matrix, depth_probs)
    length, width = p_tau.shape
    drafts = np.ones(length) if depth_probs is None else 1.0 - np.asarray(depth_probs, dtype=float)[:, 0]
    value = np.zeros(length + width + 1)
    drafting = np.zeros(length + width + 1)
    for t in range(length - 1, -1, -1):  # values beyond T are 0
        value[t] = 1.0 + p_tau[t] @ value[t + 1 : t + width + 1]
        drafting[t] = drafts[t] + p_tau[t] @ drafting[t + 1 : t + width + 1]
    return float(value[0]), float(drafting[0])


def expected_rounds(acceptance_matrix: np.ndarray, depth_probs: np.ndarray | None = None) -> float:
    """Expected rounds to produce T tokens (see ``expected_round_counts``)."""
    return expected_round_counts(acceptance_matrix, depth_probs)[0]


def acceptance_matrix_positions(length: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(position, depth) index arrays of the ``[length, depth]`` matrix for ``expected_rounds``."""
    t = np.repeat(np.arange(length), depth)
    j = np.tile(np.arange(depth), length)
    return np.minimum(t + j, length - 1), j + 1


def acceptance_tensor_positions(length: int, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(position, depth, drafted depth, flat index) arrays for the entries j < D of a
    ``[depth, length, depth]`` acceptance-by-drafted-depth array (``tau_distribution``, 3-D)."""
    parts = []
    for d in range(1, depth + 1):
        t = np.repeat(np.arange(length), d)
        j = np.tile(np.arange(d), length)
        parts.append((t, j, np.full(t.size, d)))
    t, j, drafted = (np.concatenate(x) for x in zip(*parts))
    flat = np.ravel_multi_index((drafted - 1, t, j), (depth, length, depth))
    return np.minimum(t + j, length - 1), j + 1, drafted, flat


def iid_tokens_per_round(alpha, drafts: int) -> np.ndarray:
    """Expected committed tokens per round, i.i.d. acceptance alpha, ``drafts`` = B - 1 drafts."""
    alpha = np.asarray(alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1.0 - alpha ** (drafts + 1)) / (1.0 - alpha)
    return np.where(np.isclose(alpha, 1.0), drafts + 1.0, out)


def alpha_eff(tokens_per_round: float, drafts: int) -> float:
    """The i.i.d. acceptance that gives ``tokens_per_round`` with ``drafts`` drafts per round."""
    if not 1.0 <= tokens_per_round <= drafts + 1:
        raise ValueError(f"tokens per round {tokens_per_round} outside [1, {drafts + 1}]")
    if tokens_per_round >= drafts + 1 - 1e-12:
        return 1.0
    return brentq(lambda x: iid_tokens_per_round(x, drafts) - tokens_per_round, 0.0, 1.0 - 1e-12)
