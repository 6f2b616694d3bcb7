"""Drafted depth per round: the depth-aware DP, the depth model, the at-risk layout of short or
missing drafts, the variable-depth simulator, and LOCO accuracy across categories."""

import numpy as np
import pandas as pd
import pytest

from entropy_law.law import atrisk
from entropy_law.law.blocks import expected_round_counts, expected_rounds, tau_distribution
from entropy_law.law.fit import fit_law
from entropy_law.analysis.simulate import DepthSpec, SimulatedTraces, simulate_traces
from entropy_law.law.stats import exact_spearman_p
from entropy_law.law.transfer import (block_prediction, depth_distribution, depth_probabilities, drafted_depths,
                                      entropy_bin, loco_transfer)
from entropy_law.analysis.sample_traces import has_runs, reference_traces_dir

LAMBDA = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]


def _sim(seed, coupling=0.0, **kwargs):
    options = dict(n_requests_per_category=20, k=0.8, lambda_d=LAMBDA, block_size=8, tokens_per_request=(80, 140),
                   block_depths=DepthSpec(entropy_coupling=coupling))
    options.update(kwargs)
    return simulate_traces(seed=seed, **options)


@pytest.fixture(scope="module")
def variable():
    """Variable drafted depths that do not depend on the context (25% of rounds draft nothing)."""
    return _sim(31)


@pytest.fixture(scope="module")
def coupled():
    """Long drafts where the entropy at the round start is low (as an n-gram drafter's matches)."""
    return _sim(32, coupling=1.0)


@pytest.fixture(scope="module")
def variable_law(variable):
    """``fit_law(variable, "law_exp")``, fitted once for the tests that read it."""
    return fit_law(variable, "law_exp")


@pytest.fixture(scope="module")
def coupled_law(coupled):
    return fit_law(coupled, "law_exp")


# ------------------------------------------------------------------ the DP with a drafted depth


def test_tau_distribution_mixes_capped_blocks():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.2, 0.95, size=(5, 4))
    pi = rng.dirichlet(np.ones(5), size=5)  # D = 0..4 per position
    mixed = tau_distribution(a, pi)
    # brute force: for each D, P(tau = k | D) of a block of D drafts, mixed by pi
    brute = np.zeros((5, 5))
    for t in range(5):
        for D in range(5):
            reach = np.concatenate([[1.0], np.cumprod(a[t, :D])])
            p = np.append(reach[:-1] - reach[1:], reach[-1]) if D else np.array([1.0])
            brute[t, : D + 1] += pi[t, D] * p
    np.testing.assert_allclose(mixed, brute, atol=1e-12)
    np.testing.assert_allclose(mixed.sum(axis=1), 1.0)
    # a point mass at D_max is the full-depth DP
    full = np.zeros((5, 5))
    full[:, 4] = 1.0
    np.testing.assert_allclose(tau_distribution(a, full), tau_distribution(a))
    assert expected_rounds(a, full) == pytest.approx(expected_rounds(a))
    # no draft anywhere: one token per round
    none = np.zeros((5, 5))
    none[:, 0] = 1.0
    assert expected_round_counts(a, none) == pytest.approx((5.0, 0.0))
    with pytest.raises(ValueError, match="shape"):
        tau_distribution(a, pi[:, :3])
    with pytest.raises(ValueError, match="probability"):
        tau_distribution(a, pi * 2)


def test_depth_aware_rounds_against_monte_carlo():
    """Rounds and drafting rounds of a 50-token request, D drawn per round start from position-dependent
    probabilities, by a plain loop simulation."""
    rng = np.random.default_rng(1)
    length, drafts = 50, 4
    a = rng.uniform(0.3, 0.99, size=(length, drafts))
    pi = rng.dirichlet(np.ones(drafts + 1) * 0.7, size=length)
    expected, expected_drafting = expected_round_counts(a, pi)
    n_sim = 20_000  # simulated side by side: per round D by the inverse CDF, then accepted depths until a miss
    rounds, drafting = np.zeros(n_sim), np.zeros(n_sim)
    cdf = np.cumsum(pi, axis=1)
    t = np.zeros(n_sim, dtype=int)
    while (live := np.flatnonzero(t < length)).size:
        at = t[live]
        D = (cdf[at] <= rng.random(live.size)[:, None] * cdf[at, -1:]).sum(axis=1)  # searchsorted(side="right")
        k = np.cumprod((rng.random((live.size, drafts)) < a[at]) & (np.arange(drafts) < D[:, None]), axis=1).sum(1)
        t[live] += k + 1
        rounds[live] += 1
        drafting[live] += D > 0
    assert abs(rounds.mean() - expected) < 4 * rounds.std() / np.sqrt(n_sim)
    assert abs(drafting.mean() - expected_drafting) < 4 * drafting.std() / np.sqrt(n_sim)


def test_predict_rounds_takes_a_depth_distribution(variable, variable_law):
    law = variable_law
    h = variable.entropy[variable.requests["request_id"].iloc[0]]
    full = law.predict_rounds(h, 8)
    point = np.zeros(8)
    point[7] = 1.0
    assert law.predict_rounds(h, 8, depth_probs=point) == pytest.approx(full)
    none = np.zeros(8)
    none[0] = 1.0
    assert law.predict_rounds(h, 8, depth_probs=none) == pytest.approx(len(h))
    half = np.full(8, 1 / 8)
    assert full < law.predict_rounds(h, 8, depth_probs=half) < len(h)


# ------------------------------------------------------------------ depth model


def test_depth_probabilities_observed_category_full():
    dist = np.array([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]])  # two entropy bins, D = 0..2
    observed = pd.DataFrame({"start_position": [0, 2, 9], "drafted_depth": [0, 1, 2]})
    h = np.array([0.5, 0.001, 0.5, 0.001, 0.5])
    edges = (0.01,)
    p = depth_probabilities(5, 2, "observed", observed=observed, distribution=dist, entropy=h, edges=edges)
    np.testing.assert_allclose(p[0], [1, 0, 0])
    np.testing.assert_allclose(p[2], [0, 1, 0])
    np.testing.assert_allclose(p[1], dist[0])  # H below 0.01: bin 0
    np.testing.assert_allclose(p[3], dist[0])
    np.testing.assert_allclose(p[4], dist[1])
    c = depth_probabilities(5, 2, "category", observed=observed, distribution=dist, entropy=h, edges=edges)
    np.testing.assert_allclose(c[0], [1, 0, 0])  # the first round is always observed
    np.testing.assert_allclose(c[2], dist[1])
    assert depth_probabilities(5, 2, "full") is None
    with pytest.raises(ValueError, match="depths must be one of"):
        depth_probabilities(5, 2, "mean")
    np.testing.assert_array_equal(entropy_bin([0.0, 0.01, 0.05, 5.0]), [0, 1, 1, 5])


def test_depth_distribution_shrinks_bins_to_the_category():
    rounds = pd.DataFrame({"start_position": [0, 1, 2, 3, 4, 5],
                           "drafted_depth": [2, 0, 0, 2, 2, 1],
                           "start_entropy": [0.001, 2.0, 2.0, 0.001, 0.001, 0.5]})
    pooled = np.array([2, 1, 2]) / 5  # position 0 is left out
    np.testing.assert_allclose(depth_distribution(rounds, 2, edges=()), pooled[None, :])
    dist = depth_distribution(rounds, 2, edges=(0.01, 1.0), prior_rounds=1.0)
    np.testing.assert_allclose(dist[0], (np.array([0, 0, 2]) + pooled) / 3)
    np.testing.assert_allclose(dist[2], (np.array([2, 0, 0]) + pooled) / 3)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="exceeds"):
        depth_distribution(rounds, 1, edges=())


def test_drafted_depth_of_a_tree_path_that_ends_at_a_shallow_leaf():
    """Round 1: tree depth 3, path ended at a leaf after 1 accepted draft (bonus at depth 2): the
    path drafted 1 token. Round 2: tree depth 3, rejected at depth 2: the tree's depth (upper bound)."""
    tokens = pd.DataFrame({
        "run_id": "r", "request_id": "q", "category": "c",
        "round_index": [0, 1, 1, 2, 2], "position": [0, 1, 2, 3, 4], "depth": [1, 1, 2, 1, 2],
        "role": ["bonus", "accepted", "bonus", "accepted", "correction"]})
    rounds = pd.DataFrame({"run_id": "r", "request_id": "q", "round_index": [0, 1, 2], "start_position": [0, 1, 3],
                           "tree_depth": [0, 3, 3], "accepted": [0, 1, 1], "committed": [1, 2, 2]})
    runs = pd.DataFrame({"run_id": ["r"], "drafter_id": ["d"], "tree_policy": ["ddtree"]})
    tr = SimulatedTraces(tokens=tokens, rounds=rounds, requests=pd.DataFrame(), runs=runs)
    np.testing.assert_array_equal(drafted_depths(tr, "d")["drafted_depth"], [0, 1, 3])


# ------------------------------------------------------------------ at-risk layout with short / no drafts


def _check_at_risk_layout(traces, *, chains_only=True):
    rows = atrisk.at_risk_table(traces)
    r = traces.rounds.set_index(["run_id", "request_id", "round_index"])
    per_round = rows.groupby(["run_id", "request_id", "round_index"], observed=True)["depth"].agg(["size", "max"])
    joined = r.join(per_round, how="left").fillna({"size": 0, "max": 0})
    # trials stop at the round's drafted depth: depths 1..min(tau + 1, D), cut where the request stopped
    expected = np.minimum(np.minimum(joined["accepted"] + 1, joined["tree_depth"]), joined["committed"])
    if chains_only:
        assert (joined["size"] == expected).all()
    else:  # a tree path can end at a leaf shallower than the tree: fewer trials, never more
        assert (joined["size"] <= expected).all()
    assert (joined["max"] <= joined["tree_depth"]).all()
    assert (joined.loc[joined["tree_depth"] == 0, "size"] == 0).all()
    return joined


def test_at_risk_trials_stop_at_the_drafted_depth(variable):
    joined = _check_at_risk_layout(variable)
    # the simulated drafter really drafts short and no drafts
    assert (joined["tree_depth"] == 0).mean() > 0.1
    assert set(range(8)) <= set(joined["tree_depth"].unique())


def test_at_risk_layout_on_the_reference_traces():
    ref = reference_traces_dir()
    if not has_runs(ref):
        pytest.skip("no reference traces in data/traces")
    from entropy_law import load_traces

    tr = load_traces(ref)
    policy = tr.runs.set_index("run_id")["tree_policy"].astype(str)
    for run_id in tr.runs["run_id"]:
        one = tr.filter(run_id=run_id)
        if one.rounds["tree_depth"].max() == 0:
            continue
        _check_at_risk_layout(one, chains_only=policy[run_id] == "chain")


# ------------------------------------------------------------------ simulator


def test_depth_spec_draws_the_given_distribution():
    spec = DepthSpec(probs=(0.5, 0.0, 0.3, 0.2))
    d = spec.sample(np.zeros(40_000), np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(d, minlength=4) / d.size, [0.5, 0.0, 0.3, 0.2], atol=0.01)
    tilted = DepthSpec(probs=(0.5, 0.0, 0.3, 0.2), entropy_coupling=1.0).sample(np.full(40_000, 2.0),
                                                                               np.random.default_rng(0))
    assert tilted.mean() < d.mean()
    with pytest.raises(ValueError, match="8 weights"):
        simulate_traces(seed=0, n_requests_per_category=2, block_size=8, block_depths=DepthSpec(probs=(1.0, 0.0)))


def test_simulated_no_draft_rounds_commit_one_bonus_token(variable):
    r = variable.rounds
    none = r.loc[r["tree_depth"] == 0]
    assert (none["accepted"] == 0).all() and (none["committed"] == 1).all() and (none["tree_nodes"] == 0).all()
    tok = variable.tokens.merge(none[["run_id", "request_id", "round_index"]])
    assert (tok["role"] == "bonus").all()
    assert (r["accepted"] <= r["tree_depth"]).all()


# ------------------------------------------------------------------ unbiased with the drafted depth


@pytest.mark.parametrize("which", ["variable", "coupled"])
def test_depth_aware_dp_is_unbiased_and_full_depth_dp_is_not(which, request):
    tr = request.getfixturevalue(which)
    law = request.getfixturevalue(f"{which}_law")  # fit_law(tr, "law_exp")
    bp = block_prediction(law, tr)  # default: observed depths
    s = bp.summary
    w = s["requests"]
    pooled = (s["dp_tokens_per_round"] @ w) / (s["observed_tokens_per_round"] @ w) - 1
    full = (s["dp_full_depth_tokens_per_round"] @ w) / (s["observed_tokens_per_round"] @ w) - 1
    assert abs(pooled) < 0.02, pooled
    assert (s["dp_relative_error"].abs() < 0.05).all(), s["dp_relative_error"]
    assert full > 0.2, full  # a full block every round overpredicts a drafter that drafts short or nothing
    # mean accepted length per drafting round: (committed - rounds) / drafting rounds, by hand per category
    r = tr.rounds.merge(tr.requests[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
    r = r.loc[r["run_id"] == "sim-block"]
    g = r.groupby("category")
    by_hand = (g["committed"].sum() - g.size()) / g["tree_depth"].apply(lambda d: (d > 0).sum())
    np.testing.assert_allclose(s["observed_mean_accepted"], by_hand.loc[s.index])
    assert (s["dp_mean_accepted_relative_error"].abs() < 0.08).all(), s["dp_mean_accepted_relative_error"]


def test_category_depth_model_is_unbiased_when_depths_ignore_the_context(variable, variable_law):
    law = variable_law
    s = block_prediction(law, variable, depths="category", depth_edges=()).summary
    w = s["requests"]
    assert abs((s["dp_tokens_per_round"] @ w) / (s["observed_tokens_per_round"] @ w) - 1) < 0.02
    full = block_prediction(law, variable, depths="full").summary
    np.testing.assert_allclose(full["dp_tokens_per_round"], s["dp_full_depth_tokens_per_round"])


# ------------------------------------------------------------------ LOCO accuracy across categories


def test_loco_accuracy_reports_relative_errors_and_spearman(variable):
    loco = loco_transfer(variable, drafter="sim-block")
    s, acc = loco.summary, loco.accuracy
    assert loco.depths == "training"  # the leak-free default (issue #18)
    assert {"tokens_per_round", "mean_accepted", "tokens_per_round_full_depth", "tokens_per_round_depth_only",
            "mean_accepted_depth_only"} == set(acc.index)
    rel = s["predicted_mean_accepted"] / s["observed_mean_accepted"] - 1
    np.testing.assert_allclose(s["mean_accepted_relative_error"], rel)
    assert acc.loc["mean_accepted", "mean_abs_relative_error"] == pytest.approx(rel.abs().mean())
    assert acc.loc["mean_accepted", "max_abs_relative_error"] == pytest.approx(rel.abs().max())
    rho, p = exact_spearman_p(s["predicted_mean_accepted"], s["observed_mean_accepted"])
    assert acc.loc["mean_accepted", "spearman_rho"] == pytest.approx(rho)
    assert acc.loc["mean_accepted", "p_permutation"] == pytest.approx(p)
    # no category effect in the simulation: LOCO transfers within a few percent, the full-depth DP does not
    assert acc.loc["tokens_per_round", "max_abs_relative_error"] < 0.05
    assert acc.loc["tokens_per_round_full_depth", "mean_relative_error"] > 0.2
    assert "accuracy across categories" in loco._text()


# ------------------------------------------------------------------ a law in the drafted depth (law_exp_drafted)


def test_tau_distribution_with_acceptance_that_depends_on_the_drafted_depth():
    rng = np.random.default_rng(2)
    length, drafts = 6, 4
    a3 = rng.uniform(0.2, 0.95, size=(drafts, length, drafts))
    pi = rng.dirichlet(np.ones(drafts + 1), size=length)
    brute = np.zeros((length, drafts + 1))
    for t in range(length):
        brute[t, 0] += pi[t, 0]
        for D in range(1, drafts + 1):
            reach = np.concatenate([[1.0], np.cumprod(a3[D - 1, t, :D])])
            brute[t, : D + 1] += pi[t, D] * np.append(reach[:-1] - reach[1:], reach[-1])
    np.testing.assert_allclose(tau_distribution(a3, pi), brute, atol=1e-12)
    # the same acceptance for every D: the 2-D formula
    same = np.broadcast_to(a3[0], a3.shape)
    np.testing.assert_allclose(tau_distribution(same, pi), tau_distribution(a3[0], pi), atol=1e-12)
    # no depth model: every round drafts D_max, with D_max's acceptance
    np.testing.assert_allclose(tau_distribution(a3), tau_distribution(a3[-1]))


@pytest.fixture(scope="module")
def confident():
    """Long drafts are accepted more: rejection rate x D^-0.5 (as the n-gram drafter's long matches)."""
    return _sim(33, coupling=1.0, block_depths=DepthSpec(entropy_coupling=1.0, rate_exponent=-0.5))


def test_at_risk_table_carries_the_drafted_depth(confident):
    rows = atrisk.at_risk_table(confident)
    merged = rows.merge(confident.rounds[["run_id", "request_id", "round_index", "tree_depth"]],
                        on=["run_id", "request_id", "round_index"])
    np.testing.assert_array_equal(merged["drafted_depth"], merged["tree_depth"])
    np.testing.assert_allclose(rows["log_drafted_depth"], np.log(rows["drafted_depth"]))
    with pytest.raises(ValueError, match="drafted_depth"):
        fit_law(rows.drop(columns=["drafted_depth", "log_drafted_depth"]), "law_exp_drafted")


def test_law_exp_drafted_recovers_gamma_and_its_dp_is_unbiased(confident):
    law = fit_law(confident, "law_exp_drafted")
    s = law.summary
    assert s.loc["log_drafted_depth", "ci_low"] < -0.5 < s.loc["log_drafted_depth", "ci_high"]
    assert s.loc["k", "ci_low"] < 0.8 < s.loc["k", "ci_high"]
    # acceptance at depth 1 rises with D at fixed H, as simulated: a = exp(-lambda D^gamma (H + eps)^k)
    a = law.predict_acceptance(0.5, 1, drafted_depth=np.array([1, 7]))
    assert a[1] > a[0]
    bp = block_prediction(law, confident).summary
    w = bp["requests"]
    assert abs((bp["dp_tokens_per_round"] @ w) / (bp["observed_tokens_per_round"] @ w) - 1) < 0.02
    # one request by hand: predict_rounds with the same per-position depth probabilities
    with pytest.raises(ValueError, match="drafted_depth"):
        law.predict_acceptance(0.5, 1)
    h = confident.entropy[confident.requests["request_id"].iloc[0]]
    point = np.zeros(8)
    point[7] = 1.0
    assert law.predict_rounds(h, 8, depth_probs=point) == pytest.approx(law.predict_rounds(h, 8))
    assert law.predict_block_length(h[:7], 8) == pytest.approx(
        float(np.cumprod(law.predict_acceptance(h[:7], np.arange(1, 8), drafted_depth=7)).sum()))


def test_law_exp_drafted_refuses_a_constant_drafted_depth():
    tr = simulate_traces(seed=5, n_requests_per_category=6, categories=["qa", "rag"], tokens_per_request=(40, 60))
    with pytest.raises(ValueError, match="not identified"):
        fit_law(tr, "law_exp_drafted")
