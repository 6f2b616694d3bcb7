"""The category table of ``bench/law.py category-table``: its LOCO means never fit on the held-out category, its
R-squared and jackknife, and the category share's two orders (``law.categories``)."""

from __future__ import annotations

import numpy as np
import pytest

from entropy_law.analysis.simulate import simulate_traces
from entropy_law.law import atrisk
from entropy_law.law.categories import category_fit, share_both_orders, tau_given_depth
from entropy_law.law.compare import compare_laws
from entropy_law.law.fit import with_category_terms

CATEGORIES = ["qa", "rag", "translation", "summarization"]
EFFECTS = {"qa": -0.6, "rag": 0.0, "translation": 0.5, "summarization": 1.0}  # log-rate shifts: known effects


@pytest.fixture(scope="module")
def traces():
    return simulate_traces(seed=11, n_requests_per_category=6, categories=CATEGORIES, category_effects=EFFECTS,
                           block_size=5, tokens_per_request=(30, 45),
                           block_depths=dict(probs=[0.1, 0.1, 0.2, 0.2, 0.4], entropy_coupling=0.3))


def test_category_fit_r2_and_jackknife():
    obs = np.array([1.0, 2.0, 3.0, 4.5, 2.5])
    pred = np.array([1.2, 1.7, 3.4, 4.0, 2.6])
    fit = category_fit(obs, pred)
    r2 = 1 - np.mean((pred - obs) ** 2) / np.var(obs)  # an independent form of 1 - SSE / SST
    assert fit["r2"] == pytest.approx(r2, rel=1e-12)
    assert fit["mae"] == pytest.approx(np.mean(np.abs(pred - obs)), rel=1e-12)
    drops = [1 - np.mean((np.delete(pred, i) - np.delete(obs, i)) ** 2) / np.var(np.delete(obs, i)) for i in range(5)]
    se = np.sqrt(4 / 5 * np.sum((np.array(drops) - np.mean(drops)) ** 2))
    assert fit["r2_hi"] - fit["r2"] == pytest.approx(1.6448536269514722 * se, rel=1e-9)
    assert fit["r2_lo"] < fit["r2"] < fit["r2_hi"] and fit["mae_lo"] < fit["mae"] < fit["mae_hi"]
    assert category_fit(obs, obs)["r2"] == 1.0
    assert category_fit(obs, np.full(5, obs.mean()))["r2"] == pytest.approx(0.0, abs=1e-12)  # the mean: 0
    with pytest.raises(ValueError, match="at least 3"):
        category_fit(obs[:2], pred[:2])


def test_tau_given_depth_matches_the_sum():
    a = np.array([[0.5, 0.4, 0.9], [1.0, 0.0, 0.3]])
    tau = tau_given_depth(a)
    assert tau[0].tolist() == pytest.approx([0.5, 0.5 + 0.2, 0.5 + 0.2 + 0.18])
    assert tau[1].tolist() == pytest.approx([1.0, 1.0, 1.0])
    by_depth = np.stack([a, a * 0.5, a * 0.25])  # a law in D: [D - 1, t, j]
    assert tau_given_depth(by_depth)[:, 1] == pytest.approx(tau_given_depth(a * 0.5)[:, 1])


def test_loco_means_never_fit_on_the_held_out_category(traces, monkeypatch):
    import bench.law as bl
    import entropy_law.glance as glance
    from entropy_law.law import transfer

    seen = {"law": [], "depth": [], "glance": []}
    fit_law, depth_fit, fit_glance = bl.fit_law, transfer.TrainingDepthModel.fit, glance.fit_glance

    def record(kind, real, frame_of=lambda *a, **k: a[0]):
        def wrapper(*args, **kwargs):
            seen[kind].append(frozenset(frame_of(*args, **kwargs)["category"].astype(str)))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(bl, "fit_law", record("law", fit_law))
    monkeypatch.setattr(transfer.TrainingDepthModel, "fit", classmethod(
        lambda cls, depths, *a, **k: (seen["depth"].append(frozenset(depths["category"].astype(str))),
                                      depth_fit(depths, *a, **k))[1]))
    monkeypatch.setattr(glance, "fit_glance", record("glance", fit_glance))
    res = bl.category_means(traces, "law_exp")
    everything = frozenset(CATEGORIES)
    for kind, fits in seen.items():
        assert len(fits) == len(CATEGORIES), kind  # one fit per fold
        left_out = [everything - f for f in fits]
        assert all(len(out) == 1 for out in left_out), kind  # each fit lacks exactly one category
        assert sorted(next(iter(out)) for out in left_out) == sorted(CATEGORIES), kind  # each category once
    # the table's categories, their observed means, and every predictor's mean for every category
    assert sorted(res["observed"].index) == sorted(CATEGORIES)
    for name, means in res["predicted"].items():
        assert sorted(means) == sorted(CATEGORIES) and np.isfinite(list(means.values())).all(), name
    # a faster category (lower rejection rate) is predicted faster by the law, from its entropies alone or not
    observed = res["observed"]
    assert observed["qa"] > observed["summarization"]  # the known effects show in the observed means


def test_share_orders_sum_as_they_should(traces):
    rows = atrisk.at_risk_table(traces)
    share = share_both_orders(rows, "law_exp", seed=3, min_requests_per_category=1)
    s = compare_laws(rows, ("depth_only", "law0_cat", "law_exp", with_category_terms("law_exp")), n_folds=5,
                     seed=3, min_requests_per_category=1).summary["cv_log_loss"]
    total = s["depth_only"] - s["law_exp+cat"]
    assert share["cv_gain_total"] == pytest.approx(total)
    # each order splits the whole gain between the two groups
    assert share["category_first"] + share["entropy_last"] == pytest.approx(1.0)
    assert share["entropy_added_first"] + share["entropy_first"] == pytest.approx(1.0)
    assert share["category_first"] == pytest.approx((s["depth_only"] - s["law0_cat"]) / total)
    assert share["shapley"] == pytest.approx((share["category_first"] + share["entropy_first"]) / 2)
    assert share["category_first"] > 0  # the simulated categories differ, and category terms alone catch it


def test_the_table_jackknife_refits_without_each_category(traces, monkeypatch):
    """Each jackknife run leaves category c out of the whole LOCO run: every law fit lacks the held-out category
    and c, and the intervals come from those refits, not from the full run's fold predictions kept."""
    import bench.law as bl

    full = bl.category_means(traces, "law_exp")
    cats = list(full["observed"].index)
    seen, fit_law = [], bl.fit_law
    monkeypatch.setattr(bl, "fit_law", lambda counts, *a, **k: (seen.append(frozenset(counts["category"])),
                                                                 fit_law(counts, *a, **k))[1])
    runs = bl.jackknife_refits(traces, "law_exp", cats)
    assert len(seen) == len(CATEGORIES) * (len(CATEGORIES) - 1)  # K runs of K - 1 folds
    assert all(len(set(CATEGORIES) - fit) == 2 for fit in seen)  # each fit lacks the held-out category and c
    obs = full["observed"].to_numpy(float)
    pred = np.array([full["predicted"]["workload"][c] for c in cats])
    refits = []
    for dropped, run in zip(cats, runs):
        others = [c for c in cats if c != dropped]
        assert list(run["observed"].index) == others and np.allclose(run["observed"], full["observed"].loc[others])
        refits.append((run["observed"].to_numpy(float), np.array([run["predicted"]["workload"][c] for c in others])))
    # removing a category changes the other categories' fits, so their predictions move
    assert any(not np.allclose(p, np.delete(pred, i)) for i, (_, p) in enumerate(refits))
    refit, kept = category_fit(obs, pred, refits), category_fit(obs, pred)
    assert refit["r2"] == kept["r2"] and refit["r2_hi"] != pytest.approx(kept["r2_hi"], rel=1e-6)
    with pytest.raises(ValueError, match="refit"):
        category_fit(obs, pred, refits[:2])
