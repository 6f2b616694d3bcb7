"""Small statistics shared across the law layer and its figures: the exact Spearman permutation p, the Wilson interval,
and the rule for few requests (clusters): below ``FEW_REQUESTS`` cluster-robust and bootstrap intervals are too narrow
(Cameron & Miller 2015, section VI)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint


FEW_REQUESTS = 20  # below this many requests (clusters) intervals are flagged as unreliable


class SmallSampleWarning(UserWarning):
    """An interval rests on fewer than ``FEW_REQUESTS`` requests: treat it as unreliable."""


def warn_if_few_requests(n_requests: int, what: str, *, stacklevel: int = 3) -> str | None:
    """Warn (``SmallSampleWarning``) where ``what`` rests on under ``FEW_REQUESTS`` requests; the message, or None."""
    n_requests = int(n_requests)
    if n_requests >= FEW_REQUESTS:
        return None
    message = (f"{what} rest on {n_requests} request{'s' if n_requests != 1 else ''} (fewer than {FEW_REQUESTS}): "
               "not measured reliably; record more requests")
    warnings.warn(message, SmallSampleWarning, stacklevel=stacklevel)
    return message


def r_squared(y, predicted) -> float:
    """1 - SSE / SS about the mean of ``y``: NaN with fewer than 2 values or no spread."""
    y = np.asarray(y, dtype=float)
    total = float(((y - y.mean()) ** 2).sum()) if y.size else 0.0
    if y.size < 2 or total <= 0:
        return float("nan")
    return 1.0 - float(((y - np.asarray(predicted, dtype=float)) ** 2).sum()) / total


def exact_spearman_p(x, y) -> tuple[float, float]:
    """Spearman rho of (x, y) and its exact one-sided permutation p (rho >= observed); NaN beyond 9 values."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = stats.spearmanr(x, y).statistic
    if len(x) > 9:
        return float(rho), float("nan")
    rank_x, rank_y = stats.rankdata(x), stats.rankdata(y)
    count = total = 0
    for perm in itertools.permutations(rank_y):
        total += 1
        count += stats.spearmanr(rank_x, perm).statistic >= rho - 1e-12
    return float(rho), count / total


def wilson_interval(successes, trials, *, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for binomial proportions (statsmodels), vectorised."""
    lo, hi = proportion_confint(np.asarray(successes), np.asarray(trials), alpha=1 - level, method="wilson")
    return np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
