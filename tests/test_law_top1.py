"""The target's own top-1 probability as a covariate of the law (issue #18 item 3): the at-risk trials' miss terms
(``target_miss_prob`` = 1 - p1, ``log_target_miss`` = log(1 - p1 + 1e-3)), the families ``law_exp_obs_ceil_top1`` /
``law_exp_obs_ceil_top1_copy`` (a known effect recovered, the DP given the same values as the trials, the steady
state where only H is given, clear errors where the column is missing or out of range)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from entropy_law.law import atrisk
from entropy_law.law.fit import fit_law, get_family
from entropy_law.glance import glance_rounds, law_round_expectations
from entropy_law.outofcore.streamed import OutOfCoreError, _streamable
from entropy_law.law.transfer import sequence_context, sequences_of
from tests.traces_helpers import assert_recovered, one_drafter, quiet_simulation
from tests.traces_helpers import redrawn as redrawn_rows

TRUE_W = 0.6  # the rejection hazard's exponent of the target's miss probability in the redrawn trials


@pytest.fixture(scope="module")
def sim():
    return quiet_simulation(seed=11, n_requests_per_category=8, tokens_per_request=(60, 90))


@pytest.fixture(scope="module")
def traded():
    """At-risk trials of 3 simulated requests whose acceptance depends on H alone: the law in H and p1 fitted on
    them trades one for the other (k < 0 < w)."""
    traces = quiet_simulation(seed=0, n_requests_per_category=1, categories=["qa", "rag", "math_reasoning"],
                              include_ar=True, tokens_per_request=(40, 60))
    return one_drafter(atrisk.at_risk_table(traces))


@pytest.fixture(scope="module")
def redrawn(sim):
    """One drafter's at-risk trials with p1 perturbed per position (so that it is not a function of H) and the
    outcome redrawn from a hazard in H and in the miss probability with the known exponent ``TRUE_W``."""
    table = one_drafter(atrisk.at_risk_table(sim))
    rng = np.random.default_rng(1)
    p1 = np.clip(table["target_top1_prob"].to_numpy() * rng.uniform(0.6, 1.0, len(table)), 0.0, 1.0)
    table = table.assign(target_top1_prob=p1)
    atrisk.add_log_covariates(table)
    hazard = 0.8 * (table["target_entropy_nats"] + 1e-3) ** 0.5 * np.exp(TRUE_W * table["log_target_miss"])
    return redrawn_rows(table, hazard, rng)


def test_the_trials_carry_the_targets_miss_probability(sim):
    table = one_drafter(atrisk.at_risk_table(sim))
    look = sim.tokens.set_index(["run_id", "request_id", "position"])["target_top1_prob"].astype(float)
    p1 = look.loc[list(zip(table["run_id"], table["request_id"], table["position"]))].to_numpy()
    np.testing.assert_allclose(table["target_miss_prob"], 1.0 - p1, atol=1e-7)
    np.testing.assert_allclose(table["log_target_miss"], np.log(1.0 - p1 + 1e-3), atol=1e-6)


def test_a_known_miss_effect_is_recovered_and_wins_the_comparison(redrawn):
    law = assert_recovered(redrawn, "law_exp_obs_ceil", "law_exp_obs_ceil_top1", "log_target_miss", TRUE_W)
    # given p1, a larger miss probability lowers the acceptance at the same H
    high = law.predict_acceptance(0.5, depth=1, target_top1_prob=0.95)
    low = law.predict_acceptance(0.5, depth=1, target_top1_prob=0.4)
    assert high > low


def test_without_p1_the_law_reads_the_training_mean_miss_at_that_entropy(redrawn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_obs_ceil_top1", cov_type="nonrobust")
    # the steady state at H: the trials' mean log-miss near that H, computed here from the rows, not the cells
    x = np.log(redrawn["target_entropy_nats"].to_numpy() + 1e-3)
    y = redrawn["log_target_miss"].to_numpy()
    for h in (0.05, 0.5, 2.0):
        near = np.abs(x - np.log(h + 1e-3)) < 0.25
        assert near.sum() > 30
        got = float(law.steady_state(np.array([h]))["log_target_miss"][0])
        assert abs(got - y[near].mean()) < 0.35, h
    a = law.predict_acceptance(np.array([0.05, 0.5, 2.0]), depth=1)
    assert np.all((a > 0) & (a < 1)) and a[0] > a[2]
    # p1 given by the caller replaces the steady state
    given = law.predict_acceptance(0.5, depth=1, target_top1_prob=0.99)
    assert given != pytest.approx(float(a[1]))


def test_the_dp_reads_the_same_p1_as_the_trials(sim, redrawn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_obs_ceil_top1", cov_type="nonrobust")
    tokens = sim.tokens.loc[sim.tokens["run_id"] == redrawn["run_id"].iloc[0]]
    seqs = sequences_of(tokens)
    rec = seqs.iloc[0]
    assert set(sequence_context(law, rec)) == {"target_top1_prob"}
    frame, _ = law.sequence_frame(rec["entropy"], 3, **sequence_context(law, rec))
    table = one_drafter(atrisk.at_risk_table(sim))
    mine = table.loc[table["request_id"] == rec["request_id"]]
    checked = 0
    for r in mine.itertuples():
        if r.depth > 3:
            continue
        i = (int(r.position) - int(r.depth) + 1) * 3 + int(r.depth) - 1  # (round start, depth) row of the DP
        assert frame["target_top1_prob"].iloc[i] == pytest.approx(r.target_top1_prob)
        checked += 1
    assert checked > 10
    with pytest.raises(ValueError, match="top-1 probability"):
        law.predict_rounds(rec["entropy"], 4)  # the DP over H alone cannot run a law in p1
    # given p1, the public DP runs on the same acceptance array as sequence_frame's rows
    a = law.acceptance_for_sequence(rec["entropy"], 3, target_top1_prob=rec["target_top1_prob"])
    np.testing.assert_allclose(a.ravel(), law.predict_frame(frame))
    tpr = law.predict_tokens_per_round(rec["entropy"], 4, target_top1_prob=rec["target_top1_prob"])
    sure = law.predict_tokens_per_round(rec["entropy"], 4, target_top1_prob=np.ones(len(rec["entropy"])))
    assert 1.0 <= tpr < sure <= 4.0  # the target certain everywhere: more accepted drafts per round
    with pytest.raises(ValueError, match="top-1 probability"):
        law.sequence_frame(rec["entropy"], 3)
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        law.sequence_frame(rec["entropy"], 3, target_top1_prob=rec["target_top1_prob"] + 1.0)
    with pytest.raises(ValueError, match="one per output position"):
        law.sequence_frame(rec["entropy"], 3, target_top1_prob=rec["target_top1_prob"][:-1])


def test_a_rounds_expectation_reads_p1_at_the_rounds_positions(sim, redrawn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_obs_ceil_top1", cov_type="nonrobust")
    drafter = sorted(sim.runs["drafter_id"].unique())[0]
    view = type(sim)(tokens=sim.tokens, rounds=sim.rounds, requests=sim.requests,
                     runs=sim.runs.loc[sim.runs["drafter_id"] == drafter])
    rounds = glance_rounds(view).head(40)
    got = law_round_expectations(law, view, rounds)
    assert got.shape == (40,) and np.all(np.isfinite(got)) and np.all(got >= 0)
    # p1 pushed to 1 everywhere: the target's miss vanishes, every round is expected to accept more
    sure = type(sim)(tokens=sim.tokens.assign(target_top1_prob=1.0), rounds=sim.rounds, requests=sim.requests,
                     runs=view.runs)
    assert np.all(law_round_expectations(law, sure, rounds) >= got - 1e-12)
    lacking = type(sim)(tokens=sim.tokens.assign(target_top1_prob=np.nan), rounds=sim.rounds, requests=sim.requests,
                        runs=view.runs)
    with pytest.raises(ValueError, match="target_top1_prob"):
        law_round_expectations(law, lacking, rounds)


def test_top1_families_refuse_traces_without_the_column(sim):
    rows = one_drafter(atrisk.at_risk_table(sim))
    # every other input of the three families there, the target's top-1 probability missing
    missing = rows.assign(target_top1_prob=np.nan, context_match=0.0, draft_top1_prob=0.5)
    atrisk.add_log_covariates(missing)
    missing.attrs.update(rows.attrs)
    for family in ("law_exp_obs_ceil_top1", "law_exp_obs_ceil_top1_copy", "law_exp_obs_ceil_drafttop_top1_copy"):
        fam = get_family(family)
        assert fam.needs_target_top1 and "target_top1_prob" in fam.position_columns
        with pytest.raises(ValueError, match="entropy-law entropy"):
            fit_law(missing, family)
        if fam.needs_context_match:  # the query computes 1 - p1 (law_exp_obs_ceil_top1), not the copyability
            with pytest.raises(OutOfCoreError, match="copyability"):
                _streamable(fam)
        else:
            _streamable(fam)
    assert get_family("law_exp_obs_ceil_top1_copy").position_columns == ("context_match", "target_top1_prob")
    assert get_family("law_exp_obs_ceil").position_columns == ()
    assert pd.isna(missing["target_top1_prob"]).all()


def test_the_target_miss_curve_rises_with_the_entropy_and_keeps_the_mean():
    """Group means that dip (few requests) are pooled so that the H-only miss never falls as H rises; the
    trial-weighted mean log-miss is unchanged (isotonic regression preserves it)."""
    from entropy_law.law.fit import target_miss_curve

    n = np.array([10.0, 10.0, 10.0, 10.0])
    h = np.array([0.01, 0.1, 1.0, 3.0])
    miss = np.array([-5.0, -2.0, -3.0, -1.0])  # the third group dips below the second
    sums = pd.DataFrame({"n": n, "sum_h": n * h, "sum_miss": n * miss}, index=[0, 1, 2, 3])
    centres, values = target_miss_curve(sums, n_bins=4)
    np.testing.assert_allclose(centres, np.log(h + 1e-3))
    np.testing.assert_allclose(values, [-5.0, -2.5, -2.5, -1.0])  # the dip pooled with its neighbour
    assert np.average(values, weights=n) == pytest.approx(np.average(miss, weights=n))


def test_the_h_only_curve_never_rises_with_the_entropy(traded):
    """Three requests: the fit trades H for p1 (negative H exponent, positive miss exponent), and the law's
    H-only steady state rose again beyond the trials' largest entropy (0.35 at 2 nats, 0.51 at 8). The steady
    state's envelope keeps it nonincreasing; given p1, and along a sequence (the DP), the law is unchanged."""
    from entropy_law.law.fit import STEADY_GRID_MAX_NATS

    rows = traded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(rows, "law_exp_obs_ceil_top1", cov_type="nonrobust")
    assert law.result.params["log_entropy"] < 0 < law.result.params["log_target_miss"]  # the trade, as seen
    h = np.geomspace(1e-3, 30.0, 400)
    for depth in (1, 3):
        a = law.predict_acceptance(h, depth)
        assert np.all(np.diff(a) <= 0) and np.all((a > 0) & (a < 1))
        # the law itself, with the steady state's covariates given by the caller, does rise: the envelope binds
        raw = law.predict_acceptance(h, depth, **law.steady_state(h))
        assert np.any(np.diff(raw) > 0) and np.all(a <= raw + 1e-15)
        inside = h < 1.0  # where it already falls, nothing changes
        np.testing.assert_allclose(a[inside], raw[inside], rtol=0, atol=0)
    assert h.max() > STEADY_GRID_MAX_NATS  # a query beyond the grid extends it
    # per position: the law's own value (no envelope), as the DP reads it
    # given p1 (as the DP gives it), the law's own value at that H and p1: no envelope from the H-only curve
    frame = pd.DataFrame({"target_entropy_nats": h, "depth": 1, "target_top1_prob": 0.2, "lag_entropy_nats": h,
                          **{k: v for k, v in law.steady_state(h).items() if k not in ("lag_entropy_nats",
                                                                                        "log_target_miss")}})
    np.testing.assert_array_equal(law.predict_acceptance(h, 1, target_top1_prob=0.2), law.predict_frame(frame))
    assert np.any(np.diff(law.predict_frame(frame)) > 0)  # rising in H at this p1: the law's own shape, kept


def test_a_law_that_falls_with_the_entropy_is_not_changed_by_the_envelope(redrawn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_obs_ceil_top1", cov_type="nonrobust")
    h = np.geomspace(1e-3, 20.0, 300)
    raw = law.predict_acceptance(h, 2, **law.steady_state(h))
    assert np.all(np.diff(raw) <= 0)
    np.testing.assert_array_equal(law.predict_acceptance(h, 2), raw)


def test_traces_without_p1_get_the_fallback_primary_and_say_so(sim):
    """A log with the target entropy alone (no top-1 probability): the analysis and the report's notes use
    PRIMARY_FALLBACK instead of failing, and say why; families that read a statistic it lacks refuse."""
    from types import SimpleNamespace

    from entropy_law.jobs.report import few_requests_notes
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.fit import PRIMARY_FALLBACK, PRIMARY_FAMILY

    assert TraceAnalysis(sim, n_boot=0).family == PRIMARY_FAMILY
    tokens = sim.tokens.copy()
    # an engine that logs the entropy alone: its other target statistics null at every token
    for column in ("target_renyi2_nats", "target_top1_prob", "target_top2_prob", "target_logit_gap"):
        tokens[column] = np.nan
    imported = SimpleNamespace(tokens=tokens, rounds=sim.rounds, requests=sim.requests, runs=sim.runs)
    an = TraceAnalysis(imported, n_boot=0)
    assert an.family == PRIMARY_FALLBACK and an.law(an.arms[0]).family.name == PRIMARY_FALLBACK
    assert any(PRIMARY_FALLBACK in n and "entropy-law entropy" in n for n in few_requests_notes(an))
    # a family asked for by name is kept, and a family that reads an unlogged statistic refuses with the hint
    for family in (PRIMARY_FAMILY, "law_renyi2", "law_margin"):
        asked = TraceAnalysis(imported, n_boot=0, family=family)
        with pytest.raises(ValueError, match="did not log .*entropy-law entropy"):
            asked.law(asked.arms[0])
    # the statistic null at only some positions is not "unlogged": it is invalid, as any NaN
    partly = SimpleNamespace(tokens=sim.tokens.assign(target_top1_prob=sim.tokens["target_top1_prob"].where(
        sim.tokens.index % 7 != 0)), rounds=sim.rounds, requests=sim.requests, runs=sim.runs)
    with pytest.raises(ValueError, match="invalid covariates"):
        atrisk.at_risk_table(partly)


def test_on_the_shipped_timed_traces_the_primary_h_only_curve_falls(timed_analysis):
    """data/traces_timed (40 prompts): the n-gram chain's primary law trades H for p1 (k < 0 < w) and its raw
    H-only acceptance rose again beyond the largest observed entropy (0.31 at 4 nats, 0.59 at 20); the answer a
    caller gets from H alone falls everywhere, and inside the data it stays within 0.01 of the raw curve."""
    from entropy_law.law.fit import PRIMARY_FAMILY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TraceAnalysis(load_traces(timed)): its law does not depend on n_boot
        law = timed_analysis.law("ngram chain")
    assert law.family.name == PRIMARY_FAMILY and law.result.params["log_entropy"] < 0
    h = np.geomspace(1e-4, 20.0, 500)
    raw = law.predict_acceptance(h, 1, **law.steady_state(h))
    a = law.predict_acceptance(h, 1)
    assert raw[-1] > raw[np.searchsorted(h, 4.0)] + 0.1  # the rise the envelope removes
    assert np.all(np.diff(a) <= 0) and np.all(a <= raw)
    # inside the data it only flattens small rises (where the isotonic miss curve is flat and k < 0 lifts the curve)
    inside = (h > 0.1) & (h < 3.0)  # past the bump below 0.01 nats (0.970 -> 0.985) and before the rise
    assert np.max(raw[inside] - a[inside]) < 0.01 and np.mean(a[inside] == raw[inside]) > 0.5


def test_a_law_in_p1_reports_w_beside_k(sim):
    """k of a law in p1 is H's exponent at fixed p1 (negative on few requests): the law's derived parameters,
    the analysis' law table and the report's law frame show w, the exponent of 1 - p1, beside it."""
    from entropy_law.jobs.report import law_frame
    from entropy_law.analysis import TraceAnalysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        an = TraceAnalysis(sim, n_boot=0)
        law = an.law(an.arms[0])
        d = law.derived
        assert list(d.index[:2]) == ["k", "w"]
        assert d.loc["w", "estimate"] == pytest.approx(law.result.params["log_target_miss"])
        assert d.loc["w", "ci_low"] < d.loc["w", "estimate"] < d.loc["w", "ci_high"]
        frame = law_frame(an)
        assert "w: exponent of 1 − p₁ (95% CI)" in frame.columns
        plain = law_frame(TraceAnalysis(sim, n_boot=0, family="law_exp_obs_ceil"))
        assert not any(c.startswith("w:") for c in plain.columns)


def test_glances_slope_condition_reads_the_total_effect_of_entropy(traded):
    """GLANCE's holds() asks every LOCO fold's slope to be positive. For a law in H and p1, k is H's exponent at
    fixed p1 and turns negative where the two trade (3 requests here; two block-chain folds of data/traces);
    ``law_slope`` is the exponent of the law's H-only curve over the fitted entropies, k itself for law_exp."""
    from entropy_law.plots.glance import law_slope

    rows = traded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top1 = fit_law(rows, "law_exp_obs_ceil_top1", cov_type="nonrobust")
        plain = fit_law(rows, "law_exp", cov_type="nonrobust")
    assert law_slope(plain) == plain.derived.loc["k", "estimate"]  # a law in H alone: k
    k = top1.derived.loc["k", "estimate"]
    assert k < 0 < law_slope(top1)  # the simulated acceptance falls with H; k alone says the opposite
    # what law_slope measures: the H-only curve's cloglog slope over the fitted range, recomputed by hand
    h = np.geomspace(0.05, 2.0, 30)
    a = top1.predict_acceptance(h, 1, **top1.steady_state(h))
    assert np.polyfit(np.log(h + top1.eps), np.log(-np.log(a)), 1)[0] > 0
    # a drafter-aware law: its own statistics at their training means (the bench crashed on it without them)
    confident = rows.assign(draft_top1_prob=np.random.default_rng(0).uniform(0.2, 0.99, len(rows)))
    atrisk.add_log_covariates(confident)
    confident.attrs.update(rows.attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aware = fit_law(confident, "law_exp_obs_ceil_drafttop", cov_type="nonrobust")
    assert np.isfinite(aware.result.params["log_draft_miss"]) and np.isfinite(law_slope(aware))
