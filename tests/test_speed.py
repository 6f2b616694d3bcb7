"""The speed routine (``entropy_law.jobs.speed``): warm-up, rotating interleaved order, paired ratios with
request-bootstrap intervals, the physical bound and the reliability verdict."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from entropy_law.jobs.speed import format_speedup, paired_speedups, time_arms


@dataclass
class FakeTask:
    request_id: str
    category: str


@dataclass
class FakeRound:
    round_index: int
    tree_nodes: int


def test_time_arms_warms_up_rotates_the_order_and_checks_outputs():
    calls = []

    def arm(name, wrong_on=None):
        def run(prompt, max_new_tokens):
            calls.append((name, prompt[0], max_new_tokens))
            tokens = [prompt[0]] * max_new_tokens
            if wrong_on == prompt[0]:
                tokens[-1] += 1
            return tokens, [FakeRound(0, 0)] + [FakeRound(i, 3) for i in range(1, 4)]
        return run

    tasks = [FakeTask(f"q{i}", "qa" if i % 2 else "rag") for i in range(3)]
    arms = {"ar": arm("ar"), "x": arm("x", wrong_on=2), "y": arm("y")}
    timings = time_arms(tasks, arms, lambda task: [int(task.request_id[1:])], max_new_tokens=5, reference="ar",
                        warm_up_tokens=2, verify_cost=lambda n: 1.0 + 0.1 * (n - 1))
    assert calls[:3] == [("ar", 0, 2), ("x", 0, 2), ("y", 0, 2)]  # the warm-up: every arm, short
    assert [c[0] for c in calls[3:]] == ["ar", "x", "y", "x", "y", "ar", "y", "ar", "x"]  # rotating order
    assert len(timings) == 9 and (timings["new_tokens"] == 5).all() and (timings["rounds"] == 3).all()
    assert timings["verify_cost"].iloc[0] == pytest.approx(3 * 1.3)
    assert timings.loc[(timings["arm"] == "x") & (timings["request_id"] == "q2"), "matches_reference"].item() is False
    assert timings.loc[timings["arm"] != "x", "matches_reference"].all()
    with pytest.raises(ValueError, match="reference arm"):
        time_arms(tasks, {"x": arms["x"]}, lambda task: [0], max_new_tokens=2, reference="ar")


def _timings(rng, arm_time, n_requests=12, tokens=64, rounds=30, cost_per_round=1.5, noise=0.02):
    rows = []
    for i in range(n_requests):
        base = rng.uniform(2.0, 4.0)  # requests differ in length and load; pairing removes that
        for arm, factor in (("ar", 1.0), ("fast", arm_time)):
            t = base * factor * (1 + rng.normal(0, noise))
            rows.append(dict(arm=arm, request_id=f"r{i}", category="qa" if i % 2 else "rag", new_tokens=tokens,
                             cpu_s=t, wall_s=t * 1.1, rounds=rounds if arm == "fast" else tokens - 1,
                             verify_cost=rounds * cost_per_round if arm == "fast" else tokens - 1,
                             matches_reference=True))
    return pd.DataFrame(rows)


def test_paired_speedup_interval_covers_the_true_ratio_and_is_a_result():
    table = paired_speedups(_timings(np.random.default_rng(0), arm_time=0.8), reference="ar")
    overall = table.set_index("category").loc["all"]
    assert overall["speedup"] == pytest.approx(1.25, rel=0.03)
    assert overall["lo"] < 1.25 < overall["hi"] and overall["requests"] == 12
    # tokens per round 63 / 30 = 2.1, mean verify cost 1.5 forwards: bound 1.4
    assert overall["tokens_per_round"] == pytest.approx(2.1) and overall["bound"] == pytest.approx(1.4)
    assert overall["verdict"] == "measured" and format_speedup(overall).startswith("1.2")
    assert set(table["category"]) == {"qa", "rag", "all"}


def test_a_speedup_above_the_physical_bound_is_never_a_result():
    # 2x faster while committing 2.1 tokens per round at 1.5 forwards per round: impossible (bound 1.4)
    table = paired_speedups(_timings(np.random.default_rng(1), arm_time=0.5), reference="ar")
    overall = table.set_index("category").loc["all"]
    assert not overall["within_bound"] and overall["verdict"] == "above the physical bound"
    assert "not a result" in format_speedup(overall)


def test_a_wide_interval_is_not_measured_reliably():
    noisy = _timings(np.random.default_rng(2), arm_time=0.8, n_requests=4, noise=0.4, cost_per_round=1.0)
    overall = paired_speedups(noisy, reference="ar").set_index("category").loc["all"]
    assert not overall["reliable"] and overall["verdict"] == "not measured reliably"
    assert format_speedup(overall).startswith("not measured reliably")
    single = paired_speedups(noisy.loc[noisy["request_id"] == "r0"], reference="ar").iloc[0]
    assert np.isnan(single["lo"]) and single["verdict"] == "not measured reliably"


def test_the_clock_is_chosen_and_checked():
    timings = _timings(np.random.default_rng(3), arm_time=0.8)
    cpu = paired_speedups(timings, reference="ar", clock="cpu").set_index("category").loc["all", "speedup"]
    wall = paired_speedups(timings, reference="ar", clock="wall").set_index("category").loc["all", "speedup"]
    assert cpu == pytest.approx(wall)  # wall = 1.1 x cpu for both arms in this table
    with pytest.raises(ValueError, match="clock"):
        paired_speedups(timings, reference="ar", clock="gpu")


def test_the_summary_never_prints_a_speedup_above_tokens_per_round():
    """#17: a verify pass costs at least one forward, so a speedup above the arm's tokens per round is timing
    noise or a cold reference; the demo's summary flags it instead of printing it as a result."""
    from entropy_law.jobs.report import terminal_summary
    from entropy_law.law.analysis import TraceAnalysis
    from entropy_law.law.simulate import SimCosts, TreeSpec, simulate_traces

    impossible = SimCosts(ar_ms=40.0, draft_ms=1.0, verify_base=0.2, verify_per_node=0.0, overhead_ms=0.5)
    traces = simulate_traces(seed=3, n_requests_per_category=6, categories=["qa", "rag"], block_size=4,
                             tree=TreeSpec(depth=3, nodes=6), include_ar=True, tokens_per_request=(40, 60),
                             costs=impossible)
    with pytest.warns(UserWarning):  # few requests: the law's intervals warn
        summary = terminal_summary(TraceAnalysis(traces, n_boot=5))
    assert "above bound" in summary and "not a result" in summary
    assert "(the reference)" in summary
    measured = pd.DataFrame([dict(arm="sim-block chain", category="qa", requests=6, speedup=1.3, lo=1.2, hi=1.4,
                                  tokens_per_round=2.0, bound=1.6, within_bound=True, reliable=True, mismatches=0,
                                  verdict="measured")])
    with pytest.warns(UserWarning):
        summary = terminal_summary(TraceAnalysis(traces, n_boot=5), measured)
    assert "1.30x [1.20, 1.40] (6 requests)" in summary and "not measured" in summary
