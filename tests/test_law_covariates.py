"""Decode-time covariate laws (issue #18): lagged / running-mean entropy, position, drafted depth, drafter
entropy, the fitted offset (acceptance ceiling below 1), leave-one-category-out CV, the primary-law rule,
the category share of any law's CV gain and P1 in print_summary."""

import warnings

import numpy as np
import pandas as pd
import pytest

from entropy_law.law import atrisk
from entropy_law.law.compare import (DEPTH_ONLY, Comparison, category_share_of_gain, choose_primary, compare_laws)
from entropy_law.law.fit import FAMILIES, PRIMARY_FAMILY, fit_law, get_family, with_category_terms
from entropy_law.analysis.simulate import simulate_traces
from tests.traces_helpers import assert_recovered, one_drafter, quiet_simulation
from tests.traces_helpers import redrawn as redraw


@pytest.fixture(scope="module")
def sim():
    return quiet_simulation(seed=3, n_requests_per_category=8, tokens_per_request=(60, 90))


@pytest.fixture(scope="module")
def rows(sim):
    return atrisk.at_risk_table(sim)


def test_sequence_covariates_by_hand():
    h = np.array([0.5, 1.0, 0.0, 2.0])
    out = atrisk.sequence_covariates(h, np.array([0, 1, 2, 3, 1]))
    np.testing.assert_allclose(out["lag_entropy_nats"], [0.5, 0.5, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(out["run_mean_entropy_nats"], [0.5, 0.75, 0.5, 0.875, 0.75])
    np.testing.assert_allclose(out["log1p_position"], np.log1p([0, 1, 2, 3, 1]))
    with pytest.raises(ValueError, match="positions"):
        atrisk.sequence_covariates(h, np.array([4]))


def test_at_risk_covariates_match_a_loop_over_tokens(sim, rows):
    """Lagged and running-mean entropy and the drafter entropy of every at-risk row, recomputed by a plain
    loop over each request's token rows."""
    tok = sim.tokens.sort_values(["run_id", "request_id", "position"])
    seq = {key: g["target_entropy_nats"].to_numpy(float) for key, g in tok.groupby(["run_id", "request_id"])}
    draft = {(r.run_id, r.request_id, r.round_index, r.depth): r.draft_entropy_nats for r in tok.itertuples()}
    sample = rows.sample(400, random_state=0)
    for r in sample.itertuples():
        h = seq[(r.run_id, r.request_id)]
        p = int(r.position)
        lag = h[p - 1] if p > 0 else h[0]
        assert r.lag_entropy_nats == pytest.approx(lag)
        assert r.run_mean_entropy_nats == pytest.approx(h[: p + 1].mean())
        assert r.log_lag_entropy == pytest.approx(np.log(lag + atrisk.EPS_NATS))
        expected = draft[(r.run_id, r.request_id, r.round_index, r.depth)]
        assert r.draft_entropy_nats == pytest.approx(float(expected), nan_ok=True)


def test_no_family_uses_the_outcome_leaking_draft_columns(rows):
    # draft_prob / draft_rank are of the COMMITTED token: after a rejection that is the target's correction, so
    # rank 0 <=> accepted. No law may read them, and the at-risk table does not carry them.
    for fam in FAMILIES.values():
        assert "draft_prob" not in fam.terms and "draft_rank" not in fam.terms, fam.name
    assert "draft_prob" not in rows.columns and "draft_rank" not in rows.columns


def test_dp_covariates_equal_the_at_risk_table(sim, rows):
    """The DP's frame (FittedLaw.sequence_frame) gives each (round start, depth) the same decode-time covariates
    as the at-risk table gives the trial at that position."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(rows.loc[rows["drafter_id"] == rows["drafter_id"].iloc[0]], "law_exp_lag", cov_type="nonrobust")
    first = rows.iloc[0]
    tok = sim.tokens.loc[(sim.tokens["run_id"] == first["run_id"]) & (sim.tokens["request_id"] == first["request_id"])]
    h = tok.sort_values("position")["target_entropy_nats"].to_numpy(float)
    frame, _ = law.sequence_frame(h, 3)
    mine = rows.loc[(rows["run_id"] == first["run_id"]) & (rows["request_id"] == first["request_id"])]
    for r in mine.itertuples():
        t = int(r.position) - int(r.depth) + 1  # the round's start
        if r.depth > 3:
            continue
        i = t * 3 + int(r.depth) - 1
        assert frame["lag_entropy_nats"].iloc[i] == pytest.approx(r.lag_entropy_nats)
        assert frame["run_mean_entropy_nats"].iloc[i] == pytest.approx(r.run_mean_entropy_nats)
        assert frame["target_entropy_nats"].iloc[i] == pytest.approx(r.target_entropy_nats)


def test_a_known_lag_effect_is_recovered(rows):
    """Outcomes redrawn from a cloglog law with a known lagged-entropy exponent g = 0.4: law_exp_lag recovers it
    (95% interval), law_exp (no lag term) cannot, and CV prefers law_exp_lag."""
    one = one_drafter(rows)
    rng = np.random.default_rng(0)
    k, g = 0.7, 0.4
    hazard = 0.8 * (one["target_entropy_nats"] + 1e-3) ** k * (one["lag_entropy_nats"] + 1e-3) ** g
    redrawn = redraw(one, hazard, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_lag")
        coef = law.coefficients.loc["log_lag_entropy"]
        assert coef["ci_low"] < g < coef["ci_high"]
        assert abs(law.coefficients.loc["log_entropy", "estimate"] - k) < 0.1
        comp = compare_laws(redrawn, ("law_exp", "law_exp_lag"), n_folds=4)
    assert comp.best == "law_exp_lag"


def test_no_spurious_covariate_effect_on_law_exp_traces(rows):
    """simulate_traces draws from law_exp: the decode-time terms of law_exp_obs are ~0 (within 4 SE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(one_drafter(rows), "law_exp_obs")
    coef = law.coefficients
    for name in ("log_lag_entropy", "log_run_mean_entropy", "log1p_position"):
        assert abs(coef.loc[name, "estimate"]) < 4 * coef.loc[name, "std_err"], name
    assert "log_drafted_depth" not in coef.index  # every round drafted B - 1: the term is left out, with a note
    assert any("log D term is not identified" in n for n in law.notes)


def test_fitted_offset_recovers_a_ceiling_below_one():
    """Traces drawn with a = exp(-lambda (H + 0.3)^k) (acceptance ceiling exp(-lambda 0.3^k) < 1 at H = 0):
    law_exp_ceil picks c = 0.3 from its grid and fits better than law_exp (c = 1e-3)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = simulate_traces(seed=5, n_requests_per_category=8, tokens_per_request=(60, 90), eps=0.3, k=0.8)
        rows = one_drafter(atrisk.at_risk_table(sim))
        law = fit_law(rows, "law_exp_ceil", cov_type="nonrobust")
        plain = fit_law(rows, "law_exp", cov_type="nonrobust")
    assert law.eps == pytest.approx(0.3)
    assert law.predict_acceptance(0.0, 1) < plain.predict_acceptance(0.0, 1)
    assert abs(law.coefficients.loc["log_entropy", "estimate"] - 0.8) < 0.1
    assert law.log_likelihood(law.counts).sum() > plain.log_likelihood(plain.counts).sum()


def test_drafter_entropy_family_refuses_missing_values(rows):
    one = one_drafter(rows).copy()
    one.loc[one.index[:3], "draft_entropy_nats"] = np.nan
    with pytest.raises(ValueError, match="draft_entropy_nats"):
        fit_law(one, "law_exp_draftent")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(one_drafter(rows), "law_exp_draftent", cov_type="nonrobust")
    with pytest.raises(ValueError, match="cannot predict rounds"):
        law.predict_rounds(np.ones(20), 4)


def test_steady_state_predictions_need_only_entropy(rows):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(one_drafter(rows), "law_exp_obs_ceil", cov_type="nonrobust")
    h = np.array([0.01, 0.5, 2.0])
    state = law.steady_state(h)
    assert set(state) == {"lag_entropy_nats", "run_mean_entropy_nats", "position"}  # one drafted depth: no log D
    np.testing.assert_allclose(state["lag_entropy_nats"], h)
    level = np.exp(np.average(law.counts["log_run_mean_entropy"], weights=law.counts["n"])) - atrisk.EPS_NATS
    assert state["run_mean_entropy_nats"] == pytest.approx(level)
    explicit = law.predict_acceptance(h, 1, lag_entropy_nats=h, run_mean_entropy_nats=level, position=state["position"])
    np.testing.assert_allclose(law.predict_acceptance(h, 1), explicit)
    assert np.all(np.diff(law.predict_acceptance(h, 1)) < 0)


def test_leave_one_category_out_cv_equals_a_manual_refit(rows):
    one = one_drafter(rows)
    comp = compare_laws(one, ("law_exp", "law_exp_cat", DEPTH_ONLY), folds="category")
    assert comp.folds == "category" and comp.n_folds == one["category"].nunique()
    assert "law_exp_cat" not in comp.summary.index and any("law_exp_cat not scored" in n for n in comp.notes)
    cat = sorted(one["category"].unique())[1]
    fam = get_family("law_exp")
    from entropy_law.law.fit import prepare_counts
    counts = prepare_counts(one, fam)
    law = fit_law(counts.loc[counts["category"] != cat], fam, cov_type="nonrobust")
    test = counts.loc[counts["category"] == cat]
    manual = -law.log_likelihood(test).sum() / test["n"].sum()
    got = comp.per_category.set_index(["family", "category"]).loc[("law_exp", cat), "cv_log_loss"]
    assert got == pytest.approx(manual, rel=1e-9)


def _fake_comparison(losses: dict, n_params: dict, per_request_noise: float, seed: int) -> Comparison:
    rng = np.random.default_rng(seed)
    requests = [f"r{i}" for i in range(40)]
    rows = []
    for fam, loss in losses.items():
        noise = rng.normal(0, per_request_noise, len(requests))
        for rid, e in zip(requests, noise):
            rows.append(dict(request_id=rid, family=fam, loglik=-(loss + e) * 100, n=100))
    per_request = pd.DataFrame(rows)
    summary = pd.DataFrame({"cv_log_loss": pd.Series(losses), "n_params": pd.Series(n_params)})
    return Comparison(summary=summary, per_category=pd.DataFrame(), per_request=per_request, n_folds=5, seed=0)


def test_primary_rule_prefers_fewer_parameters_within_one_se():
    # b is best by 0.0001 (far below its SE): a tie, so the 8-parameter a wins; c is clearly worse
    comps = {arm: _fake_comparison({"law_exp": 0.5001, "law_exp_obs": 0.5000, "law_logit": 0.6},
                                   {"law_exp": 8, "law_exp_obs": 12, "law_logit": 8}, 0.05, i) for i, arm in enumerate("xy")}
    winner, table = choose_primary(comps, candidates=("law_exp", "law_exp_obs", "law_logit"))
    assert winner == "law_exp" and table.loc["law_exp_obs", "tied"] and not table.loc["law_logit", "tied"]
    # a clear gain (many SE): the larger law wins
    comps = {arm: _fake_comparison({"law_exp": 0.55, "law_exp_obs": 0.50, "law_logit": 0.6},
                                   {"law_exp": 8, "law_exp_obs": 12, "law_logit": 8}, 0.01, i) for i, arm in enumerate("xy")}
    assert choose_primary(comps, candidates=("law_exp", "law_exp_obs", "law_logit"))[0] == "law_exp_obs"


def test_primary_family_is_a_category_free_candidate():
    from entropy_law.analysis import DEFAULT_FAMILY
    from entropy_law.law.compare import COVARIATE_CANDIDATES, PRIMARY_CANDIDATES
    from entropy_law.law.fit import PRIMARY_FALLBACK, primary_family

    assert PRIMARY_FAMILY in PRIMARY_CANDIDATES + COVARIATE_CANDIDATES and not get_family(PRIMARY_FAMILY).uses_category
    # the fallback (traces without the target's top-1 probability) is a law every trace supports
    assert PRIMARY_FALLBACK in PRIMARY_CANDIDATES and not get_family(PRIMARY_FALLBACK).position_columns
    assert DEFAULT_FAMILY == PRIMARY_FAMILY == primary_family()
    tokens = pd.DataFrame({"target_top1_prob": [0.9, 0.5]})
    assert primary_family(tokens) == PRIMARY_FAMILY
    assert primary_family(tokens.assign(target_top1_prob=[0.9, None])) == PRIMARY_FALLBACK  # one token without it
    assert primary_family(tokens.drop(columns="target_top1_prob")) == PRIMARY_FALLBACK


def test_category_share_small_without_and_large_with_category_effects():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        null = simulate_traces(seed=11, n_requests_per_category=12, tokens_per_request=(60, 90))
        effect = simulate_traces(seed=11, n_requests_per_category=12, tokens_per_request=(60, 90),
                                 category_effects={"math_reasoning": 1.0, "translation": -0.8})
        share_null = category_share_of_gain(one_drafter(atrisk.at_risk_table(null)), "law_exp_lag")
        share_effect = category_share_of_gain(one_drafter(atrisk.at_risk_table(effect)), "law_exp_lag")
    assert share_null["cv_category_share"] < 0.02
    assert share_effect["cv_category_share"] > 0.05
    assert with_category_terms("law_exp_lag").terms.startswith("C(category)")


def test_print_summary_shows_p1(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = simulate_traces(seed=2, n_requests_per_category=10, tokens_per_request=(60, 90),
                              category_effects={"math_reasoning": 1.5, "qa": -1.0})
        law = fit_law(one_drafter(atrisk.at_risk_table(sim)), "law_exp_pos")
        law.print_summary()
    out = capsys.readouterr().out
    assert "P1 (one law across 5 categories" in out and "(rejected at 5%)" in out
    p1 = law.universality()
    assert p1["df"] == 8 and p1["p_value"] < 0.01


def test_own_p1_equals_the_hypotheses_score_test(rows):
    """FittedLaw.universality and hypotheses.universality_test (two routes to P1 for law_exp: the fitted law's own
    fits and the hypotheses layer's) agree, and their statistic (``fit.cluster_score_test``) equals the efficient
    score test written out here: u_g = s_g2 - I21 I11^-1 s_g1 per request, LM = (sum u)' (G/(G-1) sum u u')^-1 sum u."""
    from scipy import stats

    from entropy_law.law.fit import cluster_score_test
    from entropy_law.law.hypotheses import universality_test

    one = one_drafter(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = fit_law(one, "law_exp").universality()
        theirs = universality_test(one).summary["value"]
        restricted, full = fit_law(one, "law_exp"), fit_law(one, "law_exp_cat")
    assert mine["score_statistic"] == pytest.approx(theirs["score_statistic"], rel=1e-6)
    assert mine["p_value"] == pytest.approx(theirs["p_value"], rel=1e-6)
    assert mine["wald_statistic"] == pytest.approx(theirs["wald_statistic"], rel=1e-6)
    model = full.result.model
    names = list(model.exog_names)
    terms = [n for n in names if n not in restricted.result.params.index]
    theta = np.array([restricted.result.params.get(n, 0.0) for n in names])
    extra = np.array([n in terms for n in names])
    per_group = pd.DataFrame(model.score_obs(theta)).groupby(model.data.frame["request_id"].to_numpy()).sum()
    per_group = per_group.to_numpy()
    info = -model.hessian(theta)
    u = per_group[:, extra] - per_group[:, ~extra] @ (info[np.ix_(extra, ~extra)]
                                                      @ np.linalg.inv(info[np.ix_(~extra, ~extra)])).T
    g, total = len(u), u.sum(axis=0)
    lm = float(total @ np.linalg.solve(u.T @ u * g / (g - 1), total))
    got_lm, got_p = cluster_score_test(restricted.result, full.result, terms)
    assert terms and got_lm == pytest.approx(lm, rel=1e-9)
    assert got_p == pytest.approx(float(stats.chi2.sf(lm, len(terms))), rel=1e-9)


def test_drafter_top1_probability_is_carried_and_a_known_effect_recovered(sim):
    """``draft_top1_prob`` (the drafter's probability of its own top proposal, known before verification) goes from
    the tokens table to each at-risk trial, with log(1 - p + 1e-3); outcomes redrawn with a known exponent m on
    that miss probability: law_exp_drafttop recovers m (95% interval), CV prefers it to law_exp, and like every
    family on the drafter's own statistics it refuses missing values and cannot run the DP."""
    tokens = sim.tokens.copy()
    rng = np.random.default_rng(1)
    drafted = tokens["draft_rank"].notna()
    tokens["draft_top1_prob"] = pd.array(np.where(drafted, rng.uniform(0.05, 0.999, len(tokens)), np.nan),
                                         dtype="Float32")
    with_top1 = type(sim)(tokens=tokens, rounds=sim.rounds, requests=sim.requests, runs=sim.runs)
    table = one_drafter(atrisk.at_risk_table(with_top1))
    look = tokens.set_index(["request_id", "round_index", "depth"])["draft_top1_prob"].astype(float)
    expected = look.loc[list(zip(table["request_id"], table["round_index"], table["depth"]))].to_numpy()
    np.testing.assert_allclose(table["draft_top1_prob"], expected)
    np.testing.assert_allclose(table["log_draft_miss"], np.log(1 - expected + 1e-3))

    k, m = 0.7, 0.5
    hazard = 0.8 * (table["target_entropy_nats"] + 1e-3) ** k * np.exp(m * table["log_draft_miss"])
    redrawn = redraw(table, hazard, rng)
    law = assert_recovered(redrawn, "law_exp", "law_exp_drafttop", "log_draft_miss", m)
    with pytest.raises(ValueError, match="cannot predict rounds"):
        law.predict_rounds(np.ones(20), 4)
    assert get_family("law_exp_obs_ceil_drafttop").draft_stats == ("draft_top1_prob",)

    missing = redrawn.copy()
    missing.loc[missing.index[:3], "draft_top1_prob"] = np.nan
    with pytest.raises(ValueError, match="draft_top1_prob"):
        fit_law(missing, "law_exp_obs_ceil_drafttop")
    older = atrisk.at_risk_table(sim)  # traces without the column (recorded before it existed): read as null
    assert older["draft_top1_prob"].isna().all()
    with pytest.raises(ValueError, match="draft_top1_prob"):
        fit_law(one_drafter(older), "law_exp_drafttop")
