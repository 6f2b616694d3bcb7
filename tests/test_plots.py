"""Plot functions: the numbers behind each figure against hand computations; ax in -> same ax out; saving
is deterministic (PNG and PDF byte-identical across two saves)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from entropy_law.plots import figures as F  # noqa: E402
from entropy_law.plots.style import save_figure  # noqa: E402


def wilson_closed_form(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def at_risk_frame(seed=0, n=600):
    rng = np.random.default_rng(seed)
    h = rng.exponential(0.7, n)
    depth = rng.integers(1, 4, n)
    acc = (rng.random(n) < np.exp(-h)).astype(int)
    cat = np.where(rng.random(n) < 0.5, "math", "writing")
    return pd.DataFrame({"target_entropy_nats": h, "depth": depth, "accepted": acc, "category": cat,
                         "request_id": [f"r{i % 20}" for i in range(n)]})


def test_binned_acceptance_counts_and_wilson_intervals_match_hand_computation():
    rows = at_risk_frame()
    table = F.binned_acceptance_table(rows, depth=1, n_bins=5)
    d1 = rows.loc[rows["depth"] == 1]
    assert table["n"].sum() == len(d1)
    assert table["accepted"].sum() == d1["accepted"].sum()
    edges = np.quantile(d1["target_entropy_nats"], np.linspace(0, 1, 6))
    for r in table.itertuples():
        lo_edge, hi_edge = edges[r.bin], edges[r.bin + 1]
        inside = d1.loc[(d1["category"] == r.category) & (d1["target_entropy_nats"] >= lo_edge)
                        & ((d1["target_entropy_nats"] < hi_edge) if r.bin < 4 else True)]
        assert r.n == len(inside) and r.accepted == inside["accepted"].sum()
        lo, hi = wilson_closed_form(r.accepted, r.n)
        assert r.ci_low == pytest.approx(lo, abs=1e-9) and r.ci_high == pytest.approx(hi, abs=1e-9)
    two_plus = F.binned_acceptance_table(rows, depth="2+", n_bins=5)
    assert two_plus["n"].sum() == (rows["depth"] >= 2).sum()


def test_survival_is_product_of_conditional_acceptances():
    # hand-made: depth 1: 4 at risk, 3 accepted; depth 2: 3 at risk, 1 accepted; depth 3: 1 at risk, 1 accepted
    rows = pd.DataFrame({"category": ["c"] * 8, "depth": [1, 1, 1, 1, 2, 2, 2, 3],
                         "accepted": [1, 1, 1, 0, 1, 0, 0, 1], "target_entropy_nats": 0.1})
    t = F.survival_table(rows)
    assert t["k"].tolist() == [0, 1, 2, 3]
    assert t["survival"].tolist() == pytest.approx([1.0, 0.75, 0.25, 0.25])
    assert (t["ci_low"] <= t["survival"] + 1e-12).all() and (t["survival"] <= t["ci_high"] + 1e-12).all()
    # Greenwood at k=1: var(log S) = (1 - a) / (n a) = 0.25 / 3
    assert t.loc[1, "ci_low"] == pytest.approx(0.75 * np.exp(-1.96 * np.sqrt(0.25 / 3)))


def test_calibration_table_and_ece():
    accepted = np.array([1, 0, 1, 1, 0, 0, 1, 1])
    predicted = np.array([0.9, 0.1, 0.8, 0.7, 0.2, 0.3, 0.6, 0.95])
    t = F.calibration_table(accepted, predicted, n_bins=2)
    # two quantile bins: low half {0.1, 0.2, 0.3, 0.6} and high half {0.7, 0.8, 0.9, 0.95}
    assert t["n"].tolist() == [4, 4]
    assert t["observed"].tolist() == pytest.approx([0.25, 1.0])
    assert t["predicted"].tolist() == pytest.approx([0.3, 0.8375])
    assert F.expected_calibration_error(t) == pytest.approx((abs(0.25 - 0.3) + abs(1 - 0.8375)) / 2)


def test_accepted_length_table_pools_tokens_over_rounds():
    per_request = pd.DataFrame({"category": ["a", "a", "b"], "tokens": [30, 10, 20], "observed_rounds": [10, 10, 4],
                                "predicted_rounds": [12, 8, 5], "mean_entropy_nats": [0.2, 0.6, 1.0]})
    t = F.accepted_length_table(per_request, n_boot=50, seed=1).set_index("category")
    assert t.loc["a", "observed"] == pytest.approx(40 / 20 - 1)
    assert t.loc["a", "predicted"] == pytest.approx(40 / 20 - 1)
    assert t.loc["b", "observed"] == pytest.approx(20 / 4 - 1)
    assert t.loc["a", "mean_entropy_nats"] == pytest.approx((0.2 * 30 + 0.6 * 10) / 40)
    assert t.loc["a", "ci_low"] <= t.loc["a", "observed"] <= t.loc["a", "ci_high"]
    # with drafting rounds (block_prediction's per_request): accepted drafts per drafting round
    drafting = per_request.assign(observed_drafting_rounds=[5, 10, 2], predicted_drafting_rounds=[6.0, 4.0, 2.5])
    d = F.accepted_length_table(drafting, n_boot=50, seed=1).set_index("category")
    assert d.loc["a", "observed"] == pytest.approx((40 - 20) / 15)
    assert d.loc["a", "predicted"] == pytest.approx((40 - 20) / 10)
    assert d.loc["b", "observed"] == pytest.approx((20 - 4) / 2)
    assert d.loc["a", "ci_low"] <= d.loc["a", "observed"] <= d.loc["a", "ci_high"]


class _ConstantLaw:
    """A stand-in law: a = exp(-H) at every depth (the plot only calls predict_acceptance and family.name)."""

    class family:
        name = "const"

    def predict_acceptance(self, h, depth=1, category=None, drafter=None):
        return np.exp(-np.asarray(h))


def test_every_plot_function_draws_on_the_given_axes_and_makes_one_otherwise():
    rows = at_risk_frame()
    tokens = rows.assign(position=np.arange(len(rows)), role=np.where(rows["accepted"] == 1, "accepted", "correction"))
    per_request = pd.DataFrame({"category": ["a", "b"], "tokens": [30, 20], "observed_rounds": [10, 5],
                                "predicted_rounds": [11, 6], "mean_entropy_nats": [0.3, 0.8]})
    loco = pd.DataFrame({"arm": ["x", "x"], "category": ["a", "b"], "predicted_tokens_per_round": [2.0, 3.0],
                         "observed_tokens_per_round": [2.2, 2.7]})
    summary = pd.DataFrame({"cv_log_loss": [0.5, 0.45], "delta_vs_best": [0.05, 0.0], "delta_se": [0.01, 0.0]},
                           index=["law_logit", "law_exp"])
    curve = pd.DataFrame({"entropy_nats": [0.01, 0.1, 1.0], "estimate": [3.0, 2.0, 0.8], "ci_low": [2.5, 1.8, 0.7],
                          "ci_high": [3.5, 2.2, 0.9]})
    rounds = pd.DataFrame({"round_index": [0, 1, 2], "start_position": [0, 1, 5], "accepted": [0, 3, 2],
                           "committed": [1, 4, 3]})
    calls = [
        lambda ax: F.entropy_distributions(tokens, ax=ax),
        lambda ax: F.acceptance_vs_entropy(rows, law=_ConstantLaw(), depth=1, ax=ax),
        lambda ax: F.survival_by_depth(rows, ax=ax),
        lambda ax: F.accepted_length_vs_entropy(per_request, ax=ax),
        lambda ax: F.loco_predicted_vs_observed(loco, ax=ax),
        lambda ax: F.calibration(rows, np.exp(-rows["target_entropy_nats"].to_numpy()), ax=ax),
        lambda ax: F.law_comparison(summary, ax=ax),
        lambda ax: F.speedup_vs_entropy(curve, breakeven=(0.7, 0.5, 0.9), ax=ax),
        lambda ax: F.example_response(tokens.head(8), rounds, ax=ax),
    ]
    for call in calls:
        fig, ax = plt.subplots()
        assert call(ax) is ax
        made = call(None)
        assert made is not ax and made.figure is not fig
        plt.close("all")


def test_example_response_shades_one_span_per_round_with_accepted_drafts():
    tokens = pd.DataFrame({"position": range(8), "target_entropy_nats": np.linspace(0, 1, 8),
                           "role": ["bonus", "accepted", "accepted", "accepted", "correction", "accepted", "accepted", "bonus"]})
    rounds = pd.DataFrame({"round_index": [0, 1, 2], "start_position": [0, 1, 5], "accepted": [0, 3, 2],
                           "committed": [1, 4, 3]})
    ax = F.example_response(tokens, rounds)
    spans = [p for p in ax.patches if type(p).__name__ == "Rectangle" and p.get_alpha() == 0.25]
    x = sorted((round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6)) for p in spans if p.get_width() > 0)
    assert x == [(0.5, 3.5), (4.5, 6.5)]  # rounds 1 (positions 1-3) and 2 (positions 5-6)
    plt.close("all")


def test_saving_is_deterministic(tmp_path):
    rows = at_risk_frame()
    out = []
    for name in ("a", "b"):
        ax = F.acceptance_vs_entropy(rows, law=_ConstantLaw())
        paths = save_figure(ax.figure, tmp_path, name)
        out.append([p.read_bytes() for p in paths])
        plt.close("all")
    assert out[0] == out[1]
    assert [p.suffix for p in save_figure(plt.figure(), tmp_path, "c")] == [".png", ".pdf"]
