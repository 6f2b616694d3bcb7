"""Category means held out: a law read from the round's root only, and how well predicted category means fit.

Known here: ``root_acceptance`` (a law's DP acceptance array with every depth of a round read at its root: the
before-drafting information set), ``tau_given_depth``, ``category_fit`` and ``share_both_orders``. Not known here: the
LOCO loop and the tables (``bench/law.py category-table``). No torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.law.compare import DEPTH_ONLY, compare_laws
from entropy_law.law.fit import get_family, with_category_terms
from entropy_law.law.stats import r_squared

Z90 = 1.6448536269514722  # two-sided 90%: the lower end is the one-sided 95% bound


def root_acceptance(law, h, drafts: int, **position) -> np.ndarray:
    """``law``'s DP acceptance array (``FittedLaw.sequence_frame``) over entropy sequence ``h`` with every depth of a
    round starting at t read at t (entropy, decode-time covariates, ``position`` arrays)."""
    frame, shape = root_frame(law, h, drafts, **position)
    return law.shape_acceptance(law.predict_frame(frame), shape)


def root_frame(law, h, drafts: int, **position) -> tuple[pd.DataFrame, tuple]:
    """The rows ``root_acceptance`` predicts and their shape (to predict many requests in one call)."""
    h = np.asarray(h, dtype=float)
    frame, shape = law.sequence_frame(h, drafts, **position)
    dims, flat = shape
    start = np.repeat(np.arange(h.size), drafts) if flat is None else np.unravel_index(flat, dims)[1]
    frame["target_entropy_nats"] = h[start]
    if "cum_entropy_nats" in frame:
        frame["cum_entropy_nats"] = (frame["depth"].to_numpy() - 1) * h[start]
    if law.family.means:
        for name, values in atrisk.sequence_covariates(h, start).items():
            frame[name] = values
    for column in law.family.position_columns:
        frame[column] = np.asarray(position[column], dtype=float)[start]
    return frame, shape


def tau_given_depth(acceptance) -> np.ndarray:
    """``[T, drafts]``: E[tau | round at t drafts D = d + 1] = sum_{k<=D} prod_{j<k} a[t, j] from a DP acceptance
    array (``[T, drafts]``, or ``[drafts, T, drafts]`` for a law in D)."""
    a = np.asarray(acceptance, dtype=float)
    if a.ndim == 2:
        return np.cumsum(np.cumprod(a, axis=1), axis=1)
    d = np.arange(a.shape[0])
    return np.cumsum(np.cumprod(a, axis=2), axis=2)[d, :, d].T


def _r2_mae(observed: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
    return r_squared(observed, predicted), float(np.abs(predicted - observed).mean())


def category_fit(observed, predicted, refits=None) -> dict:
    """R-squared and mean absolute error of predicted against observed category means, each with a
    leave-one-category-out jackknife standard error and 90% interval: per category i, ``refits[i]`` = (observed,
    predicted) of the others from fits that never saw i; none given: the predictions kept."""
    obs, pred = np.asarray(observed, dtype=float), np.asarray(predicted, dtype=float)
    if obs.shape != pred.shape or obs.size < 3 or not np.isfinite(pred).all() or len(refits or obs) != obs.size:
        raise ValueError("category_fit needs one finite prediction (and refit) per category and at least 3 categories")
    r2, mae = _r2_mae(obs, pred)
    keep = ~np.eye(obs.size, dtype=bool)
    refits = refits or [(obs[k], pred[k]) for k in keep]
    drops = np.array([_r2_mae(np.asarray(o, dtype=float), np.asarray(p, dtype=float)) for o, p in refits])
    n = obs.size
    se = np.sqrt((n - 1) / n * ((drops - drops.mean(axis=0)) ** 2).sum(axis=0))
    return dict(categories=n, r2=r2, r2_lo=r2 - Z90 * se[0], r2_hi=r2 + Z90 * se[0],
                mae=mae, mae_lo=mae - Z90 * se[1], mae_hi=mae + Z90 * se[1])


def share_both_orders(rows: pd.DataFrame, family, *, n_folds: int = 5, seed: int = 0, **fit_options) -> dict:
    """The category terms' share of the CV gain over depth only of ``family`` with category terms (grouped CV log-loss
    per trial, the same folds for all four models): added last (``entropy_first``), added first (``category_first``) and
    their mean (``shapley``; NaN where both groups together gain nothing); the entropy group's shares are the
    complements. ``fit_options`` go to every fit."""
    fam = get_family(family)
    with_cat = with_category_terms(fam)
    s = compare_laws(rows, (DEPTH_ONLY, "law0_cat", fam.name, with_cat), n_folds=n_folds, seed=seed,
                     **fit_options).summary["cv_log_loss"]
    missing = [m for m in (DEPTH_ONLY, "law0_cat", fam.name, with_cat.name) if m not in s.index]
    if missing:
        raise ValueError(f"category share of {fam.name}: {missing} not scored (too few requests per fold?)")
    gains = dict(cv_gain_total=float(s[DEPTH_ONLY] - s[with_cat.name]), cv_gain_law=float(s[DEPTH_ONLY] - s[fam.name]),
                 cv_gain_category=float(s[DEPTH_ONLY] - s["law0_cat"]))
    total = gains["cv_gain_total"] if gains["cv_gain_total"] > 0 else float("nan")  # no gain: nothing to share
    last = (s[fam.name] - s[with_cat.name]) / total
    first = gains["cv_gain_category"] / total
    return dict(family=fam.name, **gains, entropy_first=float(last), category_first=float(first),
                shapley=float((first + last) / 2), entropy_last=float((s["law0_cat"] - s[with_cat.name]) / total),
                entropy_added_first=float(gains["cv_gain_law"] / total))
