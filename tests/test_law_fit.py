"""fit_law: recovery of a known law, agreement with independent computations, predictions, bad input."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.optimize import minimize

from entropy_law.law import atrisk
from entropy_law.law.blocks import expected_accepted, expected_rounds, iid_tokens_per_round, alpha_eff
from entropy_law.law.fit import fit_law
from entropy_law.analysis.simulate import SimulatedTraces, TreeSpec, simulate_traces
from entropy_law.law.transfer import block_prediction

K_TRUE, LAMBDA_TRUE = 0.8, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]


@pytest.fixture(scope="module")
def traces():
    return simulate_traces(seed=21, n_requests_per_category=30, k=K_TRUE, lambda_d=LAMBDA_TRUE, block_size=8,
                           tokens_per_request=(80, 140))


@pytest.fixture(scope="module")
def law(traces):
    return fit_law(traces, "law_exp")


def test_recovery_coverage_small_study():
    """A small version of bench/law.py recovery: k and lambda_1 inside their 95% CIs, and the
    standardised errors of k behave like N(0, 1) draws."""
    hits_k = hits_l = 0
    z = []
    n_sets = 16
    for i in range(n_sets):
        tr = simulate_traces(seed=500 + i, n_requests_per_category=12, categories=["qa", "math_reasoning", "rag"],
                             k=0.7, lambda_d=1.3, block_size=5, tokens_per_request=(60, 100))
        s = fit_law(tr, "law_exp").summary
        hits_k += s.loc["k", "ci_low"] <= 0.7 <= s.loc["k", "ci_high"]
        hits_l += s.loc["lambda[d=1]", "ci_low"] <= 1.3 <= s.loc["lambda[d=1]", "ci_high"]
        z.append((s.loc["k", "estimate"] - 0.7) / s.loc["k", "std_err"])
    # with true 95% coverage, P(<= 12 of 16) is below 1%; the seeds are fixed
    assert hits_k >= 13 and hits_l >= 13, (hits_k, hits_l)
    z = np.array(z)
    assert abs(z.mean()) < 3 / np.sqrt(n_sets)
    assert stats.chi2.ppf(0.001, n_sets) < (z**2).sum() < stats.chi2.ppf(0.999, n_sets)


def test_law_exp_matches_direct_maximum_likelihood(traces, law):
    """Independent fit: scipy minimises the cloglog hazard likelihood on the same aggregated table."""
    rows = atrisk.at_risk_table(traces)
    agg = atrisk.aggregate_at_risk(rows)
    depth = agg["depth"].to_numpy()
    x = agg["log_entropy"].to_numpy()
    n_rej, n_acc = agg["n_rej"].to_numpy(float), agg["n_acc"].to_numpy(float)

    def nll(theta):
        log_lam = theta[:7][depth - 1]
        rate = np.exp(log_lam + theta[7] * x)  # -log P(accept)
        return -(n_acc * (-rate) + n_rej * np.log(-np.expm1(-rate))).sum()

    opt = minimize(nll, np.r_[np.zeros(7), 1.0], method="BFGS", options={"gtol": 1e-8})
    s = law.summary
    np.testing.assert_allclose(s.loc["k", "estimate"], opt.x[7], atol=2e-4)
    lam = [s.loc[f"lambda[d={d}]", "estimate"] for d in range(1, 8)]
    np.testing.assert_allclose(lam, np.exp(opt.x[:7]), rtol=5e-4)
    # and the truth is inside the 95% intervals
    assert s.loc["k", "ci_low"] < K_TRUE < s.loc["k", "ci_high"]


def test_cluster_robust_se_matches_a_hand_sandwich(law):
    """Sandwich by hand: bread = inverse observed information (finite differences of our own score),
    meat = per-request score outer products, statsmodels' small-sample factor G/(G-1) (N-1)/(N-K)."""
    r = law.result
    x = r.model.exog
    data = r.model.data.frame
    rej, n = data["n_rej"].to_numpy(float), data["n"].to_numpy(float)

    def score_rows(beta):
        eta = x @ beta
        mu = -np.expm1(-np.exp(eta))  # rejection probability under cloglog
        dmu = np.exp(eta - np.exp(eta))
        return x * ((rej - n * mu) * dmu / (mu * (1 - mu)))[:, None]

    beta = r.params.to_numpy()
    info = np.zeros((len(beta), len(beta)))
    for j in range(len(beta)):
        step = np.zeros(len(beta))
        step[j] = 1e-6
        info[:, j] = -(score_rows(beta + step).sum(0) - score_rows(beta - step).sum(0)) / 2e-6
    scores = pd.DataFrame(score_rows(beta)).groupby(data["request_id"].to_numpy()).sum().to_numpy()
    bread = np.linalg.inv(info)
    g, nobs, k = len(scores), len(x), x.shape[1]
    cov = bread @ (scores.T @ scores) @ bread * g / (g - 1) * (nobs - 1) / (nobs - k)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), r.bse.to_numpy(), rtol=1e-5)
    assert np.allclose(scores.sum(0), 0, atol=1e-4)  # at the maximum the total score vanishes


def test_predict_acceptance_is_the_closed_form(law):
    s = law.summary
    h = np.array([0.0, 0.01, 0.3, 2.0])
    for d in (1, 4):
        expected = np.exp(-s.loc[f"lambda[d={d}]", "estimate"] * (h + 1e-3) ** s.loc["k", "estimate"])
        np.testing.assert_allclose(law.predict_acceptance(h, d), expected, rtol=1e-10)
    # depths beyond the fitted ones reuse the deepest (documented)
    np.testing.assert_allclose(law.predict_acceptance(0.5, 12), law.predict_acceptance(0.5, 7))


def test_block_length_and_rounds_against_monte_carlo():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.3, 0.99, size=(60, 5))
    # E[tau] of one block by Monte Carlo
    draws = rng.random((200_000, 5)) < a[0]
    tau = np.where(draws.all(axis=1), 5, np.argmin(draws, axis=1))
    assert abs(tau.mean() - expected_accepted(a[0])) < 4 * tau.std() / np.sqrt(len(tau))
    # rounds of a 60-token request by a plain loop simulation
    n_sim, rounds = 20_000, np.zeros(20_000)
    for s in range(n_sim):
        t = 0
        while t < 60:
            k = 0
            while k < 5 and rng.random() < a[t, k]:
                k += 1
            t += k + 1
            rounds[s] += 1
    assert abs(rounds.mean() - expected_rounds(a)) < 4 * rounds.std() / np.sqrt(n_sim)


def test_iid_formula_and_alpha_eff_round_trip():
    assert iid_tokens_per_round(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert alpha_eff(float(iid_tokens_per_round(0.73, 7)), 7) == pytest.approx(0.73, abs=1e-9)
    # constant acceptance: the DP equals T / iid tokens per round up to end effects
    a = np.full((2000, 7), 0.6)
    assert 2000 / expected_rounds(a) == pytest.approx(float(iid_tokens_per_round(0.6, 7)), rel=2e-3)


def test_dp_prediction_is_unbiased_and_iid_plugin_underestimates(traces, law):
    bp = block_prediction(law, traces)
    s = bp.summary
    assert (s["dp_relative_error"].abs() < 0.03).all(), s["dp_relative_error"]
    pooled = s["dp_tokens_per_round"] @ s["requests"] / (s["observed_tokens_per_round"] @ s["requests"]) - 1
    assert abs(pooled) < 0.02
    # the category-mean acceptance at round starts plugged into the i.i.d. formula underestimates,
    # most on the burstiest low-entropy category
    assert (s["iid_round_start_relative_error"] < -0.05).all()
    assert s["iid_round_start_relative_error"].idxmin() == "math_reasoning"


def test_summary_repr_and_plot(law):
    import matplotlib

    matplotlib.use("Agg")
    s = law.summary
    assert {"estimate", "std_err", "ci_low", "ci_high", "kind"} <= set(s.columns)
    assert "<table" in law._repr_html_() and "law_exp" in law._repr_html_()
    ax = law.plot(depths=(1, 3))
    assert len(ax.lines) == 2


def test_by_drafter_and_isotonic_reference():
    tr = simulate_traces(seed=3, n_requests_per_category=6, categories=["qa", "rag"], tree=TreeSpec(depth=3, nodes=9),
                         tokens_per_request=(50, 80))
    with pytest.raises(ValueError, match="2 drafters.*by='drafter_id'"):
        fit_law(tr, "law_exp")
    laws = fit_law(tr, "law_exp", by="drafter_id")
    assert set(laws.laws) == {"sim-block", "sim-tree"}
    assert laws.summary.index.get_level_values(0).nunique() == 2
    iso = fit_law(tr, "law_iso", by="drafter_id")["sim-block"]
    a = iso.predict_acceptance(np.geomspace(1e-3, 5, 50), 1)
    assert np.all(np.diff(a) <= 1e-12)


def _one_category(traces, category):
    keep = lambda f: f.loc[f["category"] == category] if "category" in f else f
    return SimulatedTraces(tokens=keep(traces.tokens), rounds=traces.rounds, requests=keep(traces.requests),
                           runs=traces.runs)


def test_bad_inputs_get_clear_errors(traces):
    tokens = traces.tokens.copy()
    tokens.loc[tokens["role"] == "correction", "role"] = "bonus"
    no_rejections = SimulatedTraces(tokens=tokens, rounds=traces.rounds, requests=traces.requests, runs=traces.runs)
    with pytest.raises(ValueError, match="no rejection"):
        fit_law(no_rejections)
    single = _one_category(traces, "qa")
    assert fit_law(single, "law_exp").n_requests == 30  # a category-free law is fine
    with pytest.raises(ValueError, match="at least 2 categories"):
        fit_law(single, "law_exp_cat")
    # a category with too few requests
    few = traces.tokens.loc[(traces.tokens["category"] != "qa") | traces.tokens["request_id"].isin(["qa-0000", "qa-0001"])]
    small = SimulatedTraces(tokens=few, rounds=traces.rounds, requests=traces.requests, runs=traces.runs)
    with pytest.raises(ValueError, match=r"\{'qa': 2\}.*drop_small_categories=True"):
        fit_law(small, "law_exp_cat")
    dropped = fit_law(small, "law_exp_cat", drop_small_categories=True)
    assert "qa" not in dropped.categories and dropped.notes
    with pytest.raises(ValueError, match="unknown law family"):
        fit_law(traces, "law_nope")
    with pytest.raises(ValueError, match="category"):
        fit_law(traces, "law_exp_cat").predict_acceptance(0.1, 1)


def test_a_hand_made_count_table_without_the_derived_columns_is_told_what_it_lacks():
    """A table with the counts and H but not log(H + eps) used to fail inside patsy (NameError)."""
    counts = pd.DataFrame(dict(drafter_id="d", category="c", request_id=["r1", "r2", "r2"], depth=1,
                               target_entropy_nats=[0.1, 2.0, 0.5], n_acc=[3, 1, 2], n=[4, 4, 4]))
    counts["n_rej"] = counts["n"] - counts["n_acc"]
    with pytest.raises(ValueError, match=r"law_exp needs the at-risk column\(s\) \['log_entropy'\].*at_risk_table"):
        fit_law(counts, "law_exp", cov_type="nonrobust")
    fitted = fit_law(counts.assign(log_entropy=np.log(counts["target_entropy_nats"] + 1e-3)), "law_exp",
                     cov_type="nonrobust")
    assert np.isfinite(fitted.result.params).all()


def test_categorical_columns_take_patsys_vectorised_path_to_the_same_fit(traces):
    """The law's formulas code ``C(column)`` from a pandas Categorical passed as it is (``fit._categorical``): the
    coefficients, their names and the predictions are those of patsy's own ``C`` on the plain columns, and patsy
    no longer reads those columns one row at a time (the check can fail: a boxed column is read row by row)."""
    from unittest import mock

    import patsy.missing
    import statsmodels.formula.api as smf

    from entropy_law.law import fit as fitmod

    fam = fitmod.get_family("law_exp_cat")
    law = fit_law(traces, fam)
    data = law.result.model.data.frame  # the fitted rows, with depth and category as Categoricals
    assert isinstance(data["depth"].dtype, pd.CategoricalDtype) and isinstance(data["category"].dtype,
                                                                               pd.CategoricalDtype)
    plain = data.assign(depth=data["depth"].astype(int), category=data["category"].astype(str))
    formula = law.result.model.formula
    reference = smf.glm(formula, plain, family=law.result.model.family).fit()  # patsy's C, plain columns
    assert list(reference.params.index) == list(law.result.params.index)
    np.testing.assert_allclose(law.result.params, reference.params, rtol=1e-7, atol=1e-10)
    h = np.linspace(0.05, 4.0, 9)
    got = law.predict_acceptance(h, 3, law.categories[1])
    frame = pd.DataFrame({"log_entropy": np.log(h + law.eps), "depth": 3, "category": law.categories[1]})
    expected = reference.predict(frame)
    expected = 1 - expected if fam.outcome == "rejection" else expected
    np.testing.assert_allclose(got, expected, rtol=1e-7)
    # the Categoricals skip patsy's row-by-row reading, at the fit and at the prediction
    calls = []
    original = patsy.missing.NAAction.is_categorical_NA
    with mock.patch.object(patsy.missing.NAAction, "is_categorical_NA",
                           lambda self, value: calls.append(value) or original(self, value)):
        fit_law(traces, fam)
        law.predict_acceptance(h, 3, law.categories[1])
        assert not calls
        smf.glm(formula, plain, family=law.result.model.family)
        assert len(calls) >= len(plain)  # what it does with a plain column


@pytest.mark.parametrize("family", ["law_exp", "law_logit", "law_exp_obs_ceil_top1", "law_exp_cat", "law_spline"])
def test_predictions_skip_patsy_only_where_the_design_is_patsys_own(traces, family, monkeypatch):
    """``fit.simple_design`` (the intercept, ``C(depth)`` levels and numeric columns) is patsy's design matrix bit
    for bit, values and memory layout, and ``predict_frame`` through it equals patsy's path; an interaction or a
    spline is left to patsy (None)."""
    from statsmodels.formula._manager import FormulaManager

    from entropy_law.law import fit as fitmod

    law = fit_law(traces, family, cov_type="nonrobust")
    model, data = law.result.model, law._frame(law.counts)
    built = fitmod.simple_design(data, model)
    if family in ("law_exp_cat", "law_spline"):
        assert built is None
    else:
        by_patsy = np.asarray(FormulaManager().get_matrices(model.data.model_spec, fitmod.prediction_frame(
            data, model), pandas=True, prediction=True))
        assert built.shape == by_patsy.shape and built.flags.f_contiguous == by_patsy.flags.f_contiguous
        assert np.array_equal(built, by_patsy)
    fast = law.predict_frame(law.counts)
    monkeypatch.setattr(fitmod, "simple_design", lambda data, model: None)
    assert np.array_equal(fast, law.predict_frame(law.counts))
