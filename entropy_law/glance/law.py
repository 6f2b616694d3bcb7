"""GLANCE's "draftability law" on any round data: its fit, its diagnostics and ``holds()``.

Written from GLANCE's description (``docs/law.md``), not its code. H = the target's entropy (nats) at the round root, a
= accepted drafts, logit p = b0 - b1 H, E[a | H] in two forms: ``"code"`` min(exp(b0 - b1 H), cap) and ``"readme"`` p +
... + p^L, fitted by nonlinear least squares per category and pooled; b1 is reported clipped to ``B1_MAX``. ``holds()``:
GLANCE's four conditions, b1 <= 25 checked on the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from entropy_law.glance.rounds import round_table
from entropy_law.law import atrisk
from entropy_law.law.results import Result
from entropy_law.law.stats import r_squared

CAP = 15  # GLANCE's cap (code form) and L (README form): the reachable accepted length
B1_MAX = 25.0  # b1 is reported clipped here; holds() requires the estimate to be at most this
MIN_ROUNDS = 30  # fewer rounds: no fit (GLANCE's rule)
MEAN_ACCEPTED_MIN = 0.15  # holds(): a fit on less acceptance is degenerate
CURVE_BINS = 10  # entropy-quantile bins of r2_curve and the decile curve
CEILING_BINS = 50  # entropy-quantile bins of r2_ceiling
MIN_PER_BIN = 5  # decile bins with fewer rounds are left out of the curve
N_BOOT = 2000  # bootstrap resamples of a decile bin's mean
START_MEAN_FLOOR = 0.05  # the start value of b0 uses max(mean a, this)
FORMS = ("code", "readme")
GLANCE_FAMILIES = {"glance": "code", "glance_readme": "readme"}  # fit_law family name -> form


def _check_form(form: str) -> str:
    form = GLANCE_FAMILIES.get(form, form)
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS} (or a family name {sorted(GLANCE_FAMILIES)}), got {form!r}")
    return form


def _check_cap(form: str, cap) -> float:
    if form == "readme" and (int(cap) != cap or cap < 1):
        raise ValueError(f"the README form needs a whole number of drafts L >= 1, got cap={cap!r}")
    if not cap > 0:
        raise ValueError(f"cap must be positive, got {cap!r}")
    return float(cap)


def glance_expected_accepted(entropy, b0: float, b1: float, *, form: str = "code", cap: float = CAP) -> np.ndarray:
    """E[a | H] under logit p = b0 - b1 H: ``"code"`` min(p / (1 - p), cap), ``"readme"`` p + ... + p^cap."""
    form = _check_form(form)
    cap = _check_cap(form, cap)
    z = b0 - b1 * np.asarray(entropy, dtype=float)
    if form == "code":
        return np.exp(np.minimum(z, np.log(cap)))
    p = special.expit(z)
    return (p[..., None] ** np.arange(1, int(cap) + 1)).sum(axis=-1)


def nls_fit(H: np.ndarray, a: np.ndarray, form: str, cap: float | None, *, reach: np.ndarray | None = None):
    """Least squares of E[a | H] in (b0, b1) with an analytic Jacobian, from GLANCE's start (b0 = logit(m / (1 + m)),
    m the mean of a, b1 = 1). The README form's fixed L is ``reach`` = 1 for k = 1..``cap``; ``reach`` (``[n, L]``,
    P(L >= k) per round) gives it a per-round L."""
    if form == "readme" and reach is None:
        reach = np.ones((H.size, int(cap)))
    k = None if reach is None else np.arange(1, reach.shape[1] + 1)

    def residuals(theta):
        z = theta[0] - theta[1] * H
        if reach is None:
            return np.exp(np.minimum(z, np.log(cap))) - a
        return (reach * special.expit(z)[:, None] ** k).sum(axis=1) - a

    def jacobian(theta):
        z = theta[0] - theta[1] * H
        if reach is None:
            dz = np.where(z < np.log(cap), np.exp(np.minimum(z, np.log(cap))), 0.0)  # flat above the cap
        else:  # d/dz sum_k P(L >= k) p^k = sum_k P(L >= k) k p^k (1 - p)
            p = special.expit(z)
            dz = (reach * k * p[:, None] ** k).sum(axis=1) * (1.0 - p)
        return np.column_stack([dz, -H * dz])

    mean_a = max(float(a.mean()), START_MEAN_FLOOR)
    start = np.array([special.logit(mean_a / (1.0 + mean_a)), 1.0])
    return optimize.least_squares(residuals, start, jac=jacobian, method="lm", xtol=1e-12, ftol=1e-12, gtol=1e-12,
                                  max_nfev=20000)


def quantile_bins(entropy, bins: int) -> np.ndarray:
    """The entropy-quantile bin (0 .. ``bins`` - 1) of each round (tied quantiles leave a bin empty)."""
    h = np.asarray(entropy, dtype=float)
    inner = np.quantile(h, np.linspace(0.0, 1.0, bins + 1))[1:-1]
    return np.searchsorted(inner, h, side="right")


def decile_curve(entropy, accepted, *, bins: int = CURVE_BINS, min_per_bin: int = MIN_PER_BIN, n_boot: int = N_BOOT,
                 seed: int = 0, predicted=None) -> pd.DataFrame:
    """Per entropy-quantile bin of at least ``min_per_bin`` rounds: ``bin``, ``n``, mean ``entropy``, mean ``accepted``
    with its 95% bootstrap ``ci_low`` / ``ci_high`` (NaN with ``n_boot=0``) and mean ``predicted``."""
    h = np.asarray(entropy, dtype=float)
    a = np.asarray(accepted, dtype=float)
    which = quantile_bins(h, bins)
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(bins):
        take = which == b
        n = int(take.sum())
        if n < min_per_bin:
            continue
        row = dict(bin=b, n=n, entropy=float(h[take].mean()), accepted=float(a[take].mean()),
                   ci_low=np.nan, ci_high=np.nan)
        if n_boot and np.ptp(a[take]) > 0:
            ci = stats.bootstrap((a[take],), np.mean, n_resamples=int(n_boot), method="percentile",
                                 vectorized=True, rng=rng).confidence_interval
            row.update(ci_low=float(ci.low), ci_high=float(ci.high))
        elif n_boot:  # no variation: the interval is the point
            row.update(ci_low=row["accepted"], ci_high=row["accepted"])
        if predicted is not None:
            row["predicted"] = float(np.asarray(predicted, dtype=float)[take].mean())
        rows.append(row)
    columns = ["bin", "n", "entropy", "accepted", "ci_low", "ci_high"] + (["predicted"] if predicted is not None else [])
    return pd.DataFrame(rows, columns=columns)


def r2_ceiling(entropy, accepted, *, bins: int = CEILING_BINS) -> float:
    """R^2 of the best function of H alone: a's between-bin variance share (``bins`` quantile bins)."""
    h = np.asarray(entropy, dtype=float)
    a = np.asarray(accepted, dtype=float)
    if len(a) < 2 * bins:
        bins = max(5, len(a) // 10)
    which = quantile_bins(h, bins)
    bin_mean = pd.Series(a).groupby(which).transform("mean").to_numpy()
    total = float(((a - a.mean()) ** 2).sum())
    return float(((bin_mean - a.mean()) ** 2).sum() / total) if total > 0 else float("nan")


def holds_checks(*, slope, spearman_rho: float, spearman_p: float, r2_curve: float, frac_of_ceiling: float,
                 mean_accepted: float, slope_max: float = B1_MAX) -> dict:
    """GLANCE's four conditions as bools: ``slope_positive``, ``negative_rank_correlation`` (rho < 0, p < 0.05),
    ``curve_or_ceiling`` (either >= 0.5), ``non_degenerate`` (mean a >= 0.15, slope <= ``slope_max``)."""
    def at_least(x, bound):
        return bool(np.isfinite(x) and x >= bound)

    slopes = np.atleast_1d(np.asarray(slope, dtype=float))
    return {"slope_positive": bool(np.all(slopes > 0)),
            "negative_rank_correlation": bool(spearman_rho < 0 and spearman_p < 0.05),
            "curve_or_ceiling": at_least(r2_curve, 0.5) or at_least(frac_of_ceiling, 0.5),
            "non_degenerate": bool(mean_accepted >= MEAN_ACCEPTED_MIN and np.all(slopes <= slope_max))}


@dataclass
class GlanceLaw(Result):
    """GLANCE's law fitted to one scope (``"pooled"`` or a category), with per-category fits in
    ``per_category``. ``summary``: one row per scope, the pooled fit first."""

    scope: str
    form: str
    cap: float
    b0: float
    b1_fitted: float
    n_rounds: int
    n_requests: int | None
    mean_accepted: float
    r2_curve: float
    r2_round: float
    r2_ceiling: float
    spearman_rho: float
    spearman_p: float
    curve: pd.DataFrame
    converged: bool = True
    per_category: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def b1(self) -> float:
        return min(self.b1_fitted, B1_MAX)

    @property
    def frac_of_ceiling(self) -> float:
        """r2_round / r2_ceiling (NaN where the ceiling is not positive)."""
        if not (np.isfinite(self.r2_ceiling) and self.r2_ceiling > 0):
            return float("nan")
        return float(self.r2_round / self.r2_ceiling)

    @property
    def checks(self) -> dict:
        """``holds()``'s four conditions (``holds_checks``), b1 <= 25 on the estimate."""
        return holds_checks(slope=self.b1_fitted, spearman_rho=self.spearman_rho, spearman_p=self.spearman_p,
                            r2_curve=self.r2_curve, frac_of_ceiling=self.frac_of_ceiling,
                            mean_accepted=self.mean_accepted)

    def holds(self) -> bool:
        """Whether all four ``checks`` hold."""
        return all(self.checks.values())

    @property
    def title(self) -> str:
        label = "L" if self.form == "readme" else "cap"
        return (f"GLANCE draftability law ({self.form} form, {label} {self.cap:g}): logit p = b0 - b1 H, "
                f"{self.n_rounds} rounds")

    def _row(self) -> dict:
        return dict(n_rounds=self.n_rounds, n_requests=self.n_requests, mean_accepted=self.mean_accepted, b0=self.b0,
                    b1=self.b1, b1_fitted=self.b1_fitted, r2_curve=self.r2_curve, r2_round=self.r2_round,
                    r2_ceiling=self.r2_ceiling, frac_of_ceiling=self.frac_of_ceiling,
                    spearman_rho=self.spearman_rho, spearman_p=self.spearman_p, holds=self.holds())

    @property
    def summary(self) -> pd.DataFrame:
        rows = {self.scope: self._row(), **{cat: law._row() for cat, law in self.per_category.items()}}
        out = pd.DataFrame.from_dict(rows, orient="index")
        out.index.name = "scope"
        return out

    def __getitem__(self, category) -> "GlanceLaw":
        if category not in self.per_category:
            raise KeyError(f"no GLANCE fit for category {category!r}; fitted: {list(self.per_category)}")
        return self.per_category[category]

    def predict(self, entropy, category=None) -> np.ndarray:
        """E[a | H] at root entropies ``entropy`` (nats) under this fit or the category's, with the clipped b1."""
        law = self if category is None else self[category]
        h = np.asarray(entropy, dtype=float)
        if np.any(~np.isfinite(h)) or np.any(h < -atrisk.NEGATIVE_TOLERANCE):
            raise ValueError("entropies must be finite and >= 0 nats")
        return glance_expected_accepted(np.maximum(h, 0.0), law.b0, law.b1, form=law.form, cap=law.cap)

    def plot(self, ax=None, *, category=None, color=None, label=None):
        """The decile curve with its bootstrap interval and the fitted E[a | H]; returns ``ax``."""
        import matplotlib.pyplot as plt

        law = self if category is None else self[category]
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        c = law.curve
        if len(c):
            err = np.vstack([c["accepted"] - c["ci_low"], c["ci_high"] - c["accepted"]])
            points = ax.errorbar(c["entropy"], c["accepted"], yerr=None if np.isnan(err).all() else err, fmt="o",
                                 ms=4, capsize=2, color=color, label=f"decile means ({law.scope})")
            color = points.lines[0].get_color()
            h_max = float(c["entropy"].max()) * 1.15
        else:
            h_max = 5.0
        h = np.linspace(0.0, max(h_max, 1e-3), 200)
        ax.plot(h, law.predict(h), color=color,
                label=label or f"GLANCE fit ({law.form}): b0 {law.b0:.2f}, b1 {law.b1:.2f}")
        ax.set_xlabel("target entropy at the round root H (nats)")
        ax.set_ylabel("accepted drafts per round")
        ax.set_ylim(bottom=0)
        ax.set_title(f"GLANCE law, {law.scope}: r2_curve {law.r2_curve:.2f}")
        ax.legend(frameon=False)
        return ax


def _fit_scope(rounds: pd.DataFrame, scope: str, form: str, cap: float, *, bins: int, ceiling_bins: int,
               n_boot: int, seed: int) -> GlanceLaw:
    h = rounds["entropy"].to_numpy(dtype=float)
    a = rounds["accepted"].to_numpy(dtype=float)
    if len(a) < MIN_ROUNDS:
        raise ValueError(f"GLANCE's law needs at least {MIN_ROUNDS} rounds; {scope} has {len(a)}")
    if np.ptp(h) == 0 or np.ptp(a) == 0:
        raise ValueError(f"GLANCE's law needs rounds that vary in both entropy and accepted length ({scope} does not)")
    fitted = nls_fit(h, a, form, cap)
    b0, b1 = (float(x) for x in fitted.x)
    curve = decile_curve(h, a, bins=bins, n_boot=n_boot, seed=seed)
    r2_curve = (r_squared(curve["accepted"].to_numpy(),
                          glance_expected_accepted(curve["entropy"], b0, b1, form=form, cap=cap))
                if len(curve) >= 2 else float("nan"))
    rank = stats.spearmanr(h, a)
    notes = []
    if not fitted.success:
        notes.append(f"least squares did not converge ({fitted.message})")
    if b1 > B1_MAX:
        notes.append(f"b1 = {b1:.3g} was clipped to {B1_MAX:g} (GLANCE's bound): a degenerate fit")
    n_requests = int(rounds["request_id"].nunique()) if "request_id" in rounds else None
    return GlanceLaw(scope=scope, form=form, cap=cap, b0=b0, b1_fitted=b1, n_rounds=len(a), n_requests=n_requests,
                     mean_accepted=float(a.mean()), r2_curve=r2_curve,
                     r2_round=r_squared(a, glance_expected_accepted(h, b0, b1, form=form, cap=cap)),
                     r2_ceiling=r2_ceiling(h, a, bins=ceiling_bins), spearman_rho=float(rank.statistic),
                     spearman_p=float(rank.pvalue), curve=curve, converged=bool(fitted.success), notes=notes)


def fit_glance(data, form: str = "code", *, by: str | None = None, per_category: bool = True, cap: float = CAP,
               bins: int = CURVE_BINS, ceiling_bins: int = CEILING_BINS, n_boot: int = N_BOOT, seed: int = 0,
               drafting_only: bool = True) -> GlanceLaw:
    """Fit GLANCE's law, pooled and per category, to traces of one arm or a per-round table (``entropy``, ``accepted``,
    optional ``category`` / ``task``, ``request_id``). ``form``: ``"code"`` or ``"readme"``; ``cap``: the cap, or L;
    ``by="category"`` is the default; ``per_category=False``: pooled only. Categories under 30 rounds are left out with
    a note. ``n_boot``: bootstrap resamples per decile mean; ``drafting_only``: rounds that drafted."""
    form = _check_form(form)
    cap = _check_cap(form, cap)
    if by not in (None, "category", "task"):
        raise ValueError(f"GLANCE's law is fitted per category and pooled; by= must be None or 'category', got {by!r}")
    rounds = round_table(data, drafting_only=drafting_only)
    options = dict(bins=bins, ceiling_bins=ceiling_bins, n_boot=n_boot, seed=seed)
    law = _fit_scope(rounds, "pooled", form, cap, **options)
    if per_category:
        for category, part in rounds.groupby("category", sort=True, observed=True):
            if len(part) < MIN_ROUNDS:
                law.notes.append(f"category {category}: {len(part)} rounds, too few to fit (fewer than {MIN_ROUNDS})")
                continue
            try:
                law.per_category[str(category)] = _fit_scope(part, str(category), form, cap, **options)
            except ValueError as err:
                law.notes.append(f"category {category}: {err}")
    return law
