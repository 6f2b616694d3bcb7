"""Small statistics shared across the law layer and its figures.

Known here: the exact one-sided permutation p of a Spearman rank correlation over all K! orderings
(``exact_spearman_p``; used by LOCO accuracy in ``transfer`` and by P2 in ``hypotheses``) and the
Wilson score interval of binomial proportions (``wilson_interval``; the figures' binned acceptance).
Not known here: traces, laws or fits. No torch.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint


def exact_spearman_p(x, y) -> tuple[float, float]:
    """Spearman rho of (x, y) and the exact one-sided permutation p of rho >= observed (K! orderings)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) > 9:
        raise ValueError("exact permutation p is limited to 9 categories (9! orderings)")
    rho = stats.spearmanr(x, y).statistic
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
