"""GLANCE's "draftability law" on any round data: its fit, its diagnostics and ``holds()``, its round logs.

GLANCE (github ``js-lee-AI/GLANCE``, MIT: ``glance/law.py``, ``experiments/fit_law.py``,
``experiments/main_table.py``) fits one law to one pair per verify round. Written here from its description
(issue #20, ``docs/law.md``), not from its code.

Known here:

- **The law.** H = the target's next-token entropy (nats) at the round root, the distribution that predicts
  depth 1 (in our traces: ``target_entropy_nats`` of the round's depth-1 token row); a = accepted drafts,
  bonus excluded (``rounds.accepted``). logit p = b0 - b1 H and E[a | H] in two forms that differ
  (``FORMS``): ``"code"`` (what GLANCE fits), min(p / (1 - p), cap) = min(exp(b0 - b1 H), cap) with cap 15;
  ``"readme"``, p (1 - p^L) / (1 - p) = p + p^2 + ... + p^L with L = 15, the mean run of a geometric
  acceptance cut at L drafts (our ``blocks.expected_accepted`` with acceptance p at every depth).
- **The fit.** Nonlinear least squares on the rounds (``scipy.optimize.least_squares``, ``method="lm"``,
  analytic Jacobian) from b0 = logit(m / (1 + m)), m = the mean of a (floored at 0.05 as GLANCE does), and
  b1 = 1; at least ``MIN_ROUNDS`` rounds with variation in H and a; b1 is reported clipped to ``B1_MAX``
  (``b1``; the estimate itself is ``b1_fitted``). Per category (GLANCE: per task) and pooled.
- **Diagnostics.** ``r2_curve``: R^2 of the law at the mean entropy of each of 10 entropy-quantile bins
  (bins of fewer than 5 rounds left out) against the bin's mean a (``curve``, with percentile-bootstrap
  intervals of the bin means from ``scipy.stats.bootstrap``); ``r2_round``: R^2 on single rounds;
  ``r2_ceiling``: the share of the rounds' variance of a between 50 entropy-quantile bins (n / 10 bins, at
  least 5, below 100 rounds), what a function of H alone could explain at best; Spearman rho of (H, a).
  Like GLANCE, both R^2 are computed with the fitted b1, not the clipped one.
- **holds()** (``checks``): b1 > 0; rho < 0 with p < 0.05; r2_curve >= 0.5 or r2_round / r2_ceiling >= 0.5;
  mean a >= 0.15 and b1 <= 25. Departure: b1 <= 25 is checked on the estimate; GLANCE checks the clipped
  value, so its check cannot fail.
- **Round logs.** GLANCE's JSONL (``main_table.py --round-log``: ``ROUND_LOG_FIELDS``, ``round`` from 0 per
  prompt, ``prompt`` an index, no token ids): ``read_glance_rounds`` (errors name file:line and field),
  ``glance_rounds`` (our traces in that shape: drafting rounds, H from the depth-1 row),
  ``write_glance_rounds`` (rows GLANCE's ``experiments/fit_law.py`` reads unchanged).
- **Comparison with our law, per round.** ``law_round_expectations``: our law's E[tau] of each recorded
  round, sum_k prod_{j<=k} a(H_{t+j-1}, j) over the round's drafted depth D (``tree_depth``, known before
  verification) along the greedy path's entropies; ``loco_glance``: GLANCE's law fitted without each
  category and predicting it; ``round_scores``: per-round MSE, category-mean errors, r2_curve, r2_round /
  r2_ceiling and the ``holds()`` rules for any per-round predictor.

Not known here: the GLM families (``fit``; this module never imports it, so ``fit_law(family="glance")``
dispatches here without an import cycle: a fitted law is used only through its ``predict_frame``), the
LOCO loop of our law, the gallery figure and the report section (``entropy_law.plots.glance``), trace runs
of imported round logs (``entropy_law.importers.glance``). No torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from entropy_law.law import arms, atrisk
from entropy_law.law.results import Result
from entropy_law.prompts.paths import read_json_lines

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
ROUND_LOG_FIELDS = ("round", "entropy", "accepted", "tau", "tree_size", "extended", "task", "prompt")
REQUIRED_FIELDS = ("round", "entropy", "accepted", "tau")  # task, prompt, tree_size, extended may be absent
DEFAULT_TASK = "all"  # GLANCE's fit_law.py name for rows without a task


# ----------------------------------------------------------------------------- the law


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
    """E[a | H] under logit p = b0 - b1 H, elementwise: ``"code"`` min(p / (1 - p), cap) (the odds are
    exp(b0 - b1 H), computed directly), ``"readme"`` p + p^2 + ... + p^L with L = ``cap``."""
    form = _check_form(form)
    cap = _check_cap(form, cap)
    z = b0 - b1 * np.asarray(entropy, dtype=float)
    if form == "code":
        return np.exp(np.minimum(z, np.log(cap)))
    p = special.expit(z)
    return (p[..., None] ** np.arange(1, int(cap) + 1)).sum(axis=-1)


def _residuals_and_jacobian(H: np.ndarray, a: np.ndarray, form: str, cap: float):
    """Residual and analytic Jacobian functions of the NLS in (b0, b1)."""
    def residuals(theta):
        return glance_expected_accepted(H, theta[0], theta[1], form=form, cap=cap) - a

    def jacobian(theta):
        z = theta[0] - theta[1] * H
        if form == "code":
            dz = np.where(z < np.log(cap), np.exp(np.minimum(z, np.log(cap))), 0.0)  # flat above the cap
        else:  # d/dz sum_k p^k = sum_k k p^k (1 - p)
            p = special.expit(z)
            k = np.arange(1, int(cap) + 1)
            dz = (k * p[:, None] ** k).sum(axis=1) * (1.0 - p)
        return np.column_stack([dz, -H * dz])

    return residuals, jacobian


def _nls(H: np.ndarray, a: np.ndarray, form: str, cap: float):
    mean_a = max(float(a.mean()), START_MEAN_FLOOR)
    start = np.array([special.logit(mean_a / (1.0 + mean_a)), 1.0])
    residuals, jacobian = _residuals_and_jacobian(H, a, form, cap)
    # tolerances tighter than scipy's defaults (GLANCE keeps those): the estimate, not the stopping rule, is reported
    return optimize.least_squares(residuals, start, jac=jacobian, method="lm", xtol=1e-12, ftol=1e-12, gtol=1e-12,
                                  max_nfev=20000)


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    y = np.asarray(y, dtype=float)
    total = float(((y - y.mean()) ** 2).sum())
    if len(y) < 2 or total <= 0:
        return float("nan")
    return 1.0 - float(((y - np.asarray(predicted, dtype=float)) ** 2).sum()) / total


def quantile_bins(entropy, bins: int) -> np.ndarray:
    """The entropy-quantile bin (0 .. ``bins`` - 1) of each round: bin i holds q_i <= H < q_{i+1}, q the
    ``bins + 1`` quantiles of H (numpy's linear interpolation) with the outer ones at -inf and +inf.
    Tied quantiles leave a bin empty."""
    h = np.asarray(entropy, dtype=float)
    inner = np.quantile(h, np.linspace(0.0, 1.0, bins + 1))[1:-1]
    return np.searchsorted(inner, h, side="right")


def decile_curve(entropy, accepted, *, bins: int = CURVE_BINS, min_per_bin: int = MIN_PER_BIN, n_boot: int = N_BOOT,
                 seed: int = 0, predicted=None) -> pd.DataFrame:
    """Mean accepted length per entropy-quantile bin: ``bin``, ``n``, ``entropy`` (mean H), ``accepted``
    (mean a) and its 95% percentile-bootstrap interval ``ci_low`` / ``ci_high`` (``n_boot`` resamples of the
    bin's rounds, ``seed``; NaN with ``n_boot=0``); with ``predicted`` (one value per round) also
    ``predicted``, its mean in the bin. Bins of fewer than ``min_per_bin`` rounds are left out."""
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
        elif n_boot:  # every round of the bin accepted the same: the interval is the point
            row.update(ci_low=row["accepted"], ci_high=row["accepted"])
        if predicted is not None:
            row["predicted"] = float(np.asarray(predicted, dtype=float)[take].mean())
        rows.append(row)
    columns = ["bin", "n", "entropy", "accepted", "ci_low", "ci_high"] + (["predicted"] if predicted is not None else [])
    return pd.DataFrame(rows, columns=columns)


def r2_ceiling(entropy, accepted, *, bins: int = CEILING_BINS) -> float:
    """Share of the rounds' variance of a that lies between ``bins`` entropy-quantile bins (n // 10 bins,
    at least 5, when there are fewer than 2 ``bins`` rounds): the R^2 of the best function of H alone at
    that resolution (the eta^2 of a one-way ANOVA of a on the bin)."""
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
    """GLANCE's four conditions, each a bool: ``slope_positive`` (b1 > 0: acceptance falls with entropy),
    ``negative_rank_correlation`` (rho < 0, p < 0.05), ``curve_or_ceiling`` (r2_curve >= 0.5 or
    r2_round / r2_ceiling >= 0.5) and ``non_degenerate`` (mean a >= 0.15 and slope <= ``slope_max``).
    ``slope``: one value, or several (one per LOCO fold; every one must pass)."""
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
    ``per_category`` (pooled fits only). ``summary``: one row per scope (the pooled fit first); ``b1`` is
    clipped to 25 as GLANCE reports it, ``b1_fitted`` the estimate."""

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
        """Whether all four conditions hold (``checks`` has them one by one; GLANCE returns both as a pair)."""
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
        """E[a | H] (accepted drafts per round) at root entropies ``entropy`` (nats) under this fit, or under
        the category's own fit; uses the reported (clipped) b1, as GLANCE's ``expected`` does."""
        law = self if category is None else self[category]
        h = np.asarray(entropy, dtype=float)
        if np.any(~np.isfinite(h)) or np.any(h < -atrisk.NEGATIVE_TOLERANCE):
            raise ValueError("entropies must be finite and >= 0 nats")
        return glance_expected_accepted(np.maximum(h, 0.0), law.b0, law.b1, form=law.form, cap=law.cap)

    def plot(self, ax=None, *, category=None, color=None, label=None):
        """The decile curve (mean accepted drafts per entropy-quantile bin, with its bootstrap interval)
        and the fitted E[a | H]; returns ``ax``."""
        import matplotlib.pyplot as plt  # lazy: the law layer needs matplotlib only to plot a result

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
    fitted = _nls(h, a, form, cap)
    b0, b1 = (float(x) for x in fitted.x)
    curve = decile_curve(h, a, bins=bins, n_boot=n_boot, seed=seed)
    r2_curve = (_r2(curve["accepted"].to_numpy(), glance_expected_accepted(curve["entropy"], b0, b1, form=form, cap=cap))
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
                     r2_round=_r2(a, glance_expected_accepted(h, b0, b1, form=form, cap=cap)),
                     r2_ceiling=r2_ceiling(h, a, bins=ceiling_bins), spearman_rho=float(rank.statistic),
                     spearman_p=float(rank.pvalue), curve=curve, converged=bool(fitted.success), notes=notes)


def fit_glance(data, form: str = "code", *, by: str | None = None, per_category: bool = True, cap: float = CAP,
               bins: int = CURVE_BINS, ceiling_bins: int = CEILING_BINS, n_boot: int = N_BOOT, seed: int = 0,
               drafting_only: bool = True) -> GlanceLaw:
    """Fit GLANCE's law, pooled and per category (GLANCE: per task), to ``data``: traces of one arm (any
    object with ``.tokens``, ``.rounds``, ``.runs``; ``glance_rounds`` makes the rounds) or a per-round
    table (``read_glance_rounds`` / ``glance_rounds``: ``entropy``, ``accepted``, optional ``category`` or
    ``task`` and ``request_id``). Also reached as ``fit_law(data, family="glance")`` (code form) or
    ``family="glance_readme"``.

    ``form``: ``"code"`` or ``"readme"`` (module docstring); ``cap``: the cap, or L. ``by``: ``None`` or
    ``"category"`` (the same: GLANCE fits per category and pooled); ``per_category=False`` fits the pooled
    law only. Categories with fewer than 30 rounds are left out with a note; the pooled fit needs 30.
    ``n_boot``: bootstrap resamples of each decile mean (0: no intervals); ``seed``: their generator.
    ``drafting_only``: for traces, rounds without a draft (``tree_depth`` 0) are left out, as GLANCE logs
    only rounds that draft.
    """
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


# ----------------------------------------------------------------------------- round tables


def round_table(data, *, drafting_only: bool = True) -> pd.DataFrame:
    """The per-round table of ``data``: traces (``glance_rounds``) or a DataFrame with ``entropy`` and
    ``accepted`` (``category`` taken from ``task`` where absent, else ``"all"``), checked."""
    if isinstance(data, pd.DataFrame):
        missing = [c for c in ("entropy", "accepted") if c not in data]
        if missing:
            raise ValueError(f"a per-round table needs columns 'entropy' and 'accepted' (GLANCE's round log, or "
                             f"glance_rounds(traces)); it lacks {missing}")
        rounds = data.copy()
        if "category" not in rounds:
            rounds["category"] = rounds["task"].astype(str) if "task" in rounds else DEFAULT_TASK
        h = rounds["entropy"].to_numpy(dtype=float)
        a = rounds["accepted"].to_numpy(dtype=float)
        if np.any(~np.isfinite(h)) or np.any(h < -atrisk.NEGATIVE_TOLERANCE):
            raise ValueError("per-round entropies must be finite and >= 0 nats")
        if np.any(~np.isfinite(a)) or np.any(a < 0):
            raise ValueError("per-round accepted lengths must be finite and >= 0")
        rounds["entropy"] = np.maximum(h, 0.0)
        return rounds
    if not all(hasattr(data, name) for name in ("tokens", "rounds", "runs")):
        raise TypeError("fit_glance takes traces (.tokens, .rounds, .runs) or a per-round DataFrame, "
                        f"got {type(data).__name__}")
    return glance_rounds(data, drafting_only=drafting_only)


def _check_one_arm(traces, run_ids) -> None:
    runs = traces.runs
    found = arms.run_arms(runs)
    found = found.loc[found["run_id"].isin({str(r) for r in run_ids}) & ~found["is_ar"]]
    if found["arm_key"].nunique() > 1:
        raise ValueError(f"the traces hold several drafting arms ({arms.describe_arms(found)}); GLANCE's law describes "
                         "one. Select one with traces.filter(run_id=[...]) or TraceAnalysis(traces).arm_view(label)")


def glance_rounds(traces, *, drafting_only: bool = True) -> pd.DataFrame:
    """Our traces as GLANCE's round log: one row per round (only rounds that drafted, ``tree_depth`` > 0,
    unless ``drafting_only=False``) in request and round order, with GLANCE's fields ``round`` (0, 1, ...
    per prompt), ``entropy`` (the round root's entropy: ``target_entropy_nats`` of the round's depth-1 token
    row, nats), ``accepted`` (tau), ``tau`` (tau + 1), ``tree_size`` (draft nodes + the root), ``extended``
    (False: our drafters do not extend past the block), ``task`` (the category) and ``prompt`` (the
    request's index in its category, in order of appearance), and our keys ``category``, ``run_id``,
    ``request_id``, ``round_index``, ``start_position``, ``tree_depth``, ``committed``.
    The traces must hold one drafting arm."""
    tokens, rounds = traces.tokens, traces.rounds
    keys = ["run_id", "request_id", "round_index"]
    for name, frame, cols in (("tokens", tokens, keys + ["category", "depth", "target_entropy_nats"]),
                              ("rounds", rounds, keys + ["start_position", "tree_nodes", "tree_depth", "accepted",
                                                         "committed"])):
        missing = [c for c in cols if c not in frame]
        if missing:
            raise ValueError(f"traces.{name} lacks columns {missing} (trace format v1)")
    rounds = rounds[keys + ["start_position", "tree_nodes", "tree_depth", "accepted", "committed"]]
    if drafting_only:
        rounds = rounds.loc[rounds["tree_depth"] > 0]
    _check_one_arm(traces, rounds["run_id"].unique())
    root = tokens.loc[tokens["depth"] == 1, keys + ["category", "target_entropy_nats"]]
    root = root.astype({"run_id": str, "request_id": str, "category": str})
    out = rounds.astype({"run_id": str, "request_id": str}).merge(root, on=keys, how="left", validate="one_to_one")
    if out["target_entropy_nats"].isna().any():
        bad = out.loc[out["target_entropy_nats"].isna(), keys].iloc[0].tolist()
        raise ValueError(f"round {bad[2]} of request {bad[1]} (run {bad[0]}) has no depth-1 token row with an entropy")
    out = atrisk.validate_covariates(out, ["target_entropy_nats"])
    order = {key: i for i, key in enumerate(dict.fromkeys(zip(out["run_id"], out["request_id"])))}
    out["_request_order"] = [order[key] for key in zip(out["run_id"], out["request_id"])]
    out = out.sort_values(["category", "_request_order", "round_index"], kind="stable", ignore_index=True)
    first = out.drop_duplicates("_request_order")
    prompt_of = dict(zip(first["_request_order"], first.groupby("category", sort=False).cumcount()))
    accepted = out["accepted"].to_numpy(dtype=np.int64)
    return pd.DataFrame({
        "round": out.groupby("_request_order", sort=False).cumcount().to_numpy(dtype=np.int64),
        "entropy": out["target_entropy_nats"].to_numpy(dtype=float),
        "accepted": accepted, "tau": accepted + 1,
        "tree_size": out["tree_nodes"].to_numpy(dtype=np.int64) + 1,
        "extended": False,
        "task": out["category"].to_numpy(),
        "prompt": out["_request_order"].map(prompt_of).to_numpy(dtype=np.int64),
        "category": out["category"].to_numpy(),
        "run_id": out["run_id"].to_numpy(), "request_id": out["request_id"].to_numpy(),
        "round_index": out["round_index"].to_numpy(dtype=np.int64),
        "start_position": out["start_position"].to_numpy(dtype=np.int64),
        "tree_depth": out["tree_depth"].to_numpy(dtype=np.int64),
        "committed": out["committed"].to_numpy(dtype=np.int64),
    })


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value) -> bool:
    return _is_number(value) and math.isfinite(value) and float(value).is_integer()


def read_glance_rounds(path) -> pd.DataFrame:
    """GLANCE's round log (JSONL from ``experiments/main_table.py --round-log``) as a per-round table.

    Each non-blank line is a JSON object with ``round``, ``entropy`` (nats), ``accepted`` and ``tau``, and,
    as GLANCE writes them, ``tree_size``, ``extended``, ``task`` and ``prompt``. A field missing on every
    line takes its default (``task`` "all", as GLANCE's ``fit_law.py``; ``prompt``: a new prompt wherever
    ``round`` restarts at 0 within a task; ``tree_size`` null; ``extended`` false); a field missing on some
    lines only is an error. Errors (``ValueError``) name ``file:line`` and the field: invalid JSON, a
    missing field, a non-numeric, non-finite or negative entropy (below -1e-5 nats; fp32 round-off above
    that is set to 0), a negative or fractional ``accepted``, ``tau`` != ``accepted`` + 1, a negative or
    fractional ``round`` or ``prompt``, a ``tree_size`` below 1, a non-boolean ``extended``, and a
    (task, prompt, round) seen twice.

    Columns: GLANCE's eight fields and ``category`` (= task, so tasks become categories), ``request_id``
    (``"<task>/<prompt>"``) and ``line`` (1-based line number in the file).
    """
    path = Path(path)
    numbered = list(read_json_lines(path, "a JSON object (one round)"))
    lines, rows = [n for n, _ in numbered], [row for _, row in numbered]
    if not rows:
        raise ValueError(f"{path}: no rounds (the file is empty)")
    present = {name for row in rows for name in ROUND_LOG_FIELDS if name in row}
    required = set(REQUIRED_FIELDS) | present
    records = []
    for row, number in zip(rows, lines):
        where = f"{path}:{number}"
        for name in ROUND_LOG_FIELDS:
            if name in required and name not in row:
                raise ValueError(f"{where}: field '{name}' is missing")
        entropy = row["entropy"]
        if not _is_number(entropy) or not math.isfinite(entropy):
            raise ValueError(f"{where}: field 'entropy' must be a finite number of nats, got {entropy!r}")
        if entropy < -atrisk.NEGATIVE_TOLERANCE:
            raise ValueError(f"{where}: field 'entropy' is negative ({entropy!r} nats)")
        for name in ("round", "accepted", "tau"):
            if not _whole(row[name]):
                raise ValueError(f"{where}: field '{name}' must be a whole number, got {row[name]!r}")
        if row["accepted"] < 0:
            raise ValueError(f"{where}: field 'accepted' is negative ({row['accepted']!r})")
        if row["round"] < 0:
            raise ValueError(f"{where}: field 'round' is negative ({row['round']!r})")
        if row["tau"] != row["accepted"] + 1:
            raise ValueError(f"{where}: field 'tau' must be accepted + 1 = {int(row['accepted']) + 1}, got {row['tau']!r}")
        if "prompt" in row and not (_whole(row["prompt"]) and row["prompt"] >= 0):
            raise ValueError(f"{where}: field 'prompt' must be a prompt index (a whole number >= 0), got {row['prompt']!r}")
        if "tree_size" in row and not (_whole(row["tree_size"]) and row["tree_size"] >= 1):
            raise ValueError(f"{where}: field 'tree_size' must be a whole number >= 1, got {row['tree_size']!r}")
        if "extended" in row and not isinstance(row["extended"], bool):
            raise ValueError(f"{where}: field 'extended' must be true or false, got {row['extended']!r}")
        task = row.get("task", DEFAULT_TASK)
        if not isinstance(task, (str, int)) or isinstance(task, bool):
            raise ValueError(f"{where}: field 'task' must be a name, got {task!r}")
        records.append(dict(round=int(row["round"]), entropy=max(float(entropy), 0.0), accepted=int(row["accepted"]),
                            tau=int(row["tau"]), tree_size=float(row["tree_size"]) if "tree_size" in row else np.nan,
                            extended=bool(row.get("extended", False)), task=str(task),
                            prompt=int(row["prompt"]) if "prompt" in row else None, line=number))
    out = pd.DataFrame(records)
    if "prompt" not in present:  # a new prompt wherever round restarts at 0 within a task
        out["prompt"] = out.groupby("task", sort=False)["round"].transform(lambda r: (r.to_numpy() == 0).cumsum() - 1)
        if (out["prompt"] < 0).any():
            number = int(out.loc[out["prompt"] < 0, "line"].iloc[0])
            raise ValueError(f"{path}:{number}: field 'prompt' is absent and the task's first round is not round 0, "
                             "so its prompt cannot be told")
    out["prompt"] = out["prompt"].astype(np.int64)
    if "tree_size" in present:
        out["tree_size"] = out["tree_size"].astype(np.int64)
    seen = out.duplicated(["task", "prompt", "round"], keep=False)
    if seen.any():
        twice = out.loc[seen]
        first = twice.iloc[0]
        other = twice.loc[(twice["task"] == first["task"]) & (twice["prompt"] == first["prompt"])
                          & (twice["round"] == first["round"]), "line"].tolist()
        raise ValueError(f"{path}:{other[1]}: round {first['round']} of prompt {first['prompt']} of task "
                         f"{first['task']!r} appears twice (lines {other[0]} and {other[1]}; field 'round')")
    out["category"] = out["task"]
    out["request_id"] = out["task"] + "/" + out["prompt"].astype(str)
    return out[list(ROUND_LOG_FIELDS) + ["category", "request_id", "line"]]


def write_glance_rounds(rounds: pd.DataFrame, path) -> int:
    """Write a per-round table (``glance_rounds`` / ``read_glance_rounds``) as GLANCE's round log: one JSON
    object per line with GLANCE's eight fields in its order (``ROUND_LOG_FIELDS``; ``task`` from
    ``category`` where absent, a null ``tree_size`` as null). ``path``: a file path or an open text file.
    Returns the number of rows written."""
    frame = rounds.copy()
    if "task" not in frame and "category" in frame:
        frame["task"] = frame["category"]
    missing = [c for c in ROUND_LOG_FIELDS if c not in frame]
    if missing:
        raise ValueError(f"the per-round table lacks GLANCE's fields {missing}")

    def line(rec) -> str:
        tree_size = None if pd.isna(rec.tree_size) else int(rec.tree_size)
        return json.dumps({"round": int(rec.round), "entropy": float(rec.entropy), "accepted": int(rec.accepted),
                           "tau": int(rec.tau), "tree_size": tree_size, "extended": bool(rec.extended),
                           "task": str(rec.task), "prompt": int(rec.prompt)}) + "\n"

    text = "".join(line(rec) for rec in frame[list(ROUND_LOG_FIELDS)].itertuples(index=False))
    if hasattr(path, "write"):
        path.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")
    return len(frame)


# ----------------------------------------------------------------------------- per-round comparison


def loco_glance(rounds: pd.DataFrame, *, form: str = "code", cap: float = CAP) -> tuple[np.ndarray, dict]:
    """Leave-one-category-out predictions of GLANCE's law: for each category, the pooled law fitted on the
    other categories' rounds predicts its rounds (no intervals, no per-category fits). Returns the
    predictions (aligned with ``rounds``) and the fold fits by held-out category."""
    rounds = round_table(rounds)
    predicted = np.full(len(rounds), np.nan)
    category = rounds["category"].astype(str).to_numpy()
    fits = {}
    for held_out in sorted(set(category)):
        train = rounds.loc[category != held_out]
        law = fit_glance(train, form, per_category=False, cap=cap, n_boot=0)
        fits[held_out] = law
        test = category == held_out
        predicted[test] = law.predict(rounds.loc[test, "entropy"].to_numpy(dtype=float))
    return predicted, fits


def _entropy_by_request(traces, run_ids, *, columns: tuple = ()) -> tuple[dict, np.ndarray, dict]:
    """(run_id, request_id) -> (offset, T) into one flat array of entropies at output positions 0..T-1, and the
    tokens' per-position ``columns`` (of ``atrisk.POSITION_COLUMNS``) in the same order, by name (None where the
    traces lack one at some position): ``atrisk.sequences_of`` (its checks) laid end to end."""
    tokens = traces.tokens
    sequences = atrisk.sequences_of(tokens.loc[tokens["run_id"].astype(str).isin(set(run_ids))])
    if sequences.empty:
        return {}, np.zeros(0), dict.fromkeys(columns)
    lengths = [len(e) for e in sequences["entropy"]]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    where = {(str(run), str(request)): (int(offset), n) for run, request, offset, n in
             zip(sequences["run_id"], sequences["request_id"], offsets, lengths)}
    values = {}
    for column in columns:
        arrays = list(sequences[column]) if column in sequences else [None]
        values[column] = None if any(a is None for a in arrays) else np.concatenate(arrays).astype(float)
    return where, np.concatenate(list(sequences["entropy"])), values


def law_round_expectations(law, traces, rounds: pd.DataFrame | None = None, *, root_only: bool = False,
                           drafter: str | None = None, drafts: pd.DataFrame | None = None) -> np.ndarray:
    """Our law's expected accepted drafts of each recorded round (``rounds``: rows of
    ``glance_rounds(traces)``, default all): E[tau] = sum_{k=1}^{D} prod_{j=1}^{k} a(H_{t+j-1}, j), t the
    round's start position, D its drafted depth (``tree_depth``, known before verification) and H the
    target entropies along the request's greedy output (positions past its end reuse the last one, as the
    DP does). ``root_only``: the root entropy H_t at every depth (GLANCE's information only).

    ``law``: a fitted law of ``fit`` (used only through ``predict_frame``: columns ``target_entropy_nats``,
    ``depth``, ``drafted_depth``, ``cum_entropy_nats``, ``category``, the decode-time covariates of the row's
    position (``lag_entropy_nats``, ``run_mean_entropy_nats``, ``position``, ``log1p_position``, as
    ``atrisk.sequence_covariates``) and, with ``drafter``, ``drafter_id``).

    ``drafts``: the drafter's confidence in its own proposal at every verified depth of each round (rows
    ``run_id``, ``request_id``, ``round_index``, ``depth``, ``top1_prob``: ``jobs.reference.round_proposals``),
    given to the law as ``draft_top1_prob``, for a law in that confidence (``law_exp_obs_ceil_drafttop``); a
    (round, depth) it lacks raises ``ValueError``. A law in the context's copyability (``law_exp_obs_ceil_copy``)
    or in the target's top-1 probability (``law_exp_obs_ceil_top1``) reads the tokens' ``context_match`` /
    ``target_top1_prob`` at the row's position.
    """
    rounds = glance_rounds(traces) if rounds is None else rounds
    if rounds.empty:
        return np.zeros(0)
    columns = law.family.position_columns
    where, entropy, values = _entropy_by_request(traces, rounds["run_id"].unique(), columns=columns)
    lacking = [c for c in columns if values[c] is None]
    if lacking:
        raise ValueError(f"{law.family.name} reads the tokens column(s) {lacking} at every position, which these "
                         "traces lack at some position: attach the copyability (jobs.reference."
                         "attach_context_matches); compute the target's statistics of imported runs "
                         "(`entropy-law entropy RUN --model M`)")
    keys = list(zip(rounds["run_id"].astype(str), rounds["request_id"].astype(str)))
    missing = [k for k in keys if k not in where]
    if missing:
        raise ValueError(f"request {missing[0][1]} of run {missing[0][0]} has no token rows")
    offset = np.array([where[k][0] for k in keys], dtype=np.int64)
    length = np.array([where[k][1] for k in keys], dtype=np.int64)
    start = rounds["start_position"].to_numpy(dtype=np.int64)
    drafted = rounds["tree_depth"].to_numpy(dtype=np.int64)
    if np.any(drafted < 1):
        raise ValueError("law_round_expectations predicts rounds that drafted (tree_depth >= 1)")
    which = np.repeat(np.arange(len(rounds)), drafted)  # one row per (round, depth 1..D)
    depth = np.arange(which.size) - np.repeat(np.cumsum(drafted) - drafted, drafted) + 1
    position = np.minimum(start[which] + (0 if root_only else depth - 1), length[which] - 1)
    h = entropy[offset[which] + position]
    cum = pd.Series(h).groupby(which).cumsum().to_numpy() - h  # entropy of the round's earlier depths
    frame = pd.DataFrame({"target_entropy_nats": h, "depth": depth, "drafted_depth": drafted[which],
                          "cum_entropy_nats": cum, "category": rounds["category"].astype(str).to_numpy()[which]})
    # the decode-time covariates of the row's output position, as atrisk.sequence_covariates computes them
    csum = np.cumsum(entropy)
    first = offset[which]
    before = np.where(first > 0, csum[np.maximum(first - 1, 0)], 0.0)
    frame["lag_entropy_nats"] = entropy[first + np.maximum(position - 1, 0)]
    frame["run_mean_entropy_nats"] = (csum[first + position] - before) / (position + 1.0)
    frame["position"] = position
    frame["log1p_position"] = np.log1p(position.astype(float))
    for column in columns:  # the copyability / the target's top-1 probability at the row's position (root_only: root's)
        frame[column] = values[column][first + position]
    if drafter is not None:
        frame["drafter_id"] = drafter
    if drafts is not None:
        frame["draft_top1_prob"] = _round_drafts(rounds, drafts, which, depth)
    accept = np.asarray(law.predict_frame(frame), dtype=float)
    reach = pd.Series(accept).groupby(which).cumprod().to_numpy()  # P(depth k accepted and all before)
    return np.bincount(which, weights=reach, minlength=len(rounds))


def _round_drafts(rounds: pd.DataFrame, drafts: pd.DataFrame, which: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """``top1_prob`` of ``drafts`` at each (round ``which``, ``depth``) row of ``law_round_expectations``."""
    keys = ["run_id", "request_id", "round_index", "depth"]
    missing = [c for c in [*keys, "top1_prob"] if c not in drafts]
    if missing:
        raise ValueError(f"drafts lacks columns {missing} (jobs.reference.round_proposals gives them)")
    lookup = drafts.astype({"run_id": str, "request_id": str}).set_index(keys)["top1_prob"]
    if not lookup.index.is_unique:
        raise ValueError("drafts has more than one row for a (run_id, request_id, round_index, depth)")
    want = pd.MultiIndex.from_arrays([rounds["run_id"].astype(str).to_numpy()[which],
                                      rounds["request_id"].astype(str).to_numpy()[which],
                                      rounds["round_index"].to_numpy(dtype=np.int64)[which], depth], names=keys)
    values = lookup.reindex(want).to_numpy(dtype=float)
    if np.isnan(values).any():
        bad = want[int(np.flatnonzero(np.isnan(values))[0])]
        raise ValueError(f"drafts has no drafter confidence for depth {bad[3]} of round {bad[2]} of request {bad[1]} "
                         f"(run {bad[0]}): replay the run's rounds (jobs.reference.round_proposals)")
    return values


def round_scores(rounds: pd.DataFrame, predicted, *, slope, slope_max: float = B1_MAX,
                 bins: int = CURVE_BINS, ceiling_bins: int = CEILING_BINS) -> dict:
    """How well per-round predictions ``predicted`` of accepted drafts fit ``rounds`` (``entropy``,
    ``accepted``, ``category``), scored as GLANCE scores its law, so any predictor can be compared:
    ``mse`` (per round), ``category_mean_mae`` / ``category_mean_max_abs`` (|mean predicted - mean observed|
    per category: mean and largest over categories), ``r2_curve`` (R^2 of the mean of the predictions
    against the mean of a in each of ``bins`` root-entropy quantile bins of >= 5 rounds: for GLANCE's law
    this is near, not equal to, its own ``r2_curve``, which evaluates the law at the bin's mean entropy),
    ``r2_round``, ``r2_ceiling``, ``frac_of_ceiling``, Spearman rho of (H, a) and ``holds`` with the four
    ``checks`` (``slope``: the law's entropy slope, b1 for GLANCE's law, ``plots.glance.law_slope`` for ours, one
    value or one per LOCO fold; ``slope_max``: its bound, ``inf`` for a law without one)."""
    h = rounds["entropy"].to_numpy(dtype=float)
    a = rounds["accepted"].to_numpy(dtype=float)
    pred = np.asarray(predicted, dtype=float)
    if pred.shape != a.shape or np.any(~np.isfinite(pred)):
        raise ValueError("predicted must be one finite value per round")
    curve = decile_curve(h, a, bins=bins, n_boot=0, predicted=pred)
    r2_curve = _r2(curve["accepted"].to_numpy(), curve["predicted"].to_numpy()) if len(curve) >= 2 else float("nan")
    r2_round = _r2(a, pred)
    ceiling = r2_ceiling(h, a, bins=ceiling_bins)
    frac = r2_round / ceiling if np.isfinite(ceiling) and ceiling > 0 else float("nan")
    rank = stats.spearmanr(h, a)
    by_category = pd.DataFrame({"category": rounds["category"].astype(str).to_numpy(), "observed": a,
                                "predicted": pred}).groupby("category").mean()
    error = (by_category["predicted"] - by_category["observed"]).abs()
    checks = holds_checks(slope=slope, spearman_rho=float(rank.statistic), spearman_p=float(rank.pvalue),
                          r2_curve=r2_curve, frac_of_ceiling=frac, mean_accepted=float(a.mean()), slope_max=slope_max)
    return dict(n_rounds=int(len(a)), mean_accepted=float(a.mean()), mean_predicted=float(pred.mean()),
                mse=float(np.mean((pred - a) ** 2)), category_mean_mae=float(error.mean()),
                category_mean_max_abs=float(error.max()), r2_curve=r2_curve, r2_round=r2_round, r2_ceiling=ceiling,
                frac_of_ceiling=frac, spearman_rho=float(rank.statistic), spearman_p=float(rank.pvalue),
                holds=all(checks.values()), checks=checks,
                category_means={c: (float(r.observed), float(r.predicted)) for c, r in by_category.iterrows()})


def category_frame(scores: Mapping[str, dict]) -> pd.DataFrame:
    """Observed and predicted mean accepted drafts per category, one predicted column per predictor of
    ``scores`` (name -> ``round_scores``)."""
    frames = []
    for name, score in scores.items():
        means = pd.DataFrame.from_dict(score["category_means"], orient="index", columns=["observed", name])
        frames.append(means if not frames else means[[name]])
    out = pd.concat(frames, axis=1)
    out.index.name = "category"
    return out

