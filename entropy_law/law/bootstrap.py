"""Poisson(1) bootstrap by request on aggregated at-risk counts: each replicate weights every cell of a request by one
draw and refits the law; percentile intervals. Below ``stats.FEW_REQUESTS`` requests it warns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.law.fit import FittedLaw, fit_law, get_family, prepare_counts
from entropy_law.law.results import Result
from entropy_law.law.stats import warn_if_few_requests


def poisson_weights(request_ids, rng: np.random.Generator) -> pd.Series:
    """One Poisson(1) weight per distinct request."""
    unique = pd.Index(sorted(set(request_ids)))
    return pd.Series(rng.poisson(1.0, size=len(unique)), index=unique)


def percentile_interval(replicates: pd.DataFrame, level: float = 0.95) -> tuple[pd.Series, pd.Series]:
    """Per column, the ``level`` percentile interval of the replicates (NaN skipped, linear interpolation, the nearest
    replicate where interpolating would meet an infinite one)."""
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    if replicates.empty:
        nan = pd.Series(np.nan, index=replicates.columns, dtype=float)
        return nan, nan.copy()
    ends = []
    for q in (lo, hi):
        with np.errstate(invalid="ignore"):
            ci = replicates.quantile(q)
        redo = ci.isna() & np.isinf(replicates).any()
        if redo.any():
            ci[redo] = replicates.loc[:, redo].quantile(q, interpolation="nearest")
        ends.append(ci.astype(float))
    return ends[0], ends[1]


def reweight_counts(counts: pd.DataFrame, weights: pd.Series) -> pd.DataFrame:
    """Counts with each request's cells multiplied by its weight; zero-weight cells dropped."""
    w = counts["request_id"].map(weights).to_numpy()
    out = counts.loc[w > 0].copy()
    w = w[w > 0]
    for col in ("n_acc", "n_rej", "n"):
        out[col] = out[col].to_numpy() * w
    out.attrs.update(counts.attrs)
    return out


def _law_statistics(law: FittedLaw) -> dict:
    values = dict(law.result.params) if law.result is not None else {}
    derived = law.derived
    if len(derived):
        values.update(derived["estimate"].to_dict())
    return values


@dataclass
class BootstrapResult(Result):
    """``summary``: per statistic the full-data estimate, bootstrap mean and SE, percentile CI and
    ``n_requests`` (the requests resampled); ``replicates``: one row per successful replicate."""

    summary: pd.DataFrame
    replicates: pd.DataFrame
    n_boot: int
    n_failed: int
    seed: int
    level: float
    n_requests: int
    notes: list = field(default_factory=list)

    @property
    def title(self) -> str:
        return (f"request bootstrap (Poisson weights) over {self.n_requests} requests, "
                f"{self.n_boot - self.n_failed}/{self.n_boot} replicates, {self.level:.0%} percentile intervals, "
                f"seed {self.seed}")


def bootstrap_law(traces, family: str = "law_exp", *, n_boot: int = 200, seed: int = 0, level: float = 0.95,
                  statistic: Callable[[FittedLaw], dict] | None = None, eps: float = atrisk.EPS_NATS,
                  **fit_options) -> BootstrapResult:
    """Refit ``family`` on ``n_boot`` request-bootstrap replicates; ``statistic(law) -> dict``: what to estimate."""
    fam = get_family(family)
    counts = prepare_counts(traces, fam, eps=eps)
    n_requests = int(counts["request_id"].nunique())
    few = warn_if_few_requests(n_requests, "the request-bootstrap intervals")
    full = fit_law(counts, fam, cov_type="nonrobust", **fit_options)
    compute = statistic or _law_statistics
    estimate = pd.Series(compute(full), dtype=float)
    rng = np.random.default_rng(seed)
    start = None if full.result is None else full.result.params.to_numpy()
    rows, failed, notes = [], 0, [few] if few else []
    for _ in range(n_boot):
        weights = poisson_weights(counts["request_id"], rng)
        try:
            law = fit_law(reweight_counts(counts, weights), fam, cov_type="nonrobust", start_params=start,
                          **fit_options)
            rows.append(compute(law))
        except (ValueError, np.linalg.LinAlgError) as err:  # e.g. a replicate without a category
            failed += 1
            if failed <= 3:
                notes.append(f"replicate failed: {err}")
    if failed > 0.1 * n_boot:
        notes.append(f"{failed} of {n_boot} replicates failed: intervals may be unreliable")
    replicates = pd.DataFrame(rows)
    ci_low, ci_high = percentile_interval(replicates, level)
    summary = pd.DataFrame({"estimate": estimate, "boot_mean": replicates.mean(), "boot_se": replicates.std(ddof=1),
                            "ci_low": ci_low, "ci_high": ci_high, "n_requests": n_requests})
    return BootstrapResult(summary=summary, replicates=replicates, n_boot=n_boot, n_failed=failed, seed=seed,
                           level=level, n_requests=n_requests, notes=notes)
