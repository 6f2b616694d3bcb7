"""Per-request prediction of tokens per round with a prediction interval, and per-category reliability.

Intervals are on log(tokens per round), centre log(T / E[N]) + b (b the mean training residual), variance the
sum of the sampling variance Var(N) / E[N]^2 (the DP of ``blocks`` extended to E[N^2]), the law's parameter
uncertainty (cluster-robust coefficient draws), the request and category overdispersion and Var(b), all
estimated on training categories only (``loco_predictions``, leave one category out). No torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from entropy_law.law import atrisk
from entropy_law.law.blocks import expected_round_counts, tau_distribution
from entropy_law.law.fit import FittedLaw, fit_law, prediction_frame
from entropy_law.law.results import Result
from entropy_law.law.stats import FEW_REQUESTS, SmallSampleWarning, exact_spearman_p
from entropy_law.law.information import predictor_inputs, sets_allowing, sets_label
from entropy_law.law.transfer import (TrainingDepthModel, _observed_rounds, drafted_depths, loco_inputs,
                                      replayed_arrays, sequence_context, with_start_entropy)

LEVEL = 0.90
N_DRAWS = 20  # parameter draws per held-out category
RELIABILITY_BINS = 10  # equal-width bins of the predicted acceptance
# where the bias and overdispersion come from: residuals of the training categories predicted out of sample
# (each by a law fitted without it: "nested") or in sample (by the law fitted on all of them)
OVERDISPERSION_SOURCES = ("nested", "in-sample")


def round_count_moments(acceptance: np.ndarray, depth_probs: np.ndarray | None = None) -> tuple[float, float]:
    """(E[N], Var[N]) of the number of rounds N to commit T tokens: N(t) = 1 + N(t + tau + 1), tau ~
    ``blocks.tau_distribution`` (acceptance capped at the drafted depth), N(t >= T) = 0, rounds
    independent given their start (the law's assumption). E[N^2](t) = sum_k P(k) (1 + 2 E[N'] + E[N'^2])."""
    p_tau = tau_distribution(acceptance, depth_probs)
    length, width = p_tau.shape
    m1 = np.zeros(length + width + 1)
    m2 = np.zeros(length + width + 1)
    for t in range(length - 1, -1, -1):
        nxt1, nxt2 = m1[t + 1 : t + width + 1], m2[t + 1 : t + width + 1]
        m1[t] = 1.0 + p_tau[t] @ nxt1
        m2[t] = p_tau[t] @ (1.0 + 2.0 * nxt1 + nxt2)
    return float(m1[0]), float(max(m2[0] - m1[0] ** 2, 0.0))


def _design(law: FittedLaw, frame: pd.DataFrame) -> np.ndarray:
    """The GLM design matrix of ``frame``'s rows (what ``law.predict_frame`` multiplies the coefficients by)."""
    model = law.result.model
    data = prediction_frame(law._frame(frame), model)
    # statsmodels' own formula transform (the one ``result.predict`` uses), so the columns match the coefficients
    x, _ = law.result._transform_predict_exog(data)
    x = np.asarray(x, dtype=float)
    if len(x) != len(frame):  # patsy drops rows with missing values: never silently
        raise ValueError(f"{len(frame) - len(x)} of {len(frame)} rows have missing covariates; fix the traces")
    return x


def _designs(law: FittedLaw, frames: list) -> list:
    """``_design`` of each of ``frames``, split from one build over all their rows (one patsy call, not one each)."""
    return np.split(_design(law, pd.concat(frames, ignore_index=True)),
                    np.cumsum([len(f) for f in frames])[:-1]) if frames else []


def _acceptance(law: FittedLaw, x: np.ndarray, params: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        mu = law.result.model.family.link.inverse(x @ params)
    accept = 1.0 - mu if law.family.outcome == "rejection" else mu
    return np.clip(accept, 1e-12, 1 - 1e-12)


def parameter_draws(law: FittedLaw, n_draws: int, seed: int) -> np.ndarray:
    """``[n_draws, K]`` coefficient draws from N(estimate, covariance of the fit)."""
    if law.result is None:
        raise ValueError(f"{law.family.name} has no GLM coefficients to draw")
    cov = np.asarray(law.result.cov_params(), dtype=float)
    if not np.all(np.isfinite(cov)):
        raise ValueError(f"{law.family.name}: the coefficient covariance is not finite (separated fit?)")
    rng = np.random.default_rng(seed)
    return rng.multivariate_normal(np.asarray(law.result.params, dtype=float), cov, size=n_draws, method="eigh")


def request_moments(law: FittedLaw, sequences: pd.DataFrame, B: int, depth_model: TrainingDepthModel | None, *,
                    draws: np.ndarray | None = None, proposals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per request of ``sequences`` (``transfer.entropy_sequences`` rows): ``tokens``, the law's E[N] and Var[N]
    (drafted depths from ``depth_model``, or from the drafter's replayed ``proposals``), ``predicted_drafting_rounds``,
    ``predicted_tokens_per_round`` = T / E[N], ``var_log_sampling`` = Var[N] / E[N]^2 and, with ``draws``
    (coefficient draws), ``var_log_parameters``: the variance of log E[N] over the draws."""
    drafts = int(B) - 1
    if (depth_model is None) == (proposals is None):
        raise ValueError("give exactly one of depth_model (a TrainingDepthModel) and proposals (replayed proposals)")
    replayed = replayed_arrays(proposals, sequences, drafts) if proposals is not None else None
    built, rows = [], []  # per request: record, entropies, rows to predict (one design for all), shape, depths
    for rec in sequences.itertuples():
        h = np.asarray(rec.entropy, dtype=float)
        probs, top1 = (replayed[(str(rec.run_id), str(rec.request_id))] if replayed is not None
                       else (depth_model.probabilities(h, getattr(rec, "context_match", None)), None))
        frame, shape = law.sequence_frame(h, drafts, draft_top1=top1 if law.family.needs_draft_stats else None,
                                          **sequence_context(law, rec))
        built.append((rec, h, frame, shape, probs))
    for (rec, h, _, shape, probs), x in zip(built, _designs(law, [b[2] for b in built])):
        a = law.shape_acceptance(_acceptance(law, x, np.asarray(law.result.params, dtype=float)), shape)
        mean, var = round_count_moments(a, probs)
        row = dict(run_id=rec.run_id, request_id=rec.request_id, category=rec.category, tokens=h.size,
                   predicted_rounds=mean, var_rounds=var,
                   predicted_drafting_rounds=expected_round_counts(a, probs)[1],
                   predicted_tokens_per_round=h.size / mean,
                   var_log_sampling=var / mean**2)
        if draws is not None:
            logs = [np.log(round_count_moments(law.shape_acceptance(_acceptance(law, x, theta), shape), probs)[0])
                    for theta in draws]
            row["var_log_parameters"] = float(np.var(logs, ddof=1)) if len(logs) > 1 else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Overdispersion:
    """Residual variance of log tokens per round beyond the law's sampling variation, from training requests:
    ``bias`` (mean of the category-mean residuals), ``sigma2_request`` (within a category),
    ``sigma2_category`` (between categories) and ``var_bias``, the variance of ``bias``."""

    bias: float
    sigma2_request: float
    sigma2_category: float
    var_bias: float
    categories: int
    requests: int

    @classmethod
    def estimate(cls, residual: pd.DataFrame, out_of_sample: bool = False) -> "Overdispersion":
        """``residual``: per training request ``category``, ``residual`` (log observed - log predicted tokens
        per round) and ``var_log_sampling``. Method of moments, each variance floored at 0.

        ``out_of_sample``: each category's residuals come from a law fitted without it (``loco_predictions``'
        nested mode); then sum r_j^2 / k has mean k / (k - 1) s^2, so ``sigma2_category`` is sum r_j^2 / k x
        (k - 1) / k (less the noise) and ``var_bias`` that over k, together s^2 (1 + 1 / k) on average
        (``tests/test_law_predict.py`` checks it by simulation). In-sample, the divisor is k - 1."""
        if residual.empty:
            raise ValueError("no training requests to estimate the overdispersion from")
        codes = pd.factorize(residual["category"])[0]  # per category: n, mean residual and mean sampling variance
        r, noise = residual["residual"].to_numpy(float), residual["var_log_sampling"].to_numpy(float)
        n = np.bincount(codes)
        means, size = np.bincount(codes, r) / n, n[codes]
        within = ((r - means[codes]) ** 2 * size / np.maximum(size - 1, 1) - noise)[size > 1]
        sigma2_request = float(max(within.mean(), 0.0)) if within.size else 0.0
        k = len(means)
        if k > 1:
            expected_noise = float(np.mean((sigma2_request + np.bincount(codes, noise) / n) / n))
            # sum r_j^2 / k has mean k / (k - 1) (sigma2 + noise) for nested residual means
            spread = float(np.var(means)) * (k - 1) / k if out_of_sample else float(np.var(means, ddof=1))
            sigma2_category = float(max(spread - expected_noise, 0.0))
            var_bias = spread / k
        else:
            sigma2_category, var_bias = 0.0, 0.0
        return cls(bias=float(means.mean()), sigma2_request=sigma2_request, sigma2_category=sigma2_category,
                   var_bias=var_bias, categories=k, requests=len(residual))


def prediction_interval(moments: pd.DataFrame, over: Overdispersion, level: float = LEVEL) -> pd.DataFrame:
    """``moments`` (``request_moments``) with the interval columns: ``center`` (T / E[N] x e^bias), ``lower``,
    ``upper`` at ``level`` and ``sd_log`` with its parts, on the log scale: Student t with ``df`` degrees of
    freedom (Welch-Satterthwaite: the between-category variance rests on the training categories' means,
    ``over.categories`` - 1 df; the normal where it is 0 or estimated from one category)."""
    if not 0 < level < 1:
        raise ValueError("level must lie in (0, 1)")
    out = moments.copy()
    param = out["var_log_parameters"] if "var_log_parameters" in out else 0.0
    between = over.sigma2_category + over.var_bias
    var = out["var_log_sampling"] + param + over.sigma2_request + between
    log_center = np.log(out["predicted_tokens_per_round"]) + over.bias
    out["center"] = np.exp(log_center)
    out["sd_log"] = np.sqrt(var)
    if between > 0 and over.categories > 1:
        df = np.asarray(var, dtype=float) ** 2 / (between ** 2 / (over.categories - 1))
        quantile = stats.t.ppf(0.5 + level / 2, df)
    else:
        df = np.full(len(out), np.inf)
        quantile = np.full(len(out), stats.norm.ppf(0.5 + level / 2))
    out["df"] = df
    out["lower"] = np.exp(log_center - quantile * out["sd_log"])
    out["upper"] = np.exp(log_center + quantile * out["sd_log"])
    return out


@dataclass
class RequestPredictions(Result):
    """LOCO per-request predictions. ``requests``: per held-out request the observed and predicted tokens
    per round, the interval and ``covered``; ``summary``: per category the coverage, mean interval width
    (relative to the centre), the variance parts; ``reliability``: per category x bin of predicted
    acceptance, the held-out trials' mean predicted and observed acceptance (Wilson 95% CI)."""

    summary: pd.DataFrame
    requests: pd.DataFrame
    reliability: pd.DataFrame
    family: str
    level: float
    notes: list = field(default_factory=list)
    info_sets: list = field(default_factory=list)  # the information sets that hold what the predictions read

    @property
    def title(self) -> str:
        return (f"per-request tokens per round, leave-one-category-out, {self.family}: {self.level:.0%} prediction "
                f"intervals (coverage {self.coverage:.1%} of {len(self.requests)} requests; "
                f"{sets_label(self.info_sets)})")

    @property
    def coverage(self) -> float:
        return float(self.requests["covered"].mean())

    def category_predictions(self) -> pd.DataFrame:
        """Per held-out category: observed tokens per round, the prediction from the requests' centres (each
        request's rounds at T / centre) and the raw DP's (T / E[N]), their relative errors; with drafting rounds,
        the mean accepted drafts per drafting round the same three ways."""
        r = self.requests
        tokens = r.groupby("category")["tokens"].sum()
        rounds = {"observed": r["tokens"] / r["observed_tokens_per_round"], "centre": r["tokens"] / r["center"],
                  "raw": r["tokens"] / r["predicted_tokens_per_round"]}

        def ratio(kind: str) -> pd.Series:
            return tokens / rounds[kind].groupby(r["category"]).sum()

        out = pd.DataFrame({"observed_tokens_per_round": ratio("observed"),
                            "predicted_tokens_per_round": ratio("centre"),
                            "predicted_tokens_per_round_raw": ratio("raw")})
        out["relative_error"] = out["predicted_tokens_per_round"] / out["observed_tokens_per_round"] - 1
        out["relative_error_raw"] = out["predicted_tokens_per_round_raw"] / out["observed_tokens_per_round"] - 1
        if {"observed_drafting_rounds", "predicted_drafting_rounds"} <= set(r.columns):
            share = r["predicted_drafting_rounds"] / r["predicted_rounds"]
            drafting = {"observed": r["observed_drafting_rounds"], "centre": rounds["centre"] * share,
                        "raw": r["predicted_drafting_rounds"]}

            def accepted(kind: str) -> pd.Series:
                return ((tokens - rounds[kind].groupby(r["category"]).sum())
                        / drafting[kind].groupby(r["category"]).sum())

            out["observed_mean_accepted"] = accepted("observed")
            out["predicted_mean_accepted"] = accepted("centre")
            out["predicted_mean_accepted_raw"] = accepted("raw")
            out["mean_accepted_relative_error"] = out["predicted_mean_accepted"] / out["observed_mean_accepted"] - 1
            out["mean_accepted_relative_error_raw"] = (out["predicted_mean_accepted_raw"]
                                                       / out["observed_mean_accepted"] - 1)
        return out

    def category_accuracy(self) -> dict:
        """Across held-out categories (``category_predictions``): mean and max |relative error| and the mean
        signed error of the centres, the raw DP's mean |relative error|, and Spearman rho of the centres'
        ranking with its exact permutation p; where the drafting rounds are known, the same mean and max for
        the mean accepted length (``mean_accepted_*``, centres and raw)."""
        cat = self.category_predictions()
        rho, p = exact_spearman_p(cat["observed_tokens_per_round"], cat["predicted_tokens_per_round"])
        out = dict(categories=len(cat), mean_abs_relative_error=float(cat["relative_error"].abs().mean()),
                   max_abs_relative_error=float(cat["relative_error"].abs().max()),
                   mean_relative_error=float(cat["relative_error"].mean()),
                   raw_mean_abs_relative_error=float(cat["relative_error_raw"].abs().mean()),
                   spearman_rho=float(rho), p_permutation=float(p))
        if "mean_accepted_relative_error" in cat:
            out.update(mean_accepted_mean_abs_relative_error=float(cat["mean_accepted_relative_error"].abs().mean()),
                       mean_accepted_max_abs_relative_error=float(cat["mean_accepted_relative_error"].abs().max()),
                       mean_accepted_raw_mean_abs_relative_error=float(
                           cat["mean_accepted_relative_error_raw"].abs().mean()))
        return out

    def coverage_interval(self, alpha: float = 0.05) -> tuple[float, float]:
        """Wilson interval of the pooled coverage, requests treated as independent: with few categories too narrow,
        as requests of one held-out category share its mean's error."""
        from statsmodels.stats.proportion import proportion_confint

        low, high = proportion_confint(int(self.requests["covered"].sum()), len(self.requests), alpha, "wilson")
        return float(low), float(high)


def reliability_table(predicted: np.ndarray, n_acc: np.ndarray, n: np.ndarray, categories: np.ndarray,
                      bins: int = RELIABILITY_BINS) -> pd.DataFrame:
    """Per category x equal-width bin of predicted acceptance: trials, mean predicted, observed acceptance and
    its Wilson 95% interval; ``ece`` per category (trial-weighted mean |observed - predicted|) on every row."""
    from statsmodels.stats.proportion import proportion_confint

    frame = pd.DataFrame({"category": categories, "p": np.asarray(predicted, dtype=float),
                          "n_acc": np.asarray(n_acc, dtype=float), "n": np.asarray(n, dtype=float)})
    frame["bin"] = np.minimum((frame["p"] * bins).astype(int), bins - 1)
    frame["pw"] = frame["p"] * frame["n"]
    cells = frame.groupby(["category", "bin"], as_index=False)[["pw", "n_acc", "n"]].sum()
    cells = cells.loc[cells["n"] > 0]
    cells["predicted"] = cells["pw"] / cells["n"]
    cells["observed"] = cells["n_acc"] / cells["n"]
    low, high = proportion_confint(cells["n_acc"].round().astype(int), cells["n"].round().astype(int), 0.05, "wilson")
    cells["observed_low"], cells["observed_high"] = np.asarray(low), np.asarray(high)
    cells["bin_low"] = cells["bin"] / bins
    gap = (cells["observed"] - cells["predicted"]).abs() * cells["n"]
    ece = gap.groupby(cells["category"]).sum() / cells["n"].groupby(cells["category"]).sum()
    cells["ece"] = cells["category"].map(ece)
    return cells.drop(columns="pw").rename(columns={"n": "trials", "n_acc": "accepted"}).reset_index(drop=True)


def loco_predictions(traces, family: str = "law_exp", *, drafter: str | None = None, B: int | None = None,
                     level: float = LEVEL, n_draws: int = N_DRAWS, seed: int = 0, eps: float = atrisk.EPS_NATS,
                     bins: int = RELIABILITY_BINS, min_categories: int = 3,
                     proposals: pd.DataFrame | None = None, overdispersion: str = "nested") -> RequestPredictions:
    """Leave-one-category-out per-request prediction with ``level`` intervals, and reliability per category.

    For each category: fit ``family`` on the others (request-clustered errors), take drafted depths from a
    ``TrainingDepthModel`` fitted on the training rounds (or, with ``proposals``, the drafter's replayed
    proposals), the bias and ``Overdispersion`` from training residuals, then each held-out request's centre,
    interval (sampling + ``n_draws`` coefficient draws + overdispersion) and whether it covers the observed tokens
    per round. Only the held-out category's entropy sequences enter. ``overdispersion``: ``"nested"`` (default,
    each training category predicted by a law fitted without it) or ``"in-sample"``. Reliability: the held-out
    at-risk trials by bin of predicted acceptance. Raises ``ValueError`` when ``n_draws`` is 1.
    """
    if n_draws == 1:
        raise ValueError("n_draws must be 0 (no parameter uncertainty) or at least 2")
    fam, drafter, rounds, B, rows, counts, categories, seqs = loco_inputs(
        traces, family, drafter=drafter, B=B, eps=eps, min_categories=min_categories, what="LOCO prediction")
    drafts = B - 1
    drafted_h = with_start_entropy(drafted_depths(traces, drafter), seqs) if proposals is None else None
    observed = _observed_rounds(rounds)
    observed["observed_tokens_per_round"] = observed["observed_tokens"] / observed["observed_rounds"]
    observed = observed[["run_id", "request_id", "observed_tokens_per_round", "observed_drafting_rounds"]]
    if overdispersion not in OVERDISPERSION_SOURCES:
        raise ValueError(f"overdispersion must be one of {OVERDISPERSION_SOURCES}, not {overdispersion!r}")
    if overdispersion == "nested" and len(categories) < 3:
        raise ValueError("overdispersion='nested' needs at least 3 categories (2 training categories per held-out "
                         "one, each predicted from the others); use overdispersion='in-sample'")

    fits = {}  # the law and depth model without a set of categories: nested mode needs each pair twice

    def fitted_law(exclude: list):
        key = frozenset(exclude)
        if key not in fits:
            with warnings.catch_warnings():  # few requests: said once in the notes, not once per held-out category
                warnings.simplefilter("ignore", SmallSampleWarning)
                law = fit_law(counts.loc[~counts["category"].isin(exclude)], fam, cov_type="cluster")
            fits[key] = law, (TrainingDepthModel.fit(drafted_h.loc[~drafted_h["category"].isin(exclude)], drafts)
                              if proposals is None else None)
        return fits[key]

    def residuals(law, model, predicted: pd.Series) -> pd.DataFrame:
        out = request_moments(law, seqs.loc[predicted], B, model, proposals=proposals).merge(
            observed, on=["run_id", "request_id"])
        out["residual"] = np.log(out["observed_tokens_per_round"] / out["predicted_tokens_per_round"])
        return out

    held_out, reliability, notes = [], [], []
    for i, cat in enumerate(categories):
        law, model = fitted_law([cat])
        if overdispersion == "in-sample":
            fitted = residuals(law, model, seqs["category"] != cat)
        else:  # each training category predicted by a law and depth model fitted without it (and without cat)
            fitted = pd.concat([residuals(*fitted_law([cat, inner]), seqs["category"] == inner)
                                for inner in categories if inner != cat], ignore_index=True)
        over = Overdispersion.estimate(fitted, out_of_sample=overdispersion == "nested")
        draws = parameter_draws(law, n_draws, seed + i) if n_draws else None
        pred = request_moments(law, seqs.loc[seqs["category"] == cat], B, model, draws=draws, proposals=proposals)
        pred = prediction_interval(pred.merge(observed, on=["run_id", "request_id"]), over, level)
        pred = pred.assign(bias=over.bias, sigma2_request=over.sigma2_request, sigma2_category=over.sigma2_category,
                           var_bias=over.var_bias)
        held_out.append(pred)
        test_rows = rows.loc[rows["category"] == cat]
        reliability.append(reliability_table(law.predict_frame(test_rows), test_rows["accepted"].to_numpy(),
                                             np.ones(len(test_rows)), test_rows["category"].to_numpy(), bins))
    requests = pd.concat(held_out, ignore_index=True)
    summary = _coverage_summary(requests, n_draws)
    _add_loco_notes(notes, int(counts["request_id"].nunique()), proposals is None, overdispersion, n_draws)
    return RequestPredictions(summary=summary, requests=requests, reliability=pd.concat(reliability, ignore_index=True),
                              family=fam.name, level=level, notes=notes, info_sets=sets_allowing(
                                  predictor_inputs(fam, "training" if proposals is None else "replayed")))


def _coverage_summary(requests: pd.DataFrame, n_draws: int) -> pd.DataFrame:
    """Mark each request covered or not and summarise coverage, width, error and variance parts per category."""
    requests["covered"] = ((requests["observed_tokens_per_round"] >= requests["lower"])
                           & (requests["observed_tokens_per_round"] <= requests["upper"]))
    requests["relative_error"] = requests["center"] / requests["observed_tokens_per_round"] - 1
    g = requests.groupby("category")
    return pd.DataFrame({
        "requests": g.size(), "coverage": g["covered"].mean(),
        "below": g.apply(lambda d: float((d["observed_tokens_per_round"] < d["lower"]).mean()), include_groups=False),
        "above": g.apply(lambda d: float((d["observed_tokens_per_round"] > d["upper"]).mean()), include_groups=False),
        "mean_relative_width": ((requests["upper"] - requests["lower"]) / requests["center"]).groupby(
            requests["category"]).mean(),
        "mean_abs_relative_error": requests["relative_error"].abs().groupby(requests["category"]).mean(),
        "sd_log_sampling": np.sqrt(g["var_log_sampling"].mean()),
        "sd_log_parameters": np.sqrt(g["var_log_parameters"].mean()) if n_draws else 0.0,
        "sd_log_request": np.sqrt(g["sigma2_request"].first()),
        "sd_log_category": np.sqrt(g["sigma2_category"].first()),
        "bias": g["bias"].first(),
    })


def _add_loco_notes(notes: list, n_requests: int, training_depths: bool, overdispersion: str, n_draws: int) -> None:
    """The interval's recipe first, and a warning on few requests."""
    if n_requests < FEW_REQUESTS:
        notes.append(f"{n_requests} requests (fewer than {FEW_REQUESTS}): the coefficient draws' cluster-robust covariance "
                     "and the overdispersion are not measured reliably; record more requests")
    depth_source = "the training depth model" if training_depths else "the drafter's replayed proposals"
    residual_source = ("out-of-sample residuals (each training category predicted by a law fitted without it)"
                       if overdispersion == "nested" else "in-sample residuals")
    notes.insert(0, f"interval: Student t on log(tokens/round) (Welch-Satterthwaite df); sampling variance from the "
                 f"DP's Var[N] given the request's entropy sequence and {depth_source}, {n_draws} coefficient draws "
                 "(cluster-robust), request and category overdispersion and the bias b from the training "
                 f"categories' {residual_source} (method of moments)")


def report_section(predictions: dict) -> tuple[str, pd.DataFrame]:
    """(title, table) for the report: per arm and category the coverage of the LOCO per-request intervals,
    their mean relative width and the reliability (ECE) of the held-out trials; ``predictions``: arm ->
    ``RequestPredictions``."""
    frames = []
    for arm, pred in predictions.items():
        ece = pred.reliability.drop_duplicates("category").set_index("category")["ece"]
        frame = pred.summary[["requests", "coverage", "mean_relative_width", "mean_abs_relative_error"]].assign(
            ece=ece).reset_index()
        frame.insert(0, "arm", arm)
        frames.append(frame)
    level = next(iter(predictions.values())).level if predictions else LEVEL
    return (f"Per-request prediction, leave-one-category-out: {level:.0%} interval coverage and reliability (ECE)",
            pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


REPORT_DRAWS = 10  # coefficient draws per held-out category in the report (the bench uses N_DRAWS)


def analysis_predictions(analysis, arm: str, *, n_draws: int = REPORT_DRAWS) -> RequestPredictions:
    """``loco_predictions`` of one arm of a ``TraceAnalysis`` with its law family and seed, computed once
    per analysis (shared by the report section and the reliability figure)."""
    return analysis._cached(("request_predictions", arm, n_draws),
                            lambda: loco_predictions(analysis.arm_view(arm), analysis.family, drafter=arm,
                                                     n_draws=n_draws, seed=analysis.seed))


def request_prediction_section(analysis) -> tuple[str, pd.DataFrame, list]:
    """(title, table, notes) of the report's per-request prediction section: per arm and category the
    coverage of the LOCO 90% intervals, their mean relative width, the mean |relative error| of the centre
    and the held-out trials' reliability (ECE); arms where it cannot run are named in the notes."""
    predictions, notes = {}, []
    for arm in analysis.arms:
        try:
            predictions[arm] = analysis_predictions(analysis, arm)
        except ValueError as err:  # the law layer's "too little / wrong data" errors
            notes.append(f"per-request prediction, {arm}: not available: {err}")
        except Exception as err:  # numerical failures on degenerate data, as TraceAnalysis.attempt reports them
            notes.append(f"per-request prediction, {arm}: failed: {type(err).__name__}: {err}")
    title, frame = report_section(predictions)
    if predictions:
        notes.append("per-request prediction: " + next(iter(predictions.values())).notes[0]
                     + "; coverage = share of held-out requests whose observed tokens per round lies in the interval")
    return title, frame, notes
