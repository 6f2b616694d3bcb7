"""Pre-registered tests: universality, category ranking (LOCO), drafter x entropy, Holm."""

import math

import numpy as np
import pytest
from scipy import stats

from entropy_law.law.hypotheses import drafter_entropy_test, preregistered_tests, universality_test
from entropy_law.analysis.simulate import TreeSpec, simulate_traces
from entropy_law.law.stats import exact_spearman_p
from entropy_law.law.transfer import loco_transfer

CATS = ["qa", "math_reasoning", "rag", "translation"]


def test_exact_spearman_p_counts_orderings():
    rho, p = exact_spearman_p([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert rho == pytest.approx(1.0) and p == pytest.approx(1 / math.factorial(5))
    # against brute force on a non-trivial pair
    x, y = [3.1, 1.2, 2.2, 5.0, 4.4], [2.0, 1.5, 3.0, 4.0, 3.9]
    rho, p = exact_spearman_p(x, y)
    assert rho == pytest.approx(stats.spearmanr(x, y).statistic)
    import itertools

    count = sum(stats.spearmanr(x, perm).statistic >= rho - 1e-12 for perm in itertools.permutations(y))
    assert p == pytest.approx(count / 120)


def test_universality_detects_a_category_effect_and_not_its_absence():
    kwargs = dict(n_requests_per_category=20, categories=CATS, k=0.8, block_size=6, tokens_per_request=(60, 90))
    with_effect = universality_test(simulate_traces(seed=41, category_effects={"rag": 0.35}, **kwargs))
    without = universality_test(simulate_traces(seed=41, **kwargs))
    assert with_effect.p_value < 0.001
    assert without.p_value > 0.05
    assert with_effect.summary.loc["df", "value"] == 2 * (len(CATS) - 1)


def test_universality_refuses_one_category_and_small_categories():
    tr = simulate_traces(seed=1, n_requests_per_category=6, categories=["qa"], tokens_per_request=(40, 50))
    with pytest.raises(ValueError, match="at least 2 categories"):
        universality_test(tr)
    tr = simulate_traces(seed=1, n_requests_per_category=3, categories=["qa", "rag"], tokens_per_request=(40, 50))
    with pytest.raises(ValueError, match="fewer than 5 requests"):
        universality_test(tr)


def test_loco_transfer_and_preregistered_tests():
    tr = simulate_traces(seed=43, n_requests_per_category=14, categories=CATS, k=0.8, block_size=6,
                         tokens_per_request=(60, 90), tree=TreeSpec(depth=4, nodes=12, k=0.55, lambda_scale=0.7))
    loco = loco_transfer(tr, drafter="sim-block")
    s = loco.summary
    assert (s["relative_error"].abs() < 0.05).all(), s["relative_error"]
    assert (s["transfer_ratio"] > 0.9).all()
    pre = preregistered_tests(tr, drafter="sim-block")
    p = pre.summary["p_value"].to_numpy()
    # Holm by hand
    order = np.argsort(p)
    adj = np.maximum.accumulate([(len(p) - i) * p[j] for i, j in enumerate(order)]).clip(max=1)
    np.testing.assert_allclose(pre.summary["p_holm"].to_numpy()[order], adj)
    assert pre.summary.loc["P3", "p_value"] < 1e-4  # the tree drafter has a different exponent
    d = drafter_entropy_test(tr).summary["value"]
    assert d["slope_difference[sim-tree - sim-block]"] < 0
    with pytest.raises(ValueError, match="pass drafter="):
        loco_transfer(tr)


def test_mundlak_p_and_crossover_interval_use_t_with_requests_minus_1_df():
    """The P2 Mundlak p and the P3 crossover interval follow the fitted law's t(G - 1) rule, as every other
    cluster-robust interval and p-value does (G = requests; 15 here, so t(14), not the normal)."""
    from entropy_law.law.hypotheses import category_ranking_test
    from entropy_law.law.stats import SmallSampleWarning

    tr = simulate_traces(seed=44, n_requests_per_category=5, categories=CATS[:3], k=0.8, block_size=6,
                         tokens_per_request=(50, 70), tree=TreeSpec(depth=4, nodes=12, k=0.55, lambda_scale=0.7))
    with pytest.warns(SmallSampleWarning, match="15 requests"):
        p2 = category_ranking_test(tr, drafter="sim-block")
        p3 = drafter_entropy_test(tr)
    s = p2.summary["value"]
    mundlak = p2.details["mundlak"]
    assert mundlak.n_requests == 15 and mundlak.df_inference == 14
    z = s["b_within_minus_between"] / s["se_difference"]
    assert s["p_mundlak"] == pytest.approx(2 * stats.t.sf(abs(z), 14), rel=1e-9)
    assert s["p_mundlak"] > 2 * stats.norm.sf(abs(z))  # wider than the normal's
    law, eps = p3.details["law"], 1e-3
    a, b = "C(drafter_id)[T.sim-tree]", "C(drafter_id)[T.sim-tree]:log_entropy"
    da, db = law.result.params[a], law.result.params[b]
    cov = law.result.cov_params().loc[[a, b], [a, b]].to_numpy()
    grad = np.array([-1 / db, da / db**2])
    se_x, x = float(np.sqrt(grad @ cov @ grad)), -da / db
    q = stats.t.ppf(0.975, law.n_requests - 1)
    assert law.critical_value == pytest.approx(q)
    d = p3.summary["value"]
    assert d["crossover_H_ci_low[sim-tree vs sim-block]"] == pytest.approx(np.exp(x - q * se_x) - eps, rel=1e-9)
    assert d["crossover_H_ci_high[sim-tree vs sim-block]"] == pytest.approx(np.exp(x + q * se_x) - eps, rel=1e-9)
