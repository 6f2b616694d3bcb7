"""GLANCE's draftability law (glance/law.py): the fit against independent computations, its round logs
(read, write, round trip with our traces, bad input), and our law's per-round expectation."""

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import optimize
from scipy.special import expit, logit

from entropy_law.analysis import make_view
from entropy_law.analysis.simulate import simulate_traces
from entropy_law.glance import (CAP, GlanceLaw, fit_glance, glance_expected_accepted, glance_rounds,
                                law_round_expectations, loco_glance, read_glance_rounds, round_scores,
                                write_glance_rounds)
from entropy_law.law.fit import fit_law, get_family
from entropy_law.traces.reader import load_traces

FIXTURE = Path(__file__).parent / "data" / "glance" / "rounds.jsonl"  # made by make_rounds.py beside it
TOL = 1e-6


@pytest.fixture(scope="module")
def fixture_rounds():
    return read_glance_rounds(FIXTURE)


@pytest.fixture(scope="module")
def traces():
    return simulate_traces(seed=7, n_requests_per_category=6, categories=["qa", "rag", "translation"], block_size=6,
                           tokens_per_request=(40, 70))


# ----------------------------------------------------------------------------- independent computations


def code_form_by_profile(h, a):
    """Least squares of min(exp(b0 - b1 H), 15) where the cap does not bind: for a given b1 the optimal
    exp(b0) is sum(a w) / sum(w^2), w = exp(-b1 H); b1 is the root of the b1 normal equation (brentq)."""
    def scale(b1):
        w = np.exp(-b1 * h)
        return (a @ w) / (w @ w), w

    def normal_equation(b1):
        c, w = scale(b1)
        return np.sum((c * w - a) * w * h)

    grid = np.linspace(0.01, 10.0, 400)
    values = np.array([normal_equation(b) for b in grid])
    i = int(np.flatnonzero(np.sign(values[:-1]) != np.sign(values[1:]))[0])
    b1 = optimize.brentq(normal_equation, grid[i], grid[i + 1], xtol=1e-14, rtol=1e-14)
    b0 = float(np.log(scale(b1)[0]))
    assert np.exp(b0 - b1 * h).max() < CAP  # the cap does not bind, so the profile is the whole problem
    return b0, b1


def rank_bins(h, bins):
    """Quantile bin of each value from its rank alone (valid when (n - 1) k / bins is never whole and the
    values are distinct: every interpolated quantile then lies strictly between two data values)."""
    n = len(h)
    rank = np.argsort(np.argsort(h))
    return np.array([sum(r > (n - 1) * k / bins for k in range(1, bins)) for r in rank])


def r2(y, pred):
    return 1.0 - np.sum((y - pred) ** 2) / np.sum((y - np.mean(y)) ** 2)


def independent(h, a):
    b0, b1 = code_form_by_profile(h, a)
    curve = pd.DataFrame({"bin": rank_bins(h, 10), "h": h, "a": a}).groupby("bin").mean()
    r2_curve = r2(curve["a"].to_numpy(), np.exp(b0 - b1 * curve["h"].to_numpy()))
    ceiling_bins = 50 if len(h) >= 100 else max(5, len(h) // 10)
    means = pd.Series(a).groupby(rank_bins(h, ceiling_bins)).transform("mean").to_numpy()
    r2_ceiling = np.sum((means - a.mean()) ** 2) / np.sum((a - a.mean()) ** 2)
    return dict(b0=b0, b1=b1, r2_curve=r2_curve, r2_round=r2(a, np.exp(b0 - b1 * h)), r2_ceiling=r2_ceiling)


# ----------------------------------------------------------------------------- the law


def test_both_forms_of_expected_accepted():
    h = np.array([0.0, 0.5, 2.0, 10.0])
    z = 1.0 - 2.0 * h
    assert np.allclose(glance_expected_accepted(h, 1.0, 2.0), np.minimum(np.exp(z), 15.0), rtol=1e-14)
    assert glance_expected_accepted(-10.0, 1.0, 2.0) == 15.0  # capped
    p = expit(z)
    assert np.allclose(glance_expected_accepted(h, 1.0, 2.0, form="readme"), p * (1 - p ** 15) / (1 - p), rtol=1e-12)
    assert glance_expected_accepted(0.0, 0.0, 1.0, form="readme") == pytest.approx(1 - 0.5 ** 15)  # p = 1/2
    assert glance_expected_accepted(0.0, 50.0, 1.0, form="readme") == pytest.approx(15.0)  # p -> 1: L drafts
    with pytest.raises(ValueError, match="form must be one of"):
        glance_expected_accepted(h, 1.0, 2.0, form="paper")


def test_fixture_fit_agrees_with_independent_computation(fixture_rounds):
    law = fit_glance(fixture_rounds)
    scopes = {"pooled": fixture_rounds, **{t: part for t, part in fixture_rounds.groupby("task")}}
    assert set(law.summary.index) == set(scopes)
    for scope, part in scopes.items():
        fitted = law if scope == "pooled" else law[scope]
        truth = independent(part["entropy"].to_numpy(), part["accepted"].to_numpy(dtype=float))
        for name, value in truth.items():
            got = fitted.b1_fitted if name == "b1" else getattr(fitted, name)
            assert got == pytest.approx(value, abs=TOL), (scope, name)
        assert fitted.n_rounds == len(part) and fitted.mean_accepted == pytest.approx(part["accepted"].mean())
    assert law.holds() and all(law.checks.values())
    assert law.summary.loc["pooled", "n_requests"] == 12


def test_two_entropies_closed_form_both_forms():
    """With two entropies the fit interpolates the two group means: b1 = (z1 - z2) / (h2 - h1) with
    z = log(mean) (code form) or z = logit of the p whose p + ... + p^15 is the mean (README form)."""
    h1, h2 = 0.3, 1.7
    a1 = np.array([0, 1, 2, 3, 4, 5, 2, 3, 4, 1] * 3, dtype=float)  # mean 2.5
    a2 = np.array([0, 0, 1, 0, 2, 0, 1, 0, 0, 1] * 3, dtype=float)  # mean 0.5
    rounds = pd.DataFrame({"entropy": [h1] * 30 + [h2] * 30, "accepted": np.concatenate([a1, a2])})
    a = rounds["accepted"].to_numpy()
    between = 30 * ((2.5 - a.mean()) ** 2 + (0.5 - a.mean()) ** 2) / np.sum((a - a.mean()) ** 2)
    for form in ("code", "readme"):
        if form == "code":
            z1, z2 = np.log(2.5), np.log(0.5)
        else:
            def p_for(mean):
                return optimize.brentq(lambda p: sum(p ** k for k in range(1, 16)) - mean, 1e-9, 1 - 1e-9, xtol=1e-15)
            z1, z2 = logit(p_for(2.5)), logit(p_for(0.5))
        b1 = (z1 - z2) / (h2 - h1)
        law = fit_glance(rounds, form)
        assert law.form == form
        assert law.b1_fitted == pytest.approx(b1, abs=TOL) and law.b0 == pytest.approx(z1 + b1 * h1, abs=TOL)
        assert law.r2_round == pytest.approx(between, abs=TOL)
        assert law.r2_ceiling == pytest.approx(between, abs=TOL)
        assert law.r2_curve == pytest.approx(1.0, abs=TOL)
        assert law.predict([h1, h2]) == pytest.approx([2.5, 0.5], abs=TOL)


def test_holds_checks_and_bad_fits(fixture_rounds):
    rising = fixture_rounds.assign(entropy=fixture_rounds["entropy"].max() - fixture_rounds["entropy"])
    law = fit_glance(rising, per_category=False)
    assert law.b1_fitted < 0 and not law.checks["slope_positive"] and not law.checks["negative_rank_correlation"]
    assert not law.holds()
    # a step: runs of 3 at 0 nats, none from 1 nat on; the least-squares slope runs off past GLANCE's bound
    step = pd.DataFrame({"entropy": np.r_[np.zeros(30), np.linspace(1.0, 2.0, 30)], "accepted": [3] * 30 + [0] * 30})
    steep = fit_glance(step, per_category=False)
    assert steep.b1_fitted > 25 and steep.b1 == 25.0
    assert not steep.checks["non_degenerate"] and any("clipped" in n for n in steep.notes)
    with pytest.raises(ValueError, match="at least 30 rounds"):
        fit_glance(fixture_rounds.iloc[:29])
    with pytest.raises(ValueError, match="vary"):
        fit_glance(fixture_rounds.assign(accepted=1))
    with pytest.raises(ValueError, match="by= must be None or 'category'"):
        fit_glance(fixture_rounds, by="drafter_id")
    small = pd.concat([fixture_rounds, fixture_rounds.iloc[:5].assign(category="tiny", task="tiny")])
    assert "tiny" not in fit_glance(small).per_category
    assert any("tiny: 5 rounds, too few" in n for n in fit_glance(small).notes)


def test_decile_curve_has_bootstrap_intervals(fixture_rounds):
    law = fit_glance(fixture_rounds, seed=3)
    curve = law.curve
    assert len(curve) == 10 and curve["n"].sum() == 120
    assert np.all(curve["ci_low"] <= curve["accepted"]) and np.all(curve["accepted"] <= curve["ci_high"])
    again = fit_glance(fixture_rounds, seed=3).curve
    pd.testing.assert_frame_equal(curve, again)
    assert fit_glance(fixture_rounds, n_boot=0).curve["ci_low"].isna().all()


def test_glance_is_fitted_by_fit_glance_and_fit_law_points_there(fixture_rounds, traces):
    law = fit_glance(fixture_rounds)
    assert isinstance(law, GlanceLaw) and law.form == "code"
    assert fit_glance(fixture_rounds, form="readme").form == "readme"
    assert fit_glance(fixture_rounds, "glance_readme").form == "readme"  # the family names are forms too
    from_traces = fit_glance(traces)
    assert set(from_traces.per_category) == {"qa", "rag", "translation"}
    assert from_traces.n_rounds == int((traces.rounds["tree_depth"] > 0).sum())
    with pytest.raises(ValueError, match="by= must be None"):
        fit_glance(fixture_rounds, by="drafter_id")
    # fit_law fits law families only (a FittedLaw, or a LawSet with by=): GLANCE's names say where to go
    for family, form in (("glance", "code"), ("glance_readme", "readme")):
        with pytest.raises(ValueError, match=rf"call entropy_law\.glance\.fit_glance\(traces, form='{form}'\)"):
            fit_law(traces, family)
        with pytest.raises(ValueError, match="fit_glance"):
            fit_law(traces, family=family, by="drafter_id")
    with pytest.raises(ValueError, match="fit_glance"):
        get_family("glance")


def test_the_law_command_fits_glance_per_arm(tmp_path, capsys):
    """``entropy-law law RUN --family glance`` prints GLANCE's law of each drafting arm (it used to fail inside
    fit_law's by="drafter_id"); --loco / --tests / --out-of-core with it say why they do not apply."""
    from entropy_law.analysis.sample_traces import write_simulated_traces
    from entropy_law.cli import main

    path = write_simulated_traces(tmp_path / "traces", seed=2, n_requests_per_category=4, tokens_per_request=(40, 60))
    assert main(["law", str(path), "--family", "glance"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 2 and "=== sim-block" in out and "=== sim-tree" in out and "AR ===" not in out
    view = make_view(load_traces(path))
    block = [a for a in view.runs["drafter_id"] if a.startswith("sim-block")][0]
    arm = fit_glance(view.select_runs(view.runs.loc[view.runs["drafter_id"] == block, "run_id"]))
    assert f"{arm.b0:.4f}" in out.split("=== sim-tree")[0]  # the block arm's own fit, printed under its name
    assert main(["law", str(path), "--family", "glance_readme", "--drafter", block]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 1 and "readme" in out.lower()
    assert main(["law", str(path), "--family", "glance", "--loco"]) == 2
    assert "drop --loco / --tests / --sensitivity / --out-of-core" in capsys.readouterr().err


def test_result_object(fixture_rounds, capsys):
    import matplotlib

    matplotlib.use("Agg")
    law = fit_glance(fixture_rounds)
    law.print_summary()
    out = capsys.readouterr().out
    assert "GLANCE draftability law" in out and "chartqa" in out
    assert "<table" in law._repr_html_()
    assert law.predict(0.5, category="caption") == pytest.approx(np.exp(law["caption"].b0 - law["caption"].b1 * 0.5))
    with pytest.raises(KeyError, match="no GLANCE fit for category"):
        law.predict(0.5, category="docvqa")
    with pytest.raises(ValueError, match="finite and >= 0"):
        law.predict([-1.0])
    ax = law.plot()
    assert ax is law.plot(ax=ax, category="chartqa")
    assert len(ax.lines) >= 2 and ax.get_xlabel().startswith("target entropy")


# ----------------------------------------------------------------------------- round logs


def test_read_fixture(fixture_rounds):
    r = fixture_rounds
    assert list(r.columns[:8]) == ["round", "entropy", "accepted", "tau", "tree_size", "extended", "task", "prompt"]
    assert len(r) == 120 and sorted(r["category"].unique()) == ["caption", "chartqa"]
    assert r["request_id"].nunique() == 12 and (r["tau"] == r["accepted"] + 1).all()
    assert r["line"].tolist() == list(range(1, 121))


def test_round_trip_of_a_round_log(fixture_rounds, tmp_path):
    out = tmp_path / "rounds.jsonl"
    assert write_glance_rounds(fixture_rounds, out) == 120
    assert out.read_text() == FIXTURE.read_text()  # byte for byte: GLANCE's fields in GLANCE's order
    pd.testing.assert_frame_equal(read_glance_rounds(out), fixture_rounds)


def test_round_trip_of_our_traces(traces, tmp_path):
    rounds = glance_rounds(traces)
    drafting = traces.rounds.loc[traces.rounds["tree_depth"] > 0]
    assert len(rounds) == len(drafting)
    # H is the depth-1 row's entropy of the same round; a the round's accepted drafts
    tok = traces.tokens.loc[traces.tokens["depth"] == 1].astype({"run_id": str, "request_id": str})
    root = tok.set_index(["run_id", "request_id", "round_index"])["target_entropy_nats"]
    keys = list(zip(rounds["run_id"], rounds["request_id"], rounds["round_index"]))
    assert np.array_equal(rounds["entropy"].to_numpy(), root.loc[keys].to_numpy(dtype=float))
    acc = drafting.astype({"run_id": str, "request_id": str}).set_index(["run_id", "request_id", "round_index"])
    assert np.array_equal(rounds["accepted"].to_numpy(), acc.loc[keys, "accepted"].to_numpy())
    assert (rounds.groupby("request_id")["round"].apply(lambda r: np.array_equal(r, np.arange(len(r))))).all()
    assert (rounds.groupby("task")["prompt"].max() == 5).all()  # 6 requests per category, indexed 0..5
    buffer = io.StringIO()
    write_glance_rounds(rounds, buffer)
    first = json.loads(buffer.getvalue().splitlines()[0])
    assert list(first) == ["round", "entropy", "accepted", "tau", "tree_size", "extended", "task", "prompt"]
    path = tmp_path / "ours.jsonl"
    path.write_text(buffer.getvalue())
    back = read_glance_rounds(path)
    fields = ["round", "entropy", "accepted", "tau", "tree_size", "extended", "task", "prompt"]
    pd.testing.assert_frame_equal(back[fields], rounds[fields], check_dtype=False)
    a, b = fit_glance(back, n_boot=0), fit_glance(rounds, n_boot=0)
    assert (a.b0, a.b1, a.r2_curve) == pytest.approx((b.b0, b.b1, b.r2_curve), abs=1e-12)


def test_several_arms_are_refused(traces):
    runs = traces.runs.copy()
    other = runs.assign(run_id="other", tree_policy="ddtree")
    two = type("Traces", (), {})()
    two.runs = pd.concat([runs, other], ignore_index=True)
    two.tokens = pd.concat([traces.tokens, traces.tokens.assign(run_id="other")], ignore_index=True)
    two.rounds = pd.concat([traces.rounds, traces.rounds.assign(run_id="other")], ignore_index=True)
    with pytest.raises(ValueError, match="several drafting arms"):
        glance_rounds(two)


def test_prompt_is_inferred_where_the_log_has_none(tmp_path):
    rows = [{"round": r, "entropy": 0.1 * (i + 1), "accepted": i % 3, "tau": i % 3 + 1}
            for i, r in enumerate([0, 1, 2, 0, 1, 0])]
    path = tmp_path / "bare.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    r = read_glance_rounds(path)
    assert r["prompt"].tolist() == [0, 0, 0, 1, 1, 2] and (r["task"] == "all").all()
    assert r["tree_size"].isna().all() and not r["extended"].any()


GOOD = {"round": 0, "entropy": 0.5, "accepted": 2, "tau": 3, "tree_size": 64, "extended": False, "task": "docvqa",
        "prompt": 0}


@pytest.mark.parametrize("change, field, message", [
    ({"entropy": None}, "entropy", "finite number"),
    ({"entropy": "0.5"}, "entropy", "finite number"),
    ({"entropy": -0.2}, "entropy", "negative"),
    ({"accepted": -1, "tau": 0}, "accepted", "negative"),
    ({"accepted": 1.5, "tau": 2.5}, "accepted", "whole number"),
    ({"tau": 2}, "tau", "accepted \\+ 1 = 3"),
    ({"round": 0}, "round", "appears twice"),
    ({"prompt": -1}, "prompt", "prompt index"),
    ({"extended": "no"}, "extended", "true or false"),
    ({"tree_size": 0}, "tree_size", ">= 1"),
])
def test_bad_rounds_name_the_line_and_the_field(tmp_path, change, field, message):
    rows = [GOOD, {**GOOD, "round": 1}, {**GOOD, "round": 2, **change}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=f"{path}:3: .*'{field}'.*{message}|{path}:3: .*{message}.*'{field}'"):
        read_glance_rounds(path)


def test_missing_field_and_broken_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({k: v for k, v in GOOD.items() if k != "accepted"}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: field 'accepted' is missing"):
        read_glance_rounds(path)
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**{k: v for k, v in GOOD.items() if k != "task"},
                                                          "round": 1}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: field 'task' is missing"):  # present on line 1
        read_glance_rounds(path)
    path.write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(ValueError, match=f"{path}:2: not valid JSON"):
        read_glance_rounds(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no rounds"):
        read_glance_rounds(path)
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        fit_glance(pd.DataFrame({"entropy": [np.nan] * 40, "accepted": 1}))


# ----------------------------------------------------------------------------- comparison with our law


def test_law_round_expectations_by_hand(traces):
    law = fit_law(traces, "law_exp", cov_type="nonrobust")
    rounds = glance_rounds(traces)
    expected = law_round_expectations(law, traces, rounds)
    root_only = law_round_expectations(law, traces, rounds, root_only=True)
    tokens = traces.tokens.astype({"run_id": str, "request_id": str}).sort_values("position")
    for i in [0, 5, len(rounds) // 2, len(rounds) - 1]:
        rec = rounds.iloc[i]
        h = tokens.loc[(tokens["run_id"] == rec.run_id) & (tokens["request_id"] == rec.request_id),
                       "target_entropy_nats"].to_numpy(dtype=float)
        t, d = int(rec.start_position), int(rec.tree_depth)
        path = h[np.minimum(t + np.arange(d), len(h) - 1)]
        by_hand = np.cumprod(law.predict_acceptance(path, np.arange(1, d + 1))).sum()
        assert expected[i] == pytest.approx(by_hand, rel=1e-12)
        by_hand_root = np.cumprod(law.predict_acceptance(np.full(d, h[t]), np.arange(1, d + 1))).sum()
        assert root_only[i] == pytest.approx(by_hand_root, rel=1e-12)
    assert expected.mean() == pytest.approx(rounds["accepted"].mean(), rel=0.15)  # the law is the simulator's


def test_round_scores_and_loco(fixture_rounds):
    a = fixture_rounds["accepted"].to_numpy(dtype=float)
    perfect = round_scores(fixture_rounds, a, slope=1.0)
    assert perfect["mse"] == 0 and perfect["r2_round"] == 1 and perfect["r2_curve"] == 1
    assert perfect["category_mean_mae"] == 0 and perfect["holds"]
    law = fit_glance(fixture_rounds, per_category=False, n_boot=0)
    scores = round_scores(fixture_rounds, law.predict(fixture_rounds["entropy"]), slope=law.b1_fitted)
    assert scores["r2_round"] == pytest.approx(law.r2_round, abs=1e-12)
    assert scores["mse"] == pytest.approx(np.mean((law.predict(fixture_rounds["entropy"]) - a) ** 2))
    assert not round_scores(fixture_rounds, a, slope=[1.0, -0.1])["checks"]["slope_positive"]
    predicted, fits = loco_glance(fixture_rounds)
    caption = (fixture_rounds["category"] == "caption").to_numpy()
    other = fit_glance(fixture_rounds.loc[~caption], per_category=False, n_boot=0)
    assert set(fits) == {"caption", "chartqa"} and fits["caption"].b0 == pytest.approx(other.b0, abs=1e-12)
    assert predicted[caption] == pytest.approx(other.predict(fixture_rounds.loc[caption, "entropy"]), abs=1e-12)


def test_law_round_expectations_match_the_dp_of_the_primary_law(traces):
    """The primary law predicts from decode-time covariates of each position (lag, running mean, position, the
    target's top-1 probability): the per-round expectation must equal the DP's own acceptance array (``acceptance_for_sequence``)."""
    from entropy_law.analysis import DEFAULT_FAMILY

    view = traces.filter(run_id=["sim-block"]) if hasattr(traces, "filter") else traces
    law = fit_law(view, DEFAULT_FAMILY, cov_type="nonrobust")
    rounds = glance_rounds(view)
    expected = law_round_expectations(law, view, rounds)
    tokens = view.tokens.astype({"run_id": str, "request_id": str}).sort_values("position")
    drafts = int(view.rounds["block_size"].max()) - 1
    checked = 0
    for i in np.linspace(0, len(rounds) - 1, 7).astype(int):
        rec = rounds.iloc[i]
        mine = tokens.loc[tokens["request_id"] == rec.request_id]
        h = mine["target_entropy_nats"].to_numpy(dtype=float)
        # a law in per-position columns (the primary reads the target's top-1 probability) gets them by name
        position = {c: mine[c].to_numpy(dtype=float) for c in law.family.position_columns}
        table = law.acceptance_for_sequence(h, drafts, **position)
        t, d = int(rec.start_position), int(rec.tree_depth)
        row = table[d - 1, t, :d] if table.ndim == 3 else table[t, :d]
        assert expected[i] == pytest.approx(np.cumprod(row).sum(), rel=1e-10)
        checked += 1
    assert checked == 7


def test_side_by_side_section_and_figure_on_simulated_traces(traces):
    import matplotlib

    matplotlib.use("Agg")
    from entropy_law.analysis import DEFAULT_FAMILY, TraceAnalysis
    from entropy_law.plots.gallery import FIGURES, build_figure
    from entropy_law.plots.glance import glance_section, primary_family, side_by_side

    assert primary_family() == DEFAULT_FAMILY and "fig11_glance" in FIGURES
    analysis = TraceAnalysis(traces, n_boot=0)
    title, frame, notes = glance_section(analysis)
    assert set(frame["arm"]) == set(analysis.arms)
    for arm in analysis.arms:
        laws = frame.loc[frame["arm"] == arm].set_index("law")
        assert {"glance", analysis.family} <= set(laws.index)
        # the LOCO scores are round_scores of loco_glance: recompute GLANCE's MSE independently
        rounds = glance_rounds(analysis.arm_view(arm))
        predicted, _ = loco_glance(rounds)
        mse = np.mean((predicted - rounds["accepted"].to_numpy()) ** 2)
        assert laws.loc["glance", "mse"] == pytest.approx(mse, rel=1e-12)
        assert any(n.startswith(f"GLANCE side by side, {arm}: where GLANCE's law does at least as well") for n in notes)
    again = side_by_side(analysis.arm_view(analysis.arms[0]), analysis.arms[0], analysis.family)
    assert again["scores"][analysis.family]["mse"] == pytest.approx(
        frame.loc[(frame["arm"] == analysis.arms[0]) & (frame["law"] == analysis.family), "mse"].iloc[0], rel=1e-9)
    fig = build_figure(analysis, "fig11_glance")
    ax = [a for a in fig.axes if a.get_visible()][0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(label.startswith("GLANCE E[a|H]") for label in labels)
    assert any(label.startswith(analysis.family) for label in labels)  # our law's curve is drawn
    matplotlib.pyplot.close(fig)


def test_law_round_expectations_with_the_drafters_confidence_by_hand(traces):
    """``drafts=``: a law in the drafter's confidence (``law_exp_drafttop``) reads ``top1_prob`` at every verified
    depth of each round, the depths never reached included; by hand, the sum over k of the product of the law's
    acceptance at depths 1..k with that depth's confidence. A (round, depth) without one is refused."""
    from entropy_law.law.atrisk import add_log_covariates, at_risk_table

    rng = np.random.default_rng(3)
    rows = at_risk_table(traces)
    rows["draft_top1_prob"] = np.clip(0.9 - 0.15 * rows["target_entropy_nats"] + rng.normal(0, 0.1, len(rows)),
                                      0.01, 0.99)
    add_log_covariates(rows)
    law = fit_law(rows, "law_exp_drafttop", cov_type="nonrobust")
    rounds = glance_rounds(traces)
    drafts = pd.DataFrame([(r.run_id, r.request_id, r.round_index, d, rng.uniform(0.05, 0.95))
                           for r in rounds.itertuples() for d in range(1, int(r.tree_depth) + 1)],
                          columns=["run_id", "request_id", "round_index", "depth", "top1_prob"])
    expected = law_round_expectations(law, traces, rounds, drafts=drafts)
    confident = law_round_expectations(law, traces, rounds, drafts=drafts.assign(top1_prob=0.99))
    tokens = traces.tokens.astype({"run_id": str, "request_id": str}).sort_values("position")
    for i in [0, 7, len(rounds) // 2, len(rounds) - 1]:
        rec = rounds.iloc[i]
        h = tokens.loc[(tokens["run_id"] == rec.run_id) & (tokens["request_id"] == rec.request_id),
                       "target_entropy_nats"].to_numpy(dtype=float)
        t, d = int(rec.start_position), int(rec.tree_depth)
        mine = drafts.loc[(drafts["run_id"] == rec.run_id) & (drafts["request_id"] == rec.request_id)
                          & (drafts["round_index"] == rec.round_index)].sort_values("depth")
        assert len(mine) == d
        accept = law.predict_acceptance(h[np.minimum(t + np.arange(d), len(h) - 1)], np.arange(1, d + 1),
                                        draft_top1_prob=mine["top1_prob"].to_numpy())
        assert expected[i] == pytest.approx(np.cumprod(accept).sum(), rel=1e-12)
    assert np.abs(confident - expected).max() > 1e-3  # the confidence enters
    with pytest.raises(ValueError, match="no drafter confidence for depth 1 of round"):
        law_round_expectations(law, traces, rounds, drafts=drafts.loc[drafts["depth"] > 1])
