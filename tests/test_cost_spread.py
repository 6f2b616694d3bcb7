"""The cost model's run-to-run spread (``payoff.workload.cost_spread``): consecutive blocks of a run's requests,
each with its own cost model, widen every predicted interval by how far their predictions disagree beyond their
own sampling noise; the demo's answer and ``predict`` print it."""

import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from entropy_law.payoff import workload
from entropy_law.payoff.cost import fit_cost_model
from entropy_law.payoff.workload import COST_BLOCKS, decode_cost_ms, price_rounds, round_counts


def _analysis(n_per_category=8, slow_block=None, factor=1.3, n_boot=40, **options):
    """Simulated timed traces (the arm and AR on the same prompts) and their analysis; ``slow_block``: the arm's
    rounds of that block of its requests (recording order, ``COST_BLOCKS`` blocks) timed ``factor`` times slower,
    as a machine busy for a quarter of the run would, AR untouched; ``options``: more ``TraceAnalysis`` options."""
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.analysis.simulate import SimCosts, simulate_traces

    traces = simulate_traces(seed=3, n_requests_per_category=n_per_category, block_size=5, include_ar=True,
                             tokens_per_request=(60, 90), costs=SimCosts(draft_ms=40.0))
    if slow_block is not None:
        arm_rounds = traces.rounds["run_id"] != "sim-ar"
        block = _blocks(traces.rounds.loc[arm_rounds])[slow_block]
        rows = arm_rounds & traces.rounds["request_id"].isin(block)
        for col in ("draft_ms", "verify_ms", "overhead_ms"):
            traces.rounds.loc[rows, col] *= factor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        an = TraceAnalysis(traces, n_boot=n_boot, seed=1, **options)
    return an, an.arms[0]


def _blocks(rounds):
    """The arm's request ids in recording order (first round), cut into ``COST_BLOCKS`` consecutive blocks."""
    return np.array_split(pd.unique(rounds["request_id"]), COST_BLOCKS)


def _priced(an, arm, *, widen=True, monkeypatch=None):
    """``price_rounds`` of the arm's own recorded rounds; ``widen=False``: with ``cost_spread`` switched off (what
    the intervals were before the spread was carried)."""
    view = an.cost_view(arm)
    if not widen:
        monkeypatch.setattr(workload, "cost_spread", lambda *a, **k: (np.nan, "switched off"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return price_rounds(view, round_counts(view, arm), drafter=arm, n_boot=40, seed=1)


def _log_width(row):
    return np.log(row["ci_high"]) - np.log(row["ci_low"])


def _block_alone(an, arm):
    """Per block: the speedup of all the arm's recorded rounds priced by that block's cost model and t_AR alone
    (fitted by hand from ``fit_cost_model`` with 0/1 request weights, priced by ``decode_cost_ms``)."""
    view = an.cost_view(arm)
    counts = round_counts(view, arm)
    arm_rounds = view.rounds.loc[view.rounds["run_id"] != "sim-ar"]
    out = []
    for block in _blocks(arm_rounds):
        c = fit_cost_model(view, drafter=arm, request_weights=pd.Series(1.0, index=block))
        ms = decode_cost_ms(c, counts["rounds"].to_numpy(float), counts["drafting_rounds"].to_numpy(float),
                            counts["nodes"].to_numpy(float), counts["skipped_rounds"].to_numpy(float))
        out.append(counts["tokens"].sum() * c.ar_ms_per_token / ms.sum())
    return np.array(out)


def test_the_same_cost_in_every_block_widens_the_interval_by_little(monkeypatch):
    an, arm = _analysis()
    got = _priced(an, arm).summary.loc["all"]
    alone = _block_alone(an, arm)
    assert np.ptp(np.log(alone)) < 0.05  # the blocks agree: one machine state
    assert np.isfinite(got["cost_spread"]) and got["cost_spread"] < 0.02
    plain = _priced(an, arm, widen=False, monkeypatch=monkeypatch).summary.loc["all"]
    assert np.isnan(plain["cost_spread"])
    assert _log_width(plain) <= _log_width(got) <= 1.25 * _log_width(plain)


def test_a_block_timed_30_percent_slower_widens_the_interval_over_every_blocks_prediction(monkeypatch):
    an, arm = _analysis(slow_block=2)
    alone = _block_alone(an, arm)
    assert alone[2] < 0.85 * np.delete(alone, 2).min()  # the slow block alone predicts far less
    got = _priced(an, arm)
    row = got.summary.loc["all"]
    assert row["cost_spread"] > 0.05
    assert row["ci_low"] <= alone.min() and alone.max() <= row["ci_high"]  # every block's cost alone is inside
    assert any("cost run-to-run spread (SD of the log speedup" in n for n in got.notes)
    plain = _priced(an, arm, widen=False, monkeypatch=monkeypatch).summary.loc["all"]
    assert plain["ci_low"] > alone.min()  # the request bootstrap alone misses the slow block's conditions
    assert _log_width(row) > 1.5 * _log_width(plain)
    assert row["predicted_speedup"] == plain["predicted_speedup"]  # the estimate itself is not moved


def test_too_few_requests_for_the_blocks_widen_nothing_and_say_why(monkeypatch):
    an, arm = _analysis(n_per_category=1)  # 5 requests: fewer than 4 blocks of 2
    got = _priced(an, arm)
    assert got.summary["cost_spread"].isna().all()
    note = next(n for n in got.notes if n.startswith("cost run-to-run spread not measured"))
    assert "5 requests, fewer than 4 blocks of 2" in note and "not widened" in note
    assert "cost run-to-run spread not measured;" in got.answer()
    plain = _priced(an, arm, widen=False, monkeypatch=monkeypatch)
    ci = ["ci_low", "ci_high"]
    assert np.array_equal(got.summary[ci].to_numpy(), plain.summary[ci].to_numpy(), equal_nan=True)


def test_the_demo_answer_and_predict_print_the_spread(monkeypatch):
    from entropy_law.jobs.report import answer_frame, answer_lines, verdict_lines

    # 5 replicates and law_exp: the spread is checked to be carried (whatever the law prices with), not sized
    an, arm = _analysis(slow_block=2, n_boot=5, family="law_exp")
    got = _priced(an, arm)
    spread = got.summary.loc["all", "cost_spread"]
    assert f"cost run-to-run spread ±{spread:.1%}" in got.answer()  # what entropy-law predict prints
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cats = an.workload(arm).categories
        frame = answer_frame(an)
        screen, detail = verdict_lines(an), "\n".join(answer_lines(an))
        busy = "\n".join(answer_lines(an, loaded=True))  # a loaded machine: summary.txt gives no verdict either
    assert "-> not measured (machine loaded)" in busy and "-> unclear" not in busy and "-> pays" not in busy
    assert "(machine loaded) (" not in busy  # no verdict: no source it rests on
    for r in frame.itertuples():  # a verdict names what it rests on; "not measured" names none
        rests = r.pays in ("pays", "does not pay", "unclear")
        assert (f"-> {r.pays} ({r.pays_from})" in detail) == rests and f"-> {r.pays}" in detail
    assert (cats["cost_spread"] > 0.05).any()  # the law's pricing carries it too
    largest = frame["workload_spread"].max()
    assert largest == pytest.approx(cats.drop(index="all")["cost_spread"].max())
    assert screen[0].startswith("When drafting pays") and screen[0].endswith(
        f"; cost run-to-run spread ±{largest:.1%}")
    for r in frame.itertuples():  # summary.txt: each category's predicted interval with its own spread
        spread = f"(cost run-to-run spread ±{r.workload_spread:.1%})"
        assert f"[{r.workload_low:.2f}, {r.workload_high:.2f}] {spread}" in detail
    # the demo's interval is the widened one
    assert frame["workload_low"].to_numpy() == pytest.approx(cats.loc[frame["category"], "ci_low"].to_numpy())


def test_one_verdict_rule_in_the_summary_and_the_report():
    """summary.txt and the report show a measured speedup by the screen's rule (``category_verdict``): an interval
    the ±15% bench rule calls "not measured reliably" is a result where its upper end is at most twice its lower."""
    from entropy_law.jobs.report import _speedup_cell, category_verdict, speedup_text

    assert speedup_text(1.27, 1.02, 1.59, 5, "not measured reliably") == "1.27x [1.02, 1.59]"
    assert category_verdict(5, 1.02, 1.59) == "pays"
    assert speedup_text(1.27, 1.02, 1.59, 4, "not measured reliably") == "not measured (4 requests)"
    assert speedup_text(1.27, 0.6, 1.59, 9, "measured") == "not measured (9 requests)"
    assert speedup_text(3.3, 3.2, 3.4, 9, "above the physical bound").startswith("above the physical bound (3.30x)")
    assert speedup_text(1.27, 1.02, 1.59, 5, "measured", apart=True).startswith("not measured (timed apart")
    measured = pd.DataFrame([dict(arm="a", category="qa", requests=5, speedup=1.27, lo=1.02, hi=1.59,
                                  verdict="not measured reliably")])
    assert _speedup_cell(SimpleNamespace(arm="a", category="qa"), measured) == "1.27x [1.02, 1.59] (5 requests)"
