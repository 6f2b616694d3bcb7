"""Honest leave-one-category-out transfer (issue #18, items 1-2): the default LOCO uses nothing of the
held-out category but its entropies (leak test), the depth-only control, and P1 with the category share
of the CV gain where the law is reported."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from entropy_law.law import atrisk
from entropy_law.law.compare import compare_laws
from entropy_law.law.hypotheses import universality_test
from entropy_law.analysis.simulate import DepthSpec, simulate_traces
from entropy_law.law.transfer import loco_transfer

LAMBDA = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
HELD_OUT = "math_reasoning"


@pytest.fixture(scope="module")
def sim():
    """Variable drafted depths, long drafts where the entropy is low (as an n-gram drafter)."""
    return simulate_traces(seed=31, n_requests_per_category=20, k=0.8, lambda_d=LAMBDA, block_size=8,
                           tokens_per_request=(80, 140), block_depths=DepthSpec(entropy_coupling=1.0))


@pytest.fixture(scope="module")
def loco(sim):
    """The default (leak-free) LOCO of ``sim``'s block drafter, run once for the tests that read it."""
    return loco_transfer(sim, drafter="sim-block")


@pytest.fixture(scope="module")
def analysis(sim):
    """``TraceAnalysis`` of ``sim`` (its one arm, the block drafter) as the report and the P1 table tests read it."""
    from entropy_law.analysis import TraceAnalysis

    assert set(sim.runs["drafter_id"]) == {"sim-block"}
    return TraceAnalysis(sim, n_boot=2, compare_families=("law_exp",), n_folds=3)


def _deepen_drafts(traces, category: str):
    """The same traces with ``category``'s drafting rounds claiming a full block (B - 1 drafted tokens):
    its drafted depths change, its entropies and its at-risk trials do not (every trial stays within D)."""
    requests = traces.requests.loc[traces.requests["category"] == category, ["run_id", "request_id"]]
    rounds = traces.rounds.copy()
    key = pd.MultiIndex.from_frame(rounds[["run_id", "request_id"]])
    mine = key.isin(pd.MultiIndex.from_frame(requests)) & (rounds["tree_depth"] > 0).to_numpy()
    rounds.loc[mine, "tree_depth"] = int(traces.rounds["tree_depth"].max())
    assert mine.sum() > 0
    return dataclasses.replace(traces, rounds=rounds)


def test_default_loco_does_not_read_the_held_out_drafted_depths(sim, loco):
    changed = _deepen_drafts(sim, HELD_OUT)
    base = loco
    moved = loco_transfer(changed, drafter="sim-block")
    assert base.depths == "training"
    col = "predicted_tokens_per_round"
    # leak-free: the held-out prediction is a function of the training categories and its entropies only
    assert moved.summary.loc[HELD_OUT, col] == pytest.approx(base.summary.loc[HELD_OUT, col], rel=1e-12)
    assert moved.summary.loc[HELD_OUT, "depth_only_tokens_per_round"] == pytest.approx(
        base.summary.loc[HELD_OUT, "depth_only_tokens_per_round"], rel=1e-12)
    # oracle depths read them: the same change moves its prediction
    oracle_base = loco_transfer(sim, drafter="sim-block", depths="oracle")
    oracle_moved = loco_transfer(changed, drafter="sim-block", depths="oracle")
    assert oracle_base.depths == "oracle"
    assert oracle_moved.summary.loc[HELD_OUT, col] > 1.05 * oracle_base.summary.loc[HELD_OUT, col]


def test_tree_loco_does_not_use_the_held_out_tau_through_the_leaf_rule():
    """A tree round that ends at a leaf has drafted depth tau in the oracle mode; the default never reads it:
    a different tau in the held-out category's rounds table moves the oracle prediction, not the default."""
    tr = simulate_traces(seed=43, n_requests_per_category=8, k=0.8, block_size=6, tokens_per_request=(50, 70),
                         include_block=False, tree=dict(depth=4, nodes=12, k=0.55, lambda_scale=0.7))
    drafter = tr.runs["drafter_id"].iloc[0]
    held = tr.requests.loc[tr.requests["category"] == HELD_OUT, "request_id"]
    leaf = tr.tokens.loc[tr.tokens["request_id"].isin(held) & (tr.tokens["role"] == "bonus"),
                         ["run_id", "request_id", "round_index"]].drop_duplicates()
    key = pd.MultiIndex.from_frame(tr.rounds[["run_id", "request_id", "round_index"]])
    at_leaf = key.isin(pd.MultiIndex.from_frame(leaf)) & (tr.rounds["accepted"] > 0).to_numpy()
    assert at_leaf.sum() > 0
    changed = dataclasses.replace(tr, rounds=tr.rounds.assign(accepted=tr.rounds["accepted"].where(~at_leaf, 0)))
    col = "predicted_tokens_per_round"
    base, moved = loco_transfer(tr, drafter=drafter), loco_transfer(changed, drafter=drafter)
    assert moved.summary.loc[HELD_OUT, col] == pytest.approx(base.summary.loc[HELD_OUT, col], rel=1e-12)
    oracle_base = loco_transfer(tr, drafter=drafter, depths="oracle")
    oracle_moved = loco_transfer(changed, drafter=drafter, depths="oracle")
    assert abs(oracle_moved.summary.loc[HELD_OUT, col] / oracle_base.summary.loc[HELD_OUT, col] - 1) > 0.01


def test_depth_only_control_predicts_worse_than_the_law_when_entropy_matters(loco):
    acc = loco.accuracy
    law = acc.loc["tokens_per_round", "mean_abs_relative_error"]
    control = acc.loc["tokens_per_round_depth_only", "mean_abs_relative_error"]
    assert law < 0.05
    assert control > 2 * law, acc
    assert {"tokens_per_round_depth_only", "mean_accepted_depth_only"} <= set(acc.index)
    assert acc.loc["tokens_per_round", "max_abs_relative_error"] >= law
    # the control is pooled per-depth acceptance: the same for every held-out category's depth 1
    s = loco.summary
    np.testing.assert_allclose(s["relative_error_depth_only"],
                               s["depth_only_tokens_per_round"] / s["observed_tokens_per_round"] - 1)


def test_depth_only_baseline_in_compare_laws_is_the_per_depth_rate(sim):
    from entropy_law.law.compare import DEPTH_ONLY
    rows = atrisk.at_risk_table(sim, drafters=["sim-block"])
    comp = compare_laws(rows, (DEPTH_ONLY, "law_exp"), n_folds=3, seed=0)
    s = comp.summary
    assert s.loc["law_exp", "cv_log_loss"] < s.loc[DEPTH_ONLY, "cv_log_loss"]
    # by hand: held-out log-loss of the training folds' per-depth acceptance
    from entropy_law.law.compare import request_folds
    folds = request_folds(rows["request_id"].to_numpy(), 3, 0)
    fold = rows["request_id"].map(folds).to_numpy()
    y = rows["accepted"].to_numpy(dtype=float)
    ll = 0.0
    for k in range(3):
        train = rows.loc[fold != k].assign(y=y[fold != k])
        rate = train.groupby("depth")["y"].mean()
        p = rows.loc[fold == k, "depth"].map(rate).to_numpy()
        yk = y[fold == k]
        ll += float(np.sum(yk * np.log(p) + (1 - yk) * np.log1p(-p)))
    assert s.loc[DEPTH_ONLY, "cv_log_loss"] == pytest.approx(-ll / len(rows), rel=1e-9)


def test_universality_reports_the_category_share_of_the_cv_gain():
    tr = simulate_traces(seed=5, n_requests_per_category=10, k=0.8, block_size=6, tokens_per_request=(60, 90),
                         category_effects={"math_reasoning": 0.6})
    test = universality_test(tr, drafter="sim-block", cv=True, n_folds=3)
    v = test.summary["value"]
    gain_law, gain_cat = v["cv_gain_law_vs_depth_only"], v["cv_gain_cat_vs_law"]
    assert gain_law > 0 and gain_cat > 0
    assert v["cv_category_share"] == pytest.approx(gain_cat / (gain_law + gain_cat))
    assert test.p_value < 0.05  # a real category effect (10 requests per category): P1 rejects


def test_report_text_shows_p1_the_category_share_and_both_loco_modes_with_the_control(analysis):
    from entropy_law.jobs.report import results_markdown

    an = analysis
    text = results_markdown(an)
    for needle in ("P1 score χ²", "P1 p", "category share of the CV gain", f"{an.family}: P1 p",
                   f"{an.family}: category share of the CV gain", "leak-free (depths from training categories)",
                   "oracle depths (held-out's own)", "depth-only control: tokens / round: mean \\|rel. error\\|",
                   "tokens / round: max \\|rel. error\\|"):  # pipes escaped in a Markdown cell
        assert needle in text, needle


def test_universality_table_gives_p1_and_the_category_share_of_the_analysis_law_too(sim, analysis):
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.compare import category_share_of_gain
    from entropy_law.law.fit import PRIMARY_FAMILY

    an = analysis
    assert an.family == PRIMARY_FAMILY != "law_exp"
    arm = an.arms[0]
    row = an.universality_table().set_index("arm").loc[arm]
    assert row["law_family"] == PRIMARY_FAMILY
    p1 = an.law(arm).universality()
    assert row["law_p_value"] == p1["p_value"] and row["law_df"] == p1["df"]
    rows = atrisk.at_risk_table(an.arm_view(arm), drafters=[arm])
    share = category_share_of_gain(rows, PRIMARY_FAMILY, n_folds=3, seed=0)
    assert row["law_cv_category_share"] == pytest.approx(share["cv_category_share"], rel=1e-12)
    assert row["law_cv_gain_vs_depth_only"] > 0  # the law beats acceptance by depth only
    plain = TraceAnalysis(sim, family="law_exp", n_boot=2, compare_families=("law_exp",), n_folds=3)
    assert "law_family" not in plain.universality_table()  # law_exp: its P1 is the table's own


def test_training_depth_model_by_copyability_by_hand():
    """``TrainingDepthModel``'s copyability levels: each (level, entropy bin) cell is its rounds' depth shares
    shrunk towards the entropy bin's distribution by DEPTH_PRIOR_ROUNDS pseudo-rounds; a request without the
    copyability gets the entropy-only distribution; a level without rounds gets the entropy bin's."""
    from entropy_law.law.transfer import DEPTH_PRIOR_ROUNDS, TrainingDepthModel

    # entropy 0.5 (one bin); no match -> no draft, a 1-token match -> 2 drafts, a >= 4-token match -> 5 drafts
    match = np.array([0] * 30 + [1] * 20 + [5] * 10 + [8] * 10)
    depth = np.where(match == 0, 0, np.where(match == 1, 2, 5))
    rows = pd.DataFrame({"start_position": np.arange(1, match.size + 1), "drafted_depth": depth,
                         "start_entropy": 0.5, "start_context_match": match.astype(float)})
    model = TrainingDepthModel.fit(rows, drafts=7)
    rest = np.bincount(depth, minlength=8) / depth.size  # the entropy bin's (one bin holds every round)
    assert model.copy.shape == (5, 6, 8)
    e = 3  # 0.5 nats lies in the bin [0.3, 1.0)
    np.testing.assert_allclose(model.later[e], rest)
    expect = (np.eye(8)[0] * 30 + DEPTH_PRIOR_ROUNDS * rest) / (30 + DEPTH_PRIOR_ROUNDS)
    np.testing.assert_allclose(model.copy[0, e], expect)
    expect = (np.eye(8)[5] * 10 + DEPTH_PRIOR_ROUNDS * rest) / (10 + DEPTH_PRIOR_ROUNDS)
    np.testing.assert_allclose(model.copy[3, e], expect)  # level 4-7 holds the 5-token matches
    np.testing.assert_allclose(model.copy[2, e], rest)  # level 2-3: no rounds
    h = np.full(4, 0.5)
    probs = model.probabilities(h, np.array([0, 0, 1, 8]))
    np.testing.assert_allclose(probs[0], model.first[e])  # the first round keeps its own distribution
    assert probs[1].argmax() == 0 and probs[2].argmax() == 2 and probs[3].argmax() == 5
    np.testing.assert_allclose(model.probabilities(h), np.tile(rest, (4, 1)))  # without the copyability
    assert TrainingDepthModel.fit(rows, 7, copy_edges=()).copy is None
    assert TrainingDepthModel.fit(rows.drop(columns="start_context_match"), 7).copy is None
    with pytest.raises(ValueError, match="one value per output position"):
        model.probabilities(h, np.array([0, 1, np.nan, 2]))


def test_loco_depths_read_the_copyability_and_stay_leak_free():
    """A drafter that drafts long where the context repeats (the simulated copyability, ``copy_coupling``): the
    training depth model by copyability predicts the held-out categories' tokens per round better than the
    entropy-only one; and still nothing of the held-out category but its entropy and copyability sequences
    enters: claiming full blocks in its rounds table moves nothing."""
    copy = simulate_traces(seed=31, n_requests_per_category=20, k=0.8, lambda_d=LAMBDA, block_size=8,
                           tokens_per_request=(80, 140), block_depths=DepthSpec(copy_coupling=6.0))
    assert copy.tokens["context_match"].notna().all()
    by_copy = loco_transfer(copy, drafter="sim-block")
    entropy_only = loco_transfer(copy, drafter="sim-block", depth_copy_edges=())
    err = lambda t: t.accuracy.loc["tokens_per_round", "mean_abs_relative_error"]  # noqa: E731
    assert err(by_copy) < 0.5 * err(entropy_only), (err(by_copy), err(entropy_only))
    assert "copyability" in by_copy.notes[0]
    moved = loco_transfer(_deepen_drafts(copy, HELD_OUT), drafter="sim-block")
    col = "predicted_tokens_per_round"
    assert moved.summary.loc[HELD_OUT, col] == pytest.approx(by_copy.summary.loc[HELD_OUT, col], rel=1e-12)


def test_reruns_share_laws_and_rows_yet_equal_fresh_runs(sim, loco, monkeypatch):
    """``loco.rerun(without=(a,))`` fits, for held-out b, the law fitted without {a, b}: a later rerun without b
    reuses it (one fit fewer) and every category's rows to predict; each table is bit for bit a fresh run's."""
    from entropy_law.law import transfer

    cats = list(loco.summary.index)
    fits = []
    counting = transfer.fit_law
    monkeypatch.setattr(transfer, "fit_law", lambda *a, **k: fits.append(1) or counting(*a, **k))
    shared = [loco.rerun(without=(c,), min_categories=2, logliks=False).summary for c in cats[:2]]
    assert len(fits) == 2 * (len(cats) - 1) - 1
    monkeypatch.setattr(transfer, "fit_law", counting)
    for c, table in zip(cats, shared):
        fresh = loco_transfer(sim, drafter="sim-block", without=(c,), min_categories=2, logliks=False).summary
        pd.testing.assert_frame_equal(table, fresh, check_exact=True)
