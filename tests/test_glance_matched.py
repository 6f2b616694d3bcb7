"""GLANCE's law and ours on equal terms (``bench/glance.py matched``, ``entropy_law.glance.matched``)."""

import numpy as np
import pandas as pd
import pytest
from conftest import load_bench
from scipy import special

from entropy_law.analysis import TraceAnalysis
from entropy_law.analysis.simulate import simulate_traces
from entropy_law.glance import glance_rounds, law_round_expectations, matched
from entropy_law.law.atrisk import at_risk_table
from entropy_law.law.fit import fit_law, get_family, prepare_counts
from entropy_law.law.information import InfoSet, check_information


@pytest.fixture(scope="module")
def bench():
    return load_bench("glance")


@pytest.fixture(scope="module")
def arm_view():
    traces = simulate_traces(seed=3, n_requests_per_category=4, categories=["qa", "rag", "translation"],
                             block_size=6, tokens_per_request=(30, 50),
                             block_depths={"probs": (0.0, 0.2, 0.2, 0.2, 0.2, 0.2), "entropy_coupling": 0.5})
    analysis = TraceAnalysis(traces)
    arm = analysis.arms[0]
    return analysis.arm_view(arm), arm


def test_both_sides_get_the_same_depth_source_in_every_set(bench):
    """In each matched set, our law and GLANCE's read the same depth source (a drafted-depth model or the round's
    D), and each side's inputs are allowed by the set: where ours is refused, GLANCE's with the same depth is too."""
    inputs = bench.matched_inputs("law_exp_obs_ceil_top1")
    depth = {"depth_model", "drafted_depth"}
    for info, ours, names in bench.MATCHED_ROWS:
        if isinstance(info, str) or info == InfoSet.AFTER_VERIFYING:
            continue
        for theirs in names:
            if theirs == "GLANCE code, cap 15":  # as GLANCE's code has it: no depth, cap 15
                assert inputs[theirs] & depth == set()
            else:
                assert inputs[ours] & depth == inputs[theirs] & depth != set()
            check_information(info, inputs[ours], what=ours)
            check_information(info, inputs[theirs], what=theirs)
    # given D, both are refused before drafting; the path's entropies are refused before verifying
    for name in ("ours, root + D", "GLANCE README, L = D"):
        with pytest.raises(ValueError, match="before drafting set does not hold"):
            check_information(InfoSet.BEFORE_DRAFTING, inputs[name], what=name)
    with pytest.raises(ValueError, match="entropy_ahead"):
        check_information(InfoSet.BEFORE_VERIFYING, inputs["ours, path + D"], what="ours, path + D")


def test_glance_readme_form_with_l_equal_d_is_bounded_by_d_and_recovers_its_law():
    rng = np.random.default_rng(0)
    h = rng.exponential(1.0, 4000)
    depth = rng.integers(1, 8, h.size)
    reach = matched.observed_reach(depth, 7)
    p = special.expit(1.5 - 0.8 * h)
    accepted = np.minimum(rng.geometric(1.0 - p) - 1, depth)  # a run of acceptances with rate p, cut at D
    b0, b1 = matched.fit_glance_reach(h, accepted, reach)
    assert b0 == pytest.approx(1.5, abs=0.15) and b1 == pytest.approx(0.8, abs=0.1)
    expected = matched.glance_reach_expected(h, 12.0, 0.0, reach)  # p near 1: E[a] approaches D, never above it
    assert np.all(expected <= depth) and np.all(expected > depth - 0.1)
    probs = np.zeros((3, 8))
    probs[:, [2, 5]] = 0.5
    assert np.allclose(matched.model_reach(probs)[0], [1, 1, 0.5, 0.5, 0.5, 0, 0])
    with pytest.raises(ValueError, match="1..7"):
        matched.observed_reach([0, 3], 7)


def test_our_law_over_a_point_mass_depth_model_is_our_law_given_that_depth(arm_view):
    view, arm = arm_view
    rounds = glance_rounds(view).reset_index(drop=True)
    law = fit_law(at_risk_table(view, drafters=[arm]), "law_exp_obs_ceil_top1", cov_type="nonrobust")
    probs = np.zeros((len(rounds), 6))
    probs[np.arange(len(rounds)), rounds["tree_depth"].to_numpy()] = 1.0
    for root in (False, True):
        assert np.allclose(matched.law_expected_over_depths(law, view, rounds, probs, root_only=root),
                           law_round_expectations(law, view, rounds, root_only=root))
    model = matched.round_depth_model(rounds, 5)
    probs = matched.round_depth_probabilities(model, rounds)
    assert probs.shape == (len(rounds), 6) and np.allclose(probs.sum(axis=1), 1.0) and np.all(probs[:, 0] == 0)


def test_the_bootstrap_and_the_jackknife_refit_the_laws(bench, arm_view):
    view, arm = arm_view
    result = bench.matched_arm(view, arm, n_boot=2, seed=1)
    categories = 3
    assert result["fits"] == categories * (1 + 2) + categories * (categories - 1)  # point, 2 replicates, jackknife
    rows = {(e["set"], e["theirs"]): e for e in result["pairs"]}
    assert set(rows) >= {("before_verifying", "GLANCE README, L = D"), ("before_drafting", "GLANCE code, cap 15")}
    for entry in result["pairs"]:
        low, high = entry["mse_change_boot"]
        assert low <= high and np.all(np.isfinite(entry["category_ratio_jackknife"]))
    # the replicates refit: their intervals are not the point estimate repeated
    assert any(e["mse_change_boot"][0] < e["mse_change_boot"][1] for e in result["pairs"])
    goals = bench.goal_check(rows[("before_verifying", "GLANCE README, L = D")])
    assert set(goals) == {"mse_change", "category_ratio", "category_r2"}
    assert bench.goal_check(rows[("as published", "GLANCE code, cap 15")]) is None


def test_weighted_scores_count_a_round_as_often_as_it_is_drawn(bench):
    rounds = pd.DataFrame({"category": ["a", "a", "b", "b"], "accepted": [1.0, 3.0, 0.0, 2.0]})
    predicted = np.array([2.0, 2.0, 1.0, 1.0])
    twice = bench.weighted_scores(rounds, predicted, np.array([2.0, 1.0, 1.0, 1.0]))
    doubled = bench.weighted_scores(pd.concat([rounds.iloc[[0]], rounds]), np.r_[2.0, predicted], np.ones(5))
    assert twice == pytest.approx(doubled)
    assert bench.weighted_scores(rounds, predicted, np.ones(4))["cat_error"] == pytest.approx(0.0)


def test_a_refit_on_weighted_cells_is_the_fit_on_the_literal_request_resample(bench, arm_view):
    """The bootstrap's refits: our law on the per-request cells with counts times each request's draws (and a
    category left out) has the estimates of the law fitted on the at-risk rows of the resample itself."""
    view, arm = arm_view
    family = "law_exp_obs_ceil_top1"
    rows = at_risk_table(view, drafters=[arm]).reset_index(drop=True)
    cells = prepare_counts(rows, get_family(family)).reset_index(drop=True)
    request = pd.Index(rows["request_id"].astype(str).unique())
    row_code = request.get_indexer(rows["request_id"].astype(str))
    cell_code = bench.cell_requests(rows, row_code, cells)
    category = rows.groupby(row_code)["category"].first().astype(str)
    rng = np.random.default_rng(7)
    count = np.zeros(len(request))
    for members in category.groupby(category).groups.values():
        np.add.at(count, rng.choice(np.asarray(members), size=len(members), replace=True), 1.0)
    count[(category == "qa").to_numpy()] = 0  # the held-out category
    assert count.max() > 1  # some request is drawn twice
    literal = fit_law(rows.iloc[np.repeat(np.arange(len(rows)), count[row_code].astype(int))], family,
                      cov_type="nonrobust")
    weighted = fit_law(bench.weighted_cells(cells, count[cell_code]), family, cov_type="nonrobust")
    assert weighted.eps == literal.eps and weighted.categories == literal.categories == ("rag", "translation")
    assert np.allclose(weighted.result.params, literal.result.params, rtol=0, atol=1e-8)
    rounds = glance_rounds(view).reset_index(drop=True)
    assert np.allclose(law_round_expectations(weighted, view, rounds), law_round_expectations(literal, view, rounds),
                       rtol=0, atol=1e-8)
