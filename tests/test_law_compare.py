"""Model comparison: grouped folds, the wrong link detected by held-out log-loss, calibration."""

import numpy as np
import pytest

from entropy_law.law import atrisk
from entropy_law.law.compare import calibration, compare_laws, request_folds
from entropy_law.analysis.simulate import TreeSpec, simulate_traces


@pytest.fixture(scope="module")
def comparison():
    tr = simulate_traces(seed=31, n_requests_per_category=16, categories=["qa", "math_reasoning", "translation"],
                         k=0.6, lambda_d=1.3, block_size=6, tokens_per_request=(80, 120))
    return compare_laws(tr, ("law0_cat", "law_logit", "law_exp", "law_spline"), n_folds=4, seed=1)


def test_folds_group_requests_and_are_balanced():
    ids = [f"r{i}" for i in range(23)] * 3
    folds = request_folds(ids, 5, seed=0)
    assert len(folds) == 23 and set(folds.values()) == set(range(5))
    sizes = np.bincount(list(folds.values()))
    assert sizes.max() - sizes.min() <= 1
    assert request_folds(ids, 5, seed=0) == folds and request_folds(ids, 5, seed=1) != folds
    with pytest.raises(ValueError, match="lower n_folds"):
        request_folds(["a", "b"], 5, seed=0)


def test_wrong_link_is_detected_by_cv_log_loss(comparison):
    s = comparison.summary
    assert comparison.best in ("law_exp", "law_spline")
    diff, se = comparison.paired_difference("law_logit", "law_exp")
    assert diff > 4 * se > 0  # logistic-linear in H is clearly worse than the true cloglog law
    assert s.loc["law_exp", "cv_log_loss"] < s.loc["law0_cat", "cv_log_loss"]
    # the true law is calibrated on held-out folds
    assert abs(s.loc["law_exp", "calibration_slope"] - 1) < 0.1
    assert abs(s.loc["law_exp", "calibration_intercept"]) < 0.1
    assert s.loc["law_exp", "bic"] < s.loc["law_logit", "bic"]


def test_cv_log_loss_is_the_per_trial_mean_of_per_request_sums(comparison):
    per = comparison.per_request
    for fam in comparison.summary.index:
        part = per.loc[per["family"] == fam]
        assert -part["loglik"].sum() / part["n"].sum() == pytest.approx(comparison.summary.loc[fam, "cv_log_loss"])


def test_calibration_of_perfect_predictions():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 20000)
    y = rng.random(20000) < p
    intercept, slope = calibration(y.astype(float), 1 - y.astype(float), p)
    assert abs(intercept) < 0.08 and abs(slope - 1) < 0.08
    _, slope_over = calibration(y.astype(float), 1 - y.astype(float), 1 / (1 + np.exp(-3 * np.log(p / (1 - p)))))
    assert slope_over < 0.5  # over-confident predictions get a slope well below 1


def test_compare_refuses_pooled_drafters():
    tr = simulate_traces(seed=2, n_requests_per_category=5, categories=["qa", "rag"], tree=TreeSpec(depth=3, nodes=6),
                         tokens_per_request=(40, 50))
    with pytest.raises(ValueError, match="one drafter at a time"):
        compare_laws(tr, ("law_exp",))
    rows = atrisk.at_risk_table(tr, drafters=["sim-tree"])
    assert compare_laws(rows, ("law_exp",), n_folds=2).summary.shape[0] == 1


def test_a_fit_that_does_not_converge_is_reported_not_scored():
    """Acceptance near 1 at low entropy (as for the n-gram drafter) makes the log-binomial law_exp0 diverge:
    the comparison leaves it out with a note instead of scoring its garbage estimates."""
    import warnings

    from entropy_law.law.fit import fit_law, get_family, prepare_counts

    tr = simulate_traces(seed=31, n_requests_per_category=16, categories=["qa", "math_reasoning", "translation"],
                         k=1.0, lambda_d=0.4, block_size=6, tokens_per_request=(80, 120))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fam = get_family("law_exp0")
        direct = fit_law(prepare_counts(atrisk.at_risk_table(tr), fam), fam).result  # the same fit, by hand
        comp = compare_laws(tr, ("law_exp", "law_exp0"), n_folds=4, seed=1)
        assert not (direct.converged and np.isfinite(direct.bse).all())
        assert list(comp.summary.index) == ["law_exp"]
        assert any(n.startswith("law_exp0 not scored:") for n in comp.notes)
        assert comp.best == "law_exp" and np.isfinite(comp.summary.loc["law_exp", "cv_log_loss"])
        with pytest.raises(ValueError, match="no family could be scored"):
            compare_laws(tr, ("law_exp0",), n_folds=4, seed=1)


def test_law_exp0_is_scored_where_it_converges():
    tr = simulate_traces(seed=31, n_requests_per_category=16, categories=["qa", "math_reasoning", "translation"],
                         k=0.6, lambda_d=1.3, block_size=6, tokens_per_request=(80, 120))
    comp = compare_laws(tr, ("law_exp", "law_exp0"), n_folds=4, seed=1)
    assert list(comp.summary.index) == ["law_exp", "law_exp0"]
    assert not any("not scored" in n for n in comp.notes)
