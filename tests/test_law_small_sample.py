"""Intervals from few requests: fits and bootstraps warn below ``stats.FEW_REQUESTS`` requests, the
cluster-robust intervals use t(G - 1) (widened against the normal ones), and every interval says how
many requests it rests on (fit and bootstrap summaries, the report)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import statsmodels.formula.api as smf
from scipy import stats
from statsmodels.tools.sm_exceptions import PerfectSeparationWarning

from entropy_law.law import stats as law_stats
from entropy_law.law.bootstrap import bootstrap_law
from entropy_law.law.fit import _family_obj, check_counts, fit_law, get_family, prepare_counts
from entropy_law.analysis.simulate import simulate_traces

TWO = dict(seed=0, n_requests_per_category=2, categories=["qa"], tokens_per_request=(40, 60))


@pytest.fixture(scope="module")
def two_requests():
    return simulate_traces(**TWO)


@pytest.fixture(scope="module")
def many_requests():
    return simulate_traces(seed=7, n_requests_per_category=20, categories=["qa", "math_reasoning", "rag"],
                           tokens_per_request=(40, 60))


def _small_sample_warnings(record) -> list:
    return [w for w in record if w.category.__name__ == "SmallSampleWarning"]


def _normal_cluster_interval(traces):
    """The interval of k as fit_law gave it before: statsmodels' CR1 cluster sandwich with a normal quantile."""
    fam = get_family("law_exp")
    counts, _ = check_counts(prepare_counts(traces, fam), fam)
    data = counts.loc[counts["n"] > 0]
    groups = data["request_id"].astype("category").cat.codes.to_numpy()
    res = smf.glm("n_rej + n_acc ~ C(depth) + log_entropy", data, family=_family_obj("cloglog")).fit(
        cov_type="cluster", cov_kwds={"groups": groups})
    assert not res.use_t
    return res.bse["log_entropy"], res.conf_int().loc["log_entropy"].to_numpy()


def test_two_requests_warn_and_widen_the_interval_of_k(two_requests):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        law = fit_law(two_requests, "law_exp")
    k = law.summary.loc["k"]
    se, (old_low, old_high) = _normal_cluster_interval(two_requests)
    assert k["std_err"] == pytest.approx(se, rel=1e-6)  # the CR1 sandwich itself is unchanged
    # t(1) quantile instead of the normal one: 12.71 / 1.96 = 6.5 times wider
    t1 = stats.t.ppf(0.975, 1)
    assert k["ci_high"] - k["ci_low"] == pytest.approx(2 * t1 * se, rel=1e-6)
    assert k["ci_high"] - k["ci_low"] > 6 * (old_high - old_low)
    # at least as wide as the non-robust interval (whose SE, 0.204, is 2.4 times the clustered 0.087 here)
    with warnings.catch_warnings(record=True) as plain_record:
        warnings.simplefilter("always")
        plain = fit_law(two_requests, "law_exp", cov_type="nonrobust").summary.loc["k"]
    assert plain["std_err"] > 2 * k["std_err"]
    assert k["ci_high"] - k["ci_low"] >= plain["ci_high"] - plain["ci_low"]
    # one warning per cluster-robust fit, saying how many requests; none for the non-robust fit
    found = _small_sample_warnings(record)
    assert len(found) == 1 and issubclass(found[0].category, UserWarning) and "2 requests" in str(found[0].message)
    assert not _small_sample_warnings(plain_record)
    assert law.n_requests == 2 and law.df_inference == 1
    # p-values are t(1) too, and the summary says how many requests the intervals rest on
    coef = law.summary.loc["log_entropy"]
    assert coef["p_value"] == pytest.approx(2 * stats.t.sf(abs(coef["estimate"] / coef["std_err"]), 1), rel=1e-6)
    assert (law.summary["n_requests"] == 2).all()
    text = law._text()
    assert "t with 1 df" in text and "rest on 2 requests" in text and "not measured reliably" in text


def test_many_requests_do_not_warn_and_use_t_with_g_minus_1_df(many_requests):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        law = fit_law(many_requests, "law_exp")
    assert not _small_sample_warnings(record)
    assert law.n_requests == 60 and law.df_inference == 59
    k = law.summary.loc["k"]
    half = stats.t.ppf(0.975, 59) * k["std_err"]
    np.testing.assert_allclose([k["ci_low"], k["ci_high"]], [k["estimate"] - half, k["estimate"] + half], rtol=1e-9)
    assert (law.summary["n_requests"] == 60).all()


def test_threshold_is_twenty_requests():
    assert law_stats.FEW_REQUESTS == 20
    with pytest.warns(law_stats.SmallSampleWarning, match="19 requests"):
        assert "19 requests" in law_stats.warn_if_few_requests(19, "these intervals")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert law_stats.warn_if_few_requests(20, "these intervals") is None


def test_fit_by_drafter_warns_per_fitted_law(two_requests):
    with pytest.warns(law_stats.SmallSampleWarning) as record:
        laws = fit_law(two_requests, "law_exp", by="drafter_id")
    assert len(_small_sample_warnings(record)) == len(laws.laws)
    assert (laws.summary["n_requests"] == 2).all()


def test_bootstrap_warns_once_and_says_how_many_requests(two_requests, many_requests):
    with pytest.warns(law_stats.SmallSampleWarning, match="request-bootstrap intervals rest on 2 requests") as rec:
        boot = bootstrap_law(two_requests, n_boot=8, seed=1)
    assert len(_small_sample_warnings(rec)) == 1  # the replicates' non-robust refits stay silent
    assert boot.n_requests == 2 and (boot.summary["n_requests"] == 2).all()
    assert "over 2 requests" in boot.title
    assert any("2 requests" in n and "not measured reliably" in n for n in boot.notes)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        big = bootstrap_law(many_requests, n_boot=3, seed=1)
    assert not _small_sample_warnings(record)
    assert big.n_requests == 60 and (big.summary["n_requests"] == 60).all()


def test_report_shows_the_requests_beside_every_interval():
    from entropy_law.jobs import report
    from entropy_law.analysis import TraceAnalysis

    traces = simulate_traces(seed=0, n_requests_per_category=1, categories=["qa", "rag"], include_ar=True,
                             tokens_per_request=(40, 60))
    an = TraceAnalysis(traces, n_boot=4, compare_families=("law_exp",), n_folds=2)
    with pytest.warns(law_stats.SmallSampleWarning):  # the law, the speedup model, the CV comparison
        frame = report.law_frame(an).set_index("arm")
        summary = report.terminal_summary(an)
        sections = dict(report._sections(an))
    arm = an.arms[0]
    assert frame.loc[arm, "requests"] == 2 and frame.loc[arm, "break-even: requests"] == 2
    assert summary.count("(n = 2 requests)") == 2  # the law's intervals and the break-even interval
    assert "not measured reliably" in summary
    pays = sections[f"When drafting pays at constant entropy: {arm}"]
    assert {"ci_low", "ci_high", "requests"} <= set(pays.columns) and (pays["requests"] == 2).all()
    workload = next(v for k, v in sections.items() if k.startswith(f"When drafting pays on a workload: {arm}"))
    assert {"ci_low", "ci_high", "requests"} <= set(workload.columns) and (workload["requests"] == 2).all()
    assert any("rest on 2 requests" in n for n in sections["Notes"])
    md = report.results_markdown(an)
    assert "break-even: requests" in md and "not measured reliably" in md


def test_when_drafting_pays_on_two_requests_warns_once_and_shows_n_requests():
    from entropy_law.payoff.cost import when_drafting_pays

    traces = simulate_traces(**TWO, include_ar=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pays = when_drafting_pays(traces, n_boot=6, seed=2)
    found = _small_sample_warnings(record)
    # one warning for its own intervals (the bootstrap's); the law behind the estimates only predicts
    assert len(found) == 1 and "request-bootstrap intervals rest on 2 requests" in str(found[0].message)
    assert found[0].filename == __file__  # it points at the caller
    assert "record more requests" in str(found[0].message)
    assert (pays.summary["n_requests"] == 2).all()
    assert list(pays.summary.columns[-3:]) == ["ci_low", "ci_high", "n_requests"]
    assert any("rest on 2 requests" in n and "not measured reliably" in n for n in pays.notes)
    assert pays.law.result.cov_type == "nonrobust"


def test_a_report_on_few_requests_warns_once_per_interval_shown(tmp_path):
    """Internal fits (CV folds, LOCO and its refits, the comparison's probes, the cost law) show no
    interval and must not warn: a report on 6 requests warns for the law and the break-even intervals only."""
    from entropy_law.jobs.report import write_report
    from entropy_law.analysis import TraceAnalysis

    traces = simulate_traces(seed=0, n_requests_per_category=2, categories=["qa", "rag", "math_reasoning"],
                             include_ar=True, tokens_per_request=(40, 60))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        an = TraceAnalysis(traces, n_boot=6, compare_families=("law_logit", "law_exp", "law_spline"), n_folds=3)
        write_report(traces, tmp_path, fmt="md", analysis=an, figure_formats=("png",))
    arm = an.arms[0]
    assert len(an.arms) == 1
    for what in ("law", "loco", "comparison", "pays", "workload"):  # everything that fits ran, on 6 requests
        assert an.attempt(what, arm).ok, what
    found = _small_sample_warnings(record)
    messages = sorted(str(w.message) for w in found)
    # one for the law's intervals, one for the constant-entropy break-even / speedup bootstrap, one for the workload
    # break-even's; with cluster-robust CV, LOCO fits it is 20 here (48 with the report's default families and
    # folds, the probes cluster-robust too)
    assert len(messages) == 3, messages
    assert messages[0].startswith("the cluster-robust intervals of law_exp") and "rest on 6 requests" in messages[0]
    assert messages[1].startswith("the request-bootstrap intervals rest on 6 requests")
    assert messages[2].startswith("the workload break-even intervals rest on 6 requests")
    assert all(m.endswith("not measured reliably; record more requests") for m in messages)  # what to do
    assert not [w for w in found if w.filename.endswith(("compare.py", "transfer.py", "cost.py"))]
    # and no floating-point noise from the fits (separated spline folds, extreme linear predictors), nor
    # statsmodels' perfect-prediction line per IRLS call of LOCO's refits and the profiled offsets (dozens in a demo)
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)]
    assert not [w for w in record if issubclass(w.category, PerfectSeparationWarning)]


def test_cloglog_predictions_beyond_the_data_do_not_overflow_noisily():
    """A bootstrap replicate on 3 requests can run a coefficient away; its predictions at 20 nats (the
    break-even search) pushed exp() in the cloglog inverse link past overflow: 42 RuntimeWarnings before."""
    from entropy_law.analysis import TraceAnalysis

    traces = simulate_traces(seed=0, n_requests_per_category=1, categories=["qa", "rag", "math_reasoning"],
                             include_ar=True, tokens_per_request=(40, 60))
    an = TraceAnalysis(traces, n_boot=20)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pays = an.pays(an.arms[0])
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(_small_sample_warnings(record)) == 1
    assert np.isfinite(pays.summary["estimate"].drop("breakeven_entropy_nats")).all()
    law = pays.law
    h = np.array([1e-3, 1.0, 20.0, 1e6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = law.predict_acceptance(h, 1)
    assert ((a >= 1e-12) & (a <= 1 - 1e-12)).all() and np.all(np.diff(a) <= 0)


def test_a_separated_fit_is_flagged_whatever_its_covariance(two_requests):
    """law_spline on two requests separates cells (fitted probabilities of exactly 0 or 1): its cluster-robust
    SEs are NaN, which is how the comparison used to notice; with non-robust CV fits ``separated`` notices."""
    from entropy_law.law.compare import _fit_failure, compare_laws

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        robust = fit_law(two_requests, "law_spline")
        plain = fit_law(two_requests, "law_spline", cov_type="nonrobust")
        exp = fit_law(two_requests, "law_exp", cov_type="nonrobust")
    assert not [w for w in record if issubclass(w.category, RuntimeWarning)]  # overflow / divide, silenced
    np.testing.assert_array_equal(robust.result.params, plain.result.params)  # the same fit either way
    assert not np.isfinite(robust.result.bse).all() and np.isfinite(plain.result.bse).all()
    assert robust.separated and plain.separated and not exp.separated
    assert any("perfect separation" in n for n in plain.notes)
    assert "non-finite" in _fit_failure(robust, "all data")
    assert "perfect separation" in _fit_failure(plain, "all data")
    assert _fit_failure(exp, "all data") is None
    with pytest.raises(ValueError, match="at least 2 requests"):  # a training fold of one request
        compare_laws(two_requests, ("law_exp",), n_folds=2)


def test_statsmodels_perfect_prediction_is_a_note_not_a_warning_line():
    """The at-risk cells of one Spec-Bench category, 2 requests, of a demo's block DDTree16 run (every depth-1
    draft accepted): statsmodels' IRLS warns of perfect separation or prediction for law_exp_obs_ceil, once per
    IRLS call (the LOCO refit on the held-out category and each profiled offset: ~30 lines in a demo). The fit
    keeps it on the result and in its notes instead; other warnings pass through."""
    import pandas as pd

    counts = pd.read_csv(Path(__file__).parent / "data" / "perfect_prediction_counts.csv",
                         dtype={"request_id": str, "category": str, "drafter_id": str})
    fam = get_family("law_exp_obs_ceil")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        law = fit_law(counts, fam, cov_type="nonrobust")
        plain = fit_law(counts, "law_exp", cov_type="nonrobust")
    assert not [w for w in record if issubclass(w.category, PerfectSeparationWarning)]
    # set from the warnings statsmodels gave during this fit (the condition is statsmodels' own, not made up here)
    assert law.result.perfect_prediction and not law.separated
    assert any("PerfectSeparationWarning" in n for n in law.notes)
    assert not plain.result.perfect_prediction and not any("PerfectSeparationWarning" in n for n in plain.notes)


def test_other_warnings_of_the_glm_fit_still_show(two_requests, monkeypatch):
    from statsmodels.genmod.generalized_linear_model import GLM
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    original = GLM.fit

    def fit(self, *args, **kwargs):
        warnings.warn("made-up convergence trouble", ConvergenceWarning)
        warnings.warn("made-up perfect prediction", PerfectSeparationWarning)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GLM, "fit", fit)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        law = fit_law(two_requests, "law_exp", cov_type="nonrobust")
    assert [str(w.message) for w in record if issubclass(w.category, ConvergenceWarning)] == [
        "made-up convergence trouble"]
    assert not [w for w in record if issubclass(w.category, PerfectSeparationWarning)]
    assert law.result.perfect_prediction and any("PerfectSeparationWarning" in n for n in law.notes)
    assert not law.result.rank_deficient and not any("rank-deficient" in n for n in law.notes)


def test_a_rank_deficient_design_is_a_note_not_a_warning_line(two_requests):
    """The report's law comparison printed statsmodels' SingularMatrixWarning with its source line (a term
    constant in a fold); it is now kept on the result and in the fit's notes. Here: a term that duplicates
    another (the entropy slope twice), a design that is rank-deficient by construction."""
    from dataclasses import replace

    from statsmodels.tools.sm_exceptions import SingularMatrixWarning

    fam = get_family("law_exp")
    twice = replace(fam, name="law_exp_twice", terms=f"{fam.terms} + I(2 * {fam.slope})")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        law = fit_law(two_requests, twice, cov_type="nonrobust")
    assert not [w for w in record if issubclass(w.category, SingularMatrixWarning)]
    assert law.result.rank_deficient and any("rank-deficient" in n for n in law.notes)
    plain = fit_law(two_requests, "law_exp", cov_type="nonrobust")
    np.testing.assert_allclose(law.result.fittedvalues, plain.result.fittedvalues, rtol=1e-3, atol=1e-4)  # unique


def test_one_percentile_rule_for_every_bootstrap_interval():
    """``bootstrap.percentile_interval`` (the law's, the cost model's and the workload's intervals): NaN skipped,
    linear interpolation, the nearest replicate where interpolation would meet inf (a break-even that pays at
    every entropy), NaN for no replicates."""
    import numpy as np
    import pandas as pd

    from entropy_law.law.bootstrap import percentile_interval

    reps = pd.DataFrame({"a": [float(v) for v in range(1, 101)] + [np.nan],
                         "b": [1.0] * 90 + [np.inf] * 11, "c": [np.nan] * 101})
    lo, hi = percentile_interval(reps, 0.95)
    # by hand: position 0.025 x 99 = 2.475 between the 3rd and 4th values (3, 4): 3.475; 97.525 likewise
    assert lo["a"] == pytest.approx(3.475, abs=1e-12) and hi["a"] == pytest.approx(97.525, abs=1e-12)
    assert lo["b"] == 1.0 and hi["b"] == np.inf  # not NaN (inf - inf)
    assert np.isnan(lo["c"]) and np.isnan(hi["c"])
    lo, hi = percentile_interval(reps.iloc[:0], 0.9)
    assert lo.isna().all() and hi.isna().all() and list(lo.index) == ["a", "b", "c"]
