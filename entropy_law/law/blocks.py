"""Block-level consequences of a per-position acceptance law (research notes, section 5.2).

Known here, from acceptance probabilities alone (no model): the expected accepted drafts of one
block, E[tau] = sum_k prod_{d<=k} a_d; the exact expected number of rounds a request needs, by
dynamic programming over its entropy sequence (rounds start wherever the previous one ended; no
conditioning on realised block starts); the i.i.d. formula (1 - alpha^(D+1)) / (1 - alpha) and its
inverse alpha_eff. Not known here: where acceptances come from (a fitted law supplies them).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq


def expected_accepted(acceptance: np.ndarray) -> np.ndarray:
    """E[tau] for blocks with per-depth acceptance ``acceptance[..., d-1]`` (last axis: depth)."""
    a = np.asarray(acceptance, dtype=float)
    return np.cumprod(a, axis=-1).sum(axis=-1)


def expected_rounds(acceptance_matrix: np.ndarray) -> float:
    """Expected rounds to produce T tokens; ``acceptance_matrix[t, j]`` is the acceptance of the draft
    at depth j + 1 of a round starting at output position t (0-based), i.e. of position t + j.

    V(t) = 1 + sum_{k} P(tau = k | t) V(t + k + 1), V(t >= T) = 0, tau capped at the depth D.
    Entries at positions >= T are never used.
    """
    a = np.asarray(acceptance_matrix, dtype=float)
    length, depth = a.shape
    survive = np.cumprod(a, axis=1)  # survive[t, j] = P(tau >= j + 1 | t)
    # P(tau = k | t) for k = 0..depth
    reach = np.concatenate([np.ones((length, 1)), survive], axis=1)  # P(tau >= k)
    p_tau = reach.copy()
    p_tau[:, :-1] -= reach[:, 1:]
    value = np.zeros(length + depth + 2)
    for t in range(length - 1, -1, -1):
        # tokens beyond T cost nothing: value beyond T is 0, so only k with t + k + 1 < T matter
        value[t] = 1.0 + p_tau[t] @ value[t + 1 : t + depth + 2]
    return float(value[0])


def acceptance_matrix_positions(length: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(position, depth) index arrays of the ``[length, depth]`` matrix for ``expected_rounds``."""
    t = np.repeat(np.arange(length), depth)
    j = np.tile(np.arange(depth), length)
    return np.minimum(t + j, length - 1), j + 1


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
