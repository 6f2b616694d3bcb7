"""Model comparison: cross-validated log-loss with folds of requests, AIC/BIC (BIC's n: the number of requests),
held-out calibration, and the primary-law rule of ``docs/law.md``.

Every family is scored on the same at-risk rows (each bins its own covariate); one whose fit does not converge
or separates cells perfectly is not scored, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import statsmodels.api as sm

from entropy_law.law import atrisk
from entropy_law.law.fit import fit_law, get_family, prepare_counts
from entropy_law.law.results import Result

DEPTH_ONLY = "depth_only"  # the baseline: acceptance per depth, nothing else
DEFAULT_FAMILIES = ("law0_cat", "law_logit", "law_exp", "law_exp0", "law_power", "law_renyi2", "law_margin",
                    "law_spline", "law_iso")


def request_folds(request_ids: Sequence[str], n_folds: int, seed: int) -> dict:
    """Random assignment of requests to ``n_folds`` folds of (nearly) equal size."""
    unique = np.array(sorted(set(request_ids)), dtype=object)
    if len(unique) < n_folds:
        raise ValueError(f"{len(unique)} requests cannot fill {n_folds} folds; lower n_folds")
    order = np.random.default_rng(seed).permutation(len(unique))
    return {rid: int(i % n_folds) for rid, i in zip(unique[order], range(len(unique)))}


def calibration(n_acc: np.ndarray, n_rej: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
    """Calibration intercept and slope: binomial logit GLM of outcomes on logit(predicted)."""
    p = np.clip(predicted, 1e-9, 1 - 1e-9)
    x = sm.add_constant(np.log(p / (1 - p)))
    endog = np.column_stack([n_acc, n_rej])
    keep = endog.sum(axis=1) > 0
    res = sm.GLM(endog[keep], x[keep], family=sm.families.Binomial()).fit()
    return float(res.params[0]), float(res.params[1])


@dataclass
class Comparison(Result):
    """Held-out scores per family. ``summary``: one row per family; ``per_category``: per family x
    category; ``per_request``: held-out log-likelihood sum and trial count per family x request."""

    summary: pd.DataFrame
    per_category: pd.DataFrame
    per_request: pd.DataFrame
    n_folds: int
    seed: int
    notes: list = field(default_factory=list)
    folds: str = "requests"

    @property
    def title(self) -> str:
        if self.folds == "category":
            return f"law comparison, leave-one-category-out CV ({self.n_folds} categories)"
        return f"law comparison, {self.n_folds}-fold CV grouped by request (seed {self.seed})"

    @property
    def best(self) -> str:
        return str(self.summary["cv_log_loss"].idxmin())

    def paired_difference(self, a: str, b: str) -> tuple[float, float]:
        """Mean per-trial held-out log-loss of ``a`` minus ``b`` and its SE over requests."""
        wide = self.per_request.pivot(index="request_id", columns="family", values="loglik")
        n = self.per_request.drop_duplicates("request_id").set_index("request_id")["n"].reindex(wide.index)
        diff = -(wide[a] - wide[b])  # loss difference per request (sum over its trials)
        total = n.sum()
        mean = diff.sum() / total
        resid = diff - mean * n  # the ratio estimator's SE over requests
        se = np.sqrt(len(diff) / (len(diff) - 1) * (resid**2).sum()) / total
        return float(mean), float(se)


def _fit_failure(law, where: str) -> str | None:
    """Why a fitted GLM law is unusable (not converged, non-finite, or ``separated``), else None."""
    res = law.result
    if res is None:
        return None
    if not getattr(res, "converged", True):
        return (f"the GLM did not converge ({where}); a log link on acceptance (law_exp0) fails this way "
                "when acceptance approaches 1 at low entropy")
    if not (np.all(np.isfinite(res.params)) and np.all(np.isfinite(res.bse))):
        return f"non-finite estimates or standard errors ({where})"
    if law.separated:
        return (f"perfect separation ({where}): a fitted probability is exactly 0 or 1, some of its terms are not "
                "identified by these requests")
    return None


def depth_rates(train: pd.DataFrame, depths) -> np.ndarray:
    """Acceptance at ``depths`` under ``train``'s accepted / at-risk trials per depth (the depth-only law); a depth
    without training trials reuses the deepest trained depth below it, else the shallowest."""
    per_depth = train.groupby("depth")[["n_acc", "n"]].sum()
    per_depth = per_depth.loc[per_depth["n"] > 0].sort_index()
    rate = (per_depth["n_acc"] / per_depth["n"]).to_numpy(dtype=float)
    known = per_depth.index.to_numpy(dtype=float)
    idx = np.clip(np.searchsorted(known, np.asarray(depths, dtype=float), side="right") - 1, 0, len(rate) - 1)
    return rate[idx]


def _depth_rates(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    return depth_rates(train, test["depth"]).clip(1e-12, 1 - 1e-12)


class _DepthOnlyFit:
    """The depth-only baseline on all data, as much of a fitted law as the comparison's table needs."""

    result = None

    def __init__(self, counts: pd.DataFrame):
        self.counts = counts
        self.n_params = int(counts["depth"].nunique())

    def log_likelihood(self, counts: pd.DataFrame) -> np.ndarray:
        p = _depth_rates(self.counts, counts)
        return counts["n_acc"].to_numpy() * np.log(p) + counts["n_rej"].to_numpy() * np.log1p(-p)


def compare_laws(traces, families: Sequence[str] = DEFAULT_FAMILIES, *, n_folds: int = 5, seed: int = 0,
                 eps: float = atrisk.EPS_NATS, width_log10: float = 0.05, on_invalid: str = "raise",
                 folds: str = "requests", **fit_options) -> Comparison:
    """Grouped K-fold CV log-loss, AIC, BIC and held-out calibration for each family.

    ``traces``: traces or a row-level at-risk table of ONE drafter; ``families`` may name ``DEPTH_ONLY``. ``folds``:
    ``"requests"`` (``n_folds`` random sets of requests) or ``"category"`` (one fold per category; families with
    category terms are left out). Extra keywords go to ``fit_law`` (default ``cov_type="nonrobust"``).
    """
    fit_options = {"cov_type": "nonrobust", **fit_options}
    rows = traces if isinstance(traces, pd.DataFrame) else atrisk.at_risk_table(traces, eps=eps, on_invalid=on_invalid)
    if rows.attrs.get("kind") != atrisk.KIND_ROWS:
        raise ValueError("compare_laws needs traces or a row-level at_risk_table (it bins per family itself)")
    drafters = rows["drafter_id"].unique()
    if len(drafters) > 1:
        raise ValueError(f"compare_laws scores one drafter at a time; the traces hold {sorted(drafters)}. "
                         "Use at_risk_table(traces, drafters=[...]).")
    if folds not in ("requests", "category"):
        raise ValueError(f"folds must be 'requests' or 'category', got {folds!r}")
    by_category = folds == "category"
    folds, n_folds = _cv_folds(rows, by_category, n_folds, seed)
    summary_rows, per_cat, per_req, notes = [], [], [], []
    for name in families:
        if by_category and name != DEPTH_ONLY and get_family(name).uses_category:
            notes.append(f"{name} not scored: it has category terms and cannot predict a held-out category")
            continue
        name, counts, held, full, failure = _cv_family(rows, name, folds, n_folds, eps, width_log10, fit_options)
        if failure:
            notes.append(f"{name} not scored: {failure}")
            continue
        summary_row, per_request, per_category = _cv_scores(name, counts, held, full)
        summary_rows.append(summary_row)
        per_req.append(per_request)
        per_cat.append(per_category)
    if not summary_rows:
        raise ValueError(f"no family could be scored: {'; '.join(notes)}")
    summary = pd.DataFrame(summary_rows).set_index("family")
    result = Comparison(summary=summary, per_category=pd.concat(per_cat, ignore_index=True),
                        per_request=pd.concat(per_req, ignore_index=True), n_folds=n_folds, seed=seed, notes=notes,
                        folds="category" if by_category else "requests")
    best = result.best
    diffs = [result.paired_difference(f, best) if f != best else (0.0, 0.0) for f in summary.index]
    summary["delta_vs_best"], summary["delta_se"] = zip(*diffs)
    if "law0_cat" in summary.index:
        summary["gain_vs_law0"] = summary.loc["law0_cat", "cv_log_loss"] - summary["cv_log_loss"]
    result.notes.append(f"best by CV log-loss: {best}; delta_se is the SE over requests of the paired difference")
    return result


def _cv_folds(rows: pd.DataFrame, by_category: bool, n_folds: int, seed: int) -> tuple[dict, int]:
    """The fold of each request (by category or random sets of requests) and the number of folds."""
    if by_category:
        cats = rows.drop_duplicates("request_id").set_index("request_id")["category"]
        levels = sorted(cats.unique())
        if len(levels) < 2:
            raise ValueError(f"leave-one-category-out CV needs at least 2 categories; the traces hold {levels}")
        folds = {rid: levels.index(c) for rid, c in cats.items()}
        n_folds = len(levels)
    else:
        folds = request_folds(rows["request_id"].to_numpy(), n_folds, seed)
    smallest_training = len(folds) - int(np.bincount(list(folds.values()), minlength=n_folds).max())
    if smallest_training < 2:
        raise ValueError(f"{len(folds)} requests in {n_folds} folds leave {smallest_training} in a training fold: "
                         "every training fold needs at least 2 requests; record more requests or lower n_folds")
    return folds, n_folds


def _cv_family(rows, name, folds, n_folds, eps, width_log10, fit_options):
    """One family's held-out predictions per cell, its full-data fit and the reason it failed (or None)."""
    if name == DEPTH_ONLY:
        counts = prepare_counts(rows, get_family("law_exp"), eps=eps, width_log10=width_log10)
        fold_of = counts["request_id"].map(folds).to_numpy()
        held = np.empty(len(counts))
        for k in range(n_folds):
            held[fold_of == k] = _depth_rates(counts.loc[fold_of != k], counts.loc[fold_of == k])
        return name, counts, held, _DepthOnlyFit(counts), None
    fam = get_family(name)
    name = fam.name  # a LawFamily object is labelled by its name
    counts = prepare_counts(rows, fam, eps=eps, width_log10=width_log10)
    fold_of = counts["request_id"].map(folds).to_numpy()
    held = np.empty(len(counts))
    for k in range(n_folds):
        try:
            law = fit_law(counts.loc[fold_of != k], fam, **fit_options)
        except (ValueError, np.linalg.LinAlgError) as err:  # e.g. IRLS weights went NaN (log link at mu = 1)
            return name, counts, held, None, f"the fit failed in fold {k}: {err}"
        failure = _fit_failure(law, f"fold {k}")
        if failure:
            return name, counts, held, None, failure
        held[fold_of == k] = law.predict_frame(counts.loc[fold_of == k])
    full = fit_law(counts, fam, **fit_options)
    return name, counts, held, full, _fit_failure(full, "all data")


def _cv_scores(name: str, counts: pd.DataFrame, held: np.ndarray, full) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """One family's summary row, per-request log-likelihood and per-category CV log-loss."""
    n_acc, n_rej = counts["n_acc"].to_numpy(), counts["n_rej"].to_numpy()
    loglik = n_acc * np.log(held) + n_rej * np.log1p(-held)
    n_total = counts["n"].sum()
    ll_full = float(full.log_likelihood(counts).sum())
    n_params = (len(full.result.params) if full.result is not None
                else getattr(full, "n_params", np.nan))
    n_req = counts["request_id"].nunique()
    intercept, slope = calibration(n_acc, n_rej, held)
    summary_row = dict(family=name, cv_log_loss=-loglik.sum() / n_total,
                       cv_brier=float(((n_acc * (1 - held) ** 2) + n_rej * held**2).sum() / n_total),
                       n_params=n_params, aic=-2 * ll_full + 2 * n_params,
                       bic=-2 * ll_full + np.log(n_req) * n_params, calibration_intercept=intercept,
                       calibration_slope=slope)
    frame = counts[["request_id", "category", "n"]].assign(loglik=loglik)
    per_request = frame.groupby("request_id", as_index=False)[["loglik", "n"]].sum().assign(family=name)
    cat = frame.groupby("category")[["loglik", "n"]].sum()
    per_category = pd.DataFrame({"family": name, "category": cat.index,
                                 "cv_log_loss": -cat["loglik"].to_numpy() / cat["n"].to_numpy()})
    return summary_row, per_request, per_category


# the candidates of the primary-law rule (docs/law.md): GLM families without category or drafter terms
PRIMARY_CANDIDATES = ("law_logit", "law_exp", "law_exp0", "law_power", "law_exp_cum", "law_exp_drafted", "law_exp_lag",
                      "law_exp_runmean", "law_exp_pos", "law_exp_ceil", "law_exp_obs", "law_exp_obs_ceil")
# candidates where every arm's trials hold their columns (context_match, target_top1_prob)
COVARIATE_CANDIDATES = ("law_exp_obs_ceil_copy", "law_exp_obs_ceil_top1", "law_exp_obs_ceil_top1_copy")


def choose_primary(comparisons: dict, candidates: Sequence[str] = PRIMARY_CANDIDATES) -> tuple[str, pd.DataFrame]:
    """docs/law.md's rule on LOCO comparisons, one per arm: (winner, table of CV log-loss per arm and mean, difference
    to the best with its SE, ``tied``, ``n_params``, ``eligible``); the fewest parameters win a tie."""
    if not comparisons:
        raise ValueError("choose_primary needs one comparison per arm")
    arms_ = list(comparisons)
    scored = [f for f in candidates if all(f in c.summary.index for c in comparisons.values())]
    if not scored:
        raise ValueError(f"no candidate of {list(candidates)} was scored on every arm")
    table = pd.DataFrame({arm: comparisons[arm].summary["cv_log_loss"].reindex(list(candidates)) for arm in arms_})
    table["mean_cv_log_loss"] = table[arms_].mean(axis=1)
    table["eligible"] = table.index.isin(scored)
    best = table.loc[scored, "mean_cv_log_loss"].idxmin()

    def delta(fam) -> tuple[float, float]:  # the mean paired difference over arms and its SE
        if fam not in scored:
            return np.nan, np.nan
        pairs = [comparisons[a].paired_difference(fam, best) if fam != best else (0.0, 0.0) for a in arms_]
        return float(np.mean([d for d, _ in pairs])), float(np.sqrt(sum(s**2 for _, s in pairs)) / len(arms_))

    table["delta_vs_best"], table["delta_se"] = zip(*map(delta, table.index))
    table["tied"] = table["eligible"] & (table["delta_vs_best"] <= table["delta_se"])
    first = comparisons[arms_[0]].summary
    table["n_params"] = [(first.loc[f, "n_params"] + (1 if get_family(f).profile_eps else 0)) if f in first.index
                         else np.nan for f in table.index]
    contenders = table.loc[table["tied"]].sort_values(["n_params", "mean_cv_log_loss"])
    winner = str(contenders.index[0])
    table["primary"] = table.index == winner
    return winner, table


def category_share_of_gain(rows: pd.DataFrame, family, *, n_folds: int = 5, seed: int = 0) -> dict:
    """The share of the CV gain over depth only that category terms add to ``family``:
    (LL(family) - LL(family+cat)) / (LL(depth_only) - LL(family+cat)), LL the CV log-loss per trial."""
    from entropy_law.law.fit import with_category_terms

    fam = get_family(family)
    with_cat = with_category_terms(fam)
    comp = compare_laws(rows, (DEPTH_ONLY, fam.name, with_cat), n_folds=n_folds, seed=seed)
    s = comp.summary["cv_log_loss"]
    missing = [m for m in (DEPTH_ONLY, fam.name, with_cat.name) if m not in s.index]
    if missing:
        raise ValueError(f"category share of {fam.name}: {missing} not scored ({'; '.join(comp.notes)})")
    total = s[DEPTH_ONLY] - s[with_cat.name]
    gain_cat = s[fam.name] - s[with_cat.name]
    return dict(family=fam.name, cv_log_loss_depth_only=float(s[DEPTH_ONLY]), cv_log_loss_law=float(s[fam.name]),
                cv_log_loss_law_cat=float(s[with_cat.name]), cv_gain_law_vs_depth_only=float(s[DEPTH_ONLY] - s[fam.name]),
                cv_gain_cat_vs_law=float(gain_cat), cv_category_share=float(gain_cat / total) if total > 0 else np.nan)
