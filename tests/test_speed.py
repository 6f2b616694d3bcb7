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
    policy: dict | None = None


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
    assert (timings.loc[timings["arm"] != "ar", "draft_calls"] == 3).all()  # the drafter ran in every round
    assert (timings.loc[timings["arm"] == "ar", "draft_calls"] == 0).all()  # the reference (AR) drafts nothing
    assert timings.loc[(timings["arm"] == "x") & (timings["request_id"] == "q2"), "matches_reference"].item() is False
    assert timings.loc[timings["arm"] != "x", "matches_reference"].all()
    with pytest.raises(ValueError, match="reference arm"):
        time_arms(tasks, {"x": arms["x"]}, lambda task: [0], max_new_tokens=2, reference="ar")


def test_draft_calls_leave_out_the_prefill_and_the_rounds_a_policy_declined():
    """What the oracle comparison of ``bench/policy.py policy`` prices a law policy's rounds with: the drafter's cost is
    paid in every round after the prefill, except where the policy decided not to draft before the drafter ran."""
    from entropy_law.jobs.speed import draft_calls

    rounds = [FakeRound(0, 0), FakeRound(1, 3), FakeRound(2, 0, {"draft": False}), FakeRound(3, 5, {"draft": True}),
              FakeRound(4, 0, {"draft": True})]  # the last: drafted, the plan verified nothing (the cost was paid)
    assert draft_calls(rounds) == 3
    assert draft_calls(None) == 0 and draft_calls([FakeRound(0, 0)]) == 0


def test_decoder_arms_and_the_bench_progress_lines(capsys):
    """``decoder_arm`` (the benches' arms) times our decoders through ``time_arms``: their tokens and round
    records; ``print_progress`` writes one line per prompt on stderr and yields every task."""
    from conftest import tiny_llama

    from entropy_law.decoding.decoder import ARDecoder
    from entropy_law.jobs.speed import decoder_arm, print_progress

    model = tiny_llama(seed=0, vocab=50)
    tokens, rounds = decoder_arm(ARDecoder(model))([3, 4, 5], 6)
    assert tokens == ARDecoder(model).generate([3, 4, 5], max_new_tokens=6).token_ids and len(tokens) == 6
    assert len(rounds) == 6  # the prefill round, then one per token
    tasks = [FakeTask("q1", "qa"), FakeTask("q2", "rag")]
    for task in tasks:
        task.question_id = task.request_id[1:]
    timings = time_arms(tasks, {"ar": decoder_arm(ARDecoder(model)), "again": decoder_arm(ARDecoder(model))},
                        lambda task: [3, int(task.question_id)], max_new_tokens=4, reference="ar",
                        progress=print_progress)
    assert timings["matches_reference"].all() and (timings["rounds"] == 3).all()
    assert capsys.readouterr().err.splitlines() == ["[1/2] qa                    1", "[2/2] rag                   2"]


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
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.analysis.simulate import SimCosts, TreeSpec, simulate_traces

    impossible = SimCosts(ar_ms=40.0, draft_ms=1.0, verify_base=0.2, verify_per_node=0.0, overhead_ms=0.5)
    traces = simulate_traces(seed=3, n_requests_per_category=6, categories=["qa", "rag"], block_size=4,
                             tree=TreeSpec(depth=3, nodes=6), include_ar=True, tokens_per_request=(40, 60),
                             costs=impossible)
    an = TraceAnalysis(traces, n_boot=2)  # the bootstrap only widens the law's intervals: not read here
    with pytest.warns(UserWarning):  # few requests: the law's intervals warn
        summary = terminal_summary(an)
    assert "above the physical bound" in summary and "not a result" in summary
    assert "(the reference)" in summary
    assert summary.startswith("When drafting pays")  # the answer first (#17 item 4)
    measured = pd.DataFrame([dict(arm="sim-block chain", category="qa", requests=6, speedup=1.3, lo=1.2, hi=1.4,
                                  tokens_per_round=2.0, bound=1.6, within_bound=True, reliable=True, mismatches=0,
                                  verdict="measured")])
    summary = terminal_summary(an, measured)  # the same analysis (cached fits): the warnings were checked above
    assert "1.30x [1.20, 1.40] (6 requests)" in summary and "not measured" in summary


# -- #17: one speedup source (the traces' CPU clock), one verdict, bad input said plainly --------------------

def _sim(seed=7, per_category=6, **kw):
    from entropy_law.analysis.simulate import simulate_traces

    return simulate_traces(seed=seed, n_requests_per_category=per_category, categories=["qa", "rag"], block_size=5,
                           include_ar=True, tokens_per_request=(50, 70), **kw)


def _analysis(traces, **kw):
    import warnings

    from entropy_law.analysis import TraceAnalysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few requests: SmallSampleWarning (tested elsewhere)
        # 2 law-bootstrap replicates: the speedups' own intervals (SPEEDUP_BOOT) do not depend on n_boot
        return TraceAnalysis(traces, n_boot=kw.pop("n_boot", 2), **kw)


def test_the_recorder_writes_the_cpu_clock_and_older_runs_read_it_as_null(tmp_path):
    from entropy_law.traces.reader import load_traces
    from entropy_law.traces.recorder import TraceRecorder
    from entropy_law.traces.schema import ADDED_COLUMNS

    assert "decode_cpu_ms" in ADDED_COLUMNS["requests"]
    stats = {"entropy_nats": [0.5], "renyi2_nats": [0.4], "top1_prob": [0.8], "top2_prob": [0.1], "logit_gap": [2.0]}
    with TraceRecorder(tmp_path / "run", model_id="m", drafter_id="ngram", tree_policy="chain") as rec:
        for rid, cpu in (("a", 12.5), ("b", None)):
            rec.begin_request(rid, category="qa")
            rec.log_round(rid, round_index=0, start_position=0, context_len=3, block_size=1, tree_nodes=0,
                          tree_depth=0, accepted=0, token_ids=[5], ends_at_leaf=True, target_stats=stats)
            rec.end_request(rid, new_tokens=1, stop_reason="eos", prefill_ms=1.0, decode_ms=20.0, decode_cpu_ms=cpu)
        with pytest.raises(ValueError, match="decode_cpu_ms"):
            rec.begin_request("c", category="qa")
            rec.log_round("c", round_index=0, start_position=0, context_len=3, block_size=1, tree_nodes=0,
                          tree_depth=0, accepted=0, token_ids=[5], ends_at_leaf=True, target_stats=stats)
            rec.end_request("c", new_tokens=1, stop_reason="eos", decode_cpu_ms=-1.0)
        rec.end_request("c", new_tokens=1, stop_reason="eos")
    req = load_traces(tmp_path / "run").requests.set_index("request_id")
    assert req.loc["a", "decode_cpu_ms"] == pytest.approx(12.5) and pd.isna(req.loc["b", "decode_cpu_ms"])


def test_the_traces_speedup_uses_the_cpu_clock_when_every_pair_has_it():
    traces = _sim()
    wall = _analysis(traces).speedup("sim-block chain").set_index("category")
    assert set(wall["clock"]) == {"wall"}
    req = traces.requests
    ar = req["run_id"] == "sim-ar"
    cpu_ms = np.where(ar, req["decode_ms"] * 0.5, req["decode_ms"] * 0.8)  # AR 0.5 x wall, the arm 0.8 x wall
    traces.requests = req.assign(decode_cpu_ms=cpu_ms)
    cpu = _analysis(traces).speedup("sim-block chain").set_index("category")
    assert set(cpu["clock"]) == {"cpu"}
    assert cpu["speedup"].to_numpy() == pytest.approx(wall["speedup"].to_numpy() * 0.5 / 0.8)
    # one request of the arm without its CPU time: the whole comparison falls back to the wall clock
    traces.requests.loc[~ar.to_numpy(), "decode_cpu_ms"] = traces.requests.loc[~ar.to_numpy(), "decode_cpu_ms"].where(
        traces.requests.loc[~ar.to_numpy(), "request_id"] != traces.requests["request_id"].iloc[0])
    assert set(_analysis(traces).speedup("sim-block chain")["clock"]) == {"wall"}


def test_the_traces_speedup_gets_the_same_verdict_as_the_speed_routine():
    """``TraceAnalysis.speedup`` applies ``jobs.speed``'s rule: bound, interval width, paired requests."""
    from entropy_law.payoff.cost import speed_verdict
    from entropy_law.analysis.simulate import SimCosts

    impossible = SimCosts(ar_ms=40.0, draft_ms=1.0, verify_base=0.2, verify_per_node=0.0, overhead_ms=0.5)
    fast = _analysis(_sim(costs=impossible)).speedup("sim-block chain")
    assert (fast["speedup"] > fast["tokens_per_round"] * 1.05).all()
    assert set(fast["verdict"]) == {"above the physical bound"}
    few = _analysis(_sim(per_category=3)).speedup("sim-block chain")
    assert set(few["verdict"]) == {"not measured reliably"}  # 3 paired prompts < 5, whatever the interval
    enough = _analysis(_sim(per_category=6)).speedup("sim-block chain")
    for r in enough.to_dict("records"):
        assert r["lo"] < r["speedup"] < r["hi"] and r["speedup"] < r["bound"]
        assert r["verdict"] == speed_verdict(r["speedup"], r["lo"], r["hi"], r["bound"], r["requests"])
    assert speed_verdict(1.5, 1.45, 1.55, 3.0, 5) == "measured"
    assert speed_verdict(1.5, 1.2, 1.55, 3.0, 5) == "not measured reliably"
    assert speed_verdict(3.3, 3.2, 3.4, 3.0, 5) == "above the physical bound"


def _forget_speedups(an):
    """Drop the cached analyses that read the per-request speedups (the crossing, the workload's measured line),
    keeping those that do not (the law, the cost model, ``pays``' bootstrap): as a fresh cache would give."""
    for key in [k for k in an._cache if k[0] in ("crossing", "workload")]:
        del an._cache[key]


def test_the_crossing_of_measured_speedups_is_found_where_it_is():
    """A logistic fit of "speedup > 1" on the request's mean entropy crosses 0.5 where the data cross 1."""
    an = _analysis(_sim(per_category=10))
    rng = np.random.default_rng(0)
    h = rng.uniform(0.2, 2.0, 200)
    fake = pd.DataFrame({"mean_entropy_nats": h, "speedup": 1 + 0.6 * (1.1 - h) + 0.15 * rng.standard_normal(200)})
    fake.attrs["clock"] = "cpu"
    an.request_speedups = lambda arm: fake
    got = an.speedup_crossing("sim-block chain")
    assert got["crossing_nats"] == pytest.approx(1.1, abs=0.1) and got["slope"] < 0
    assert got["inside"] == (got["breakeven_low"] <= got["crossing_nats"] <= got["breakeven_high"])
    _forget_speedups(an)
    an.request_speedups = lambda arm: fake.assign(speedup=2.0)
    got = an.speedup_crossing("sim-block chain")
    assert np.isnan(got["crossing_nats"]) and "every request above 1" in got["reason"] and got["inside"] is None
    # a crossing the fit places beyond every request's mean entropy is said to be extrapolated
    from entropy_law.jobs.report import crossing_sentence

    _forget_speedups(an)
    h2 = rng.uniform(0.2, 2.0, 1000)  # P(speedup > 1) = 0.5 at 3.5 nats: beyond every request's entropy
    above = rng.uniform(size=1000) < 1 / (1 + np.exp(-1.5 * (3.5 - h2)))
    mostly_above = pd.DataFrame({"mean_entropy_nats": h2, "speedup": np.where(above, 1.2, 0.9)})
    mostly_above.attrs["clock"] = "cpu"
    an.request_speedups = lambda arm: mostly_above
    got = an.speedup_crossing("sim-block chain")
    assert got["crossing_nats"] > h2.max() and "outside the observed mean entropies" in got["reason"]
    assert "extrapolated" in crossing_sentence(got)
    inside = dict(got, crossing_nats=1.1, reason="")
    assert "extrapolated" not in crossing_sentence(inside)


def test_an_arm_timed_apart_from_its_ar_run_has_no_measured_speedup():
    """Runs recorded hours apart (or one resumed over a day while the other took minutes) were timed under
    different loads: their ratio is "not measured reliably", whatever its interval, and the notes say why."""
    traces = _sim(per_category=6)
    assert _analysis(traces).timed_together("sim-block chain")[0] is None  # simulations do not say when they ran
    is_ar = traces.runs["drafter_id"].astype(str).isin(["none", "ar"]) | (traces.runs["tree_policy"] == "none")
    assert is_ar.sum() == 1
    together = traces.runs.assign(start_time="2026-11-29T20:00:00+00:00", end_time="2026-11-29T20:30:00+00:00")
    traces.runs = together
    an = _analysis(traces)
    assert an.timed_together("sim-block chain")[0] is True
    fair = an.speedup("sim-block chain")
    assert (fair["timed_together"] == True).all() and "measured" in set(fair["verdict"])  # noqa: E712
    apart = together.copy()
    apart.loc[is_ar.to_numpy(), ["start_time", "end_time"]] = ["2026-11-29T22:19:00+00:00", "2026-11-29T22:21:00+00:00"]
    apart.loc[~is_ar.to_numpy(), "end_time"] = "2026-11-30T14:20:00+00:00"  # resumed the next day
    traces.runs = apart
    an = _analysis(traces)
    together_flag, why = an.timed_together("sim-block chain")
    assert together_flag is False and "timed apart" in why
    got = an.speedup("sim-block chain")
    assert (got["timed_together"] == False).all() and set(got["verdict"]) == {"not measured reliably"}  # noqa: E712
    assert np.allclose(got["speedup"], fair["speedup"])  # the number is kept, its verdict is not a result
    assert any("timed apart" in n for n in an.measured_speedups().attrs["notes"])
    from entropy_law.jobs.report import answer_lines

    head = next(line for line in answer_lines(an) if line.startswith("sim-block chain: drafting"))
    assert "priced with an AR cost timed apart from this arm: not measured reliably" in head


def test_bad_input_no_timings_no_ar_and_another_machine():
    import warnings

    traces = _sim()
    # replayed arm: no timings
    replayed = _sim()
    replayed.runs = replayed.runs.assign(replayed=replayed.runs["run_id"] != "sim-ar")
    check = _analysis(replayed).speedup_validation()
    assert set(check["status"]) == {"no timings: predicted only"} and check["measured"].isna().all()
    assert check["predicted_tokens_per_round"].notna().all()
    # no AR arm (t_AR given: predicted only, said so)
    keep = traces.runs["run_id"] != "sim-ar"
    no_ar = _sim()
    no_ar.runs = no_ar.runs.loc[keep].reset_index(drop=True)
    for name in ("tokens", "rounds", "requests"):
        frame = getattr(no_ar, name)
        setattr(no_ar, name, frame.loc[frame["run_id"] != "sim-ar"].reset_index(drop=True))
    check = _analysis(no_ar, ar_ms_per_token=40.0).speedup_validation()
    assert set(check["status"]) == {"no AR arm: predicted only"} and check["predicted"].notna().all()
    # a cost measured on another machine: a warning naming both
    other = _sim()
    other.runs = other.runs.assign(cpu_count=np.where(other.runs["run_id"] == "sim-ar", 16, 2))
    an = _analysis(other)
    assert an.machine_warnings("sim-block chain") == [
        "sim-block chain: cost measurements from another machine: the arm's runs record cpu_count 2, the AR runs 16; "
        "predictions mix the two"]
    with pytest.warns(UserWarning, match="another machine"):
        an.pays("sim-block chain")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert _analysis(traces).machine_warnings("sim-block chain") == []


def test_the_interval_of_few_requests_is_widened_to_student_t_and_covers():
    """Two requests: the percentile bootstrap's ends are the two single-request ratios (the demo's two runs on
    the same prompts gave disjoint intervals, bench/speed.py demo-repeat); the interval is the t interval, computed here
    by hand: jackknife SE of log S over the requests, t with 1 degree of freedom."""
    from scipy import stats

    from entropy_law.payoff.cost import paired_speedup_interval

    rng = np.random.default_rng(0)
    ref_t, arm_t = np.array([2.0, 3.0]), np.array([1.6, 2.7])
    ref_n = arm_n = np.array([64.0, 64.0])
    lo, hi = paired_speedup_interval(ref_t, ref_n, arm_t, arm_n, rng=rng)
    estimate = 5.0 / 4.3
    jack = np.log([3.0 / 2.7, 2.0 / 1.6])  # leave request 0 out, leave request 1 out
    se = np.sqrt(0.5 * np.sum((jack - jack.mean()) ** 2))
    half = stats.t.ppf(0.975, 1) * se
    assert (lo, hi) == pytest.approx((estimate * np.exp(-half), estimate * np.exp(half)))
    assert lo < 2.0 / 1.6 * 0.5 and hi > 3.0 / 2.7 * 1.5  # far wider than the two single-request ratios
    assert paired_speedup_interval(ref_t[:1], ref_n[:1], arm_t[:1], arm_n[:1], rng=rng) == pytest.approx(
        (np.nan, np.nan), nan_ok=True)

    # coverage of the true ratio over many simulated small samples (the bootstrap alone misses it far more often)
    truth, covered, boot_covered, trials = 1.25, 0, 0, 300
    for n in (2, 3, 5):
        for _ in range(trials):
            base = rng.uniform(2.0, 4.0, n)
            ref = base * (1 + rng.normal(0, 0.08, n))
            arm = base / truth * (1 + rng.normal(0, 0.08, n))
            tokens = np.full(n, 64.0)
            lo, hi = paired_speedup_interval(ref, tokens, arm, tokens, rng=rng, n_boot=400)
            covered += lo <= truth <= hi
            draws = rng.integers(0, n, size=(400, n))
            boot = ref[draws].sum(1) / arm[draws].sum(1)
            b_lo, b_hi = np.percentile(boot, [2.5, 97.5])
            boot_covered += b_lo <= truth <= b_hi
    assert covered / (3 * trials) >= 0.92
    assert boot_covered / (3 * trials) < 0.85


def test_with_many_requests_the_interval_is_the_bootstrap_s():
    from entropy_law.payoff.cost import paired_speedup_interval

    rng = np.random.default_rng(3)
    base = rng.uniform(2.0, 4.0, 200)
    ref, arm, tokens = base * (1 + rng.normal(0, 0.05, 200)), base / 1.3 * (1 + rng.normal(0, 0.05, 200)), np.full(
        200, 64.0)
    lo, hi = paired_speedup_interval(ref, tokens, arm, tokens, rng=np.random.default_rng(1))
    draws = np.random.default_rng(1).integers(0, 200, size=(2000, 200))
    b_lo, b_hi = np.percentile(ref[draws].sum(1) / arm[draws].sum(1), [2.5, 97.5])
    assert (lo, hi) == pytest.approx((b_lo, b_hi), rel=0.02)
    assert lo < 1.3 < hi


def test_the_aa_noise_bench_helpers():
    """bench/speed.py aa-noise: the per-request log ratio pairs each request with itself, and the half-width of a
    category mean is the t interval's."""
    import importlib.util
    from pathlib import Path

    from scipy import stats

    path = Path(__file__).resolve().parents[1] / "bench" / "speed.py"
    spec = importlib.util.spec_from_file_location("aa_noise", path)
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    timings = pd.DataFrame({"arm": ["AR", "AR", "AR again", "AR again"], "request_id": ["a", "b", "b", "a"],
                            "cpu_s": [2.0, 3.0, 3.3, 1.0], "new_tokens": [10, 10, 11, 10]})
    got = aa.log_ratios(timings, "cpu_s")  # a: (2/10)/(1/10), b: (3/10)/(3.3/11)
    np.testing.assert_allclose(got, [np.log(2.0), np.log(0.3 / 0.3)], atol=1e-12)
    assert aa.half_width(0.1, 5) == pytest.approx(np.expm1(stats.t.ppf(0.975, 4) * 0.1 / np.sqrt(5)))


def test_a_small_category_whose_requests_happen_to_agree_gets_the_pooled_spread():
    """Two requests of one category with nearly the same ratio gave an interval of a few percent (a 1-df
    estimate of the spread); below 5 requests the interval is widened to the spread of the arm's per-request
    ratios pooled over its categories (payoff.cost.pooled_log_speedup_sd); from 5 requests on it is the
    category's own."""
    from scipy import stats

    from entropy_law.payoff.cost import paired_speedup_interval, pooled_log_speedup_sd

    ref_t = np.array([1.00, 1.01, 1.0, 1.3, 0.8, 1.1, 0.9])
    arm_t = np.array([0.80, 0.81, 0.8, 0.8, 0.8, 0.8, 0.8])
    tokens = np.full(7, 100.0)
    groups = ["a", "a", "b", "b", "b", "b", "b"]
    x = np.log(ref_t / arm_t)
    resid = np.r_[x[:2] - x[:2].mean(), x[2:] - x[2:].mean()]
    sd, df = pooled_log_speedup_sd(ref_t, tokens, arm_t, tokens, groups)
    assert df == 5 and sd == pytest.approx(np.sqrt((resid ** 2).sum() / 5))
    rng = np.random.default_rng(0)
    own = paired_speedup_interval(ref_t[:2], tokens[:2], arm_t[:2], tokens[:2], rng=rng)
    wide = paired_speedup_interval(ref_t[:2], tokens[:2], arm_t[:2], tokens[:2], rng=rng, pooled=(sd, df))
    s = ref_t[:2].sum() / arm_t[:2].sum()
    half = stats.t.ppf(0.975, 5) * sd / np.sqrt(2)
    assert wide == pytest.approx((s * np.exp(-half), s * np.exp(half)))
    assert wide[0] < own[0] and wide[1] > own[1]
    # five requests: the category's own interval, the pooled spread not used
    b = slice(2, 7)
    own5 = paired_speedup_interval(ref_t[b], tokens[b], arm_t[b], tokens[b], rng=np.random.default_rng(1))
    with5 = paired_speedup_interval(ref_t[b], tokens[b], arm_t[b], tokens[b], rng=np.random.default_rng(1),
                                    pooled=(1.0, 5))
    assert with5 == own5
    assert pooled_log_speedup_sd(ref_t[:2], tokens[:2], arm_t[:2], tokens[:2], ["a", "b"]) == (pytest.approx(np.nan,
                                                                                              nan_ok=True), 0)


def test_paired_speedups_widen_a_two_request_category_to_the_pooled_spread():
    timings = _timings(np.random.default_rng(3), 0.8, n_requests=12, noise=0.08)
    extra = timings.iloc[:4].copy()  # a third category of two requests whose ratios agree to 0.1%
    extra["request_id"] = ["x0", "x0", "x1", "x1"]
    extra["category"] = "tiny"
    extra["cpu_s"] = [1.0, 0.8, 1.0, 0.8008]
    speed = paired_speedups(pd.concat([timings, extra], ignore_index=True), reference="ar", seed=0)
    tiny = speed.loc[speed["category"] == "tiny"].iloc[0]
    assert tiny["hi"] / tiny["lo"] > 1.05  # not the 0.1% its two requests alone would claim
    assert tiny["verdict"] == "not measured reliably"
