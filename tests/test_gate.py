"""The drafting gate: verify-cost curve, best-prefix rule (brute force), measurement on a tiny model."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.gate import DEFAULT_COST_SIZES, CostGate, VerifyCost, measure_verify_cost, plan_verification
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import build_tree, expected_accepted, node_logprobs
from conftest import tiny_llama


def test_verify_cost_interpolates_normalises_and_extrapolates():
    cost = VerifyCost((1, 3, 5), (2.0, 3.0, 5.0))  # normalised: c(1) = 1, c(3) = 1.5, c(5) = 2.5
    assert cost(1) == 1.0
    assert cost(2) == pytest.approx(1.25)
    assert cost(4) == pytest.approx(2.0)
    assert cost(7) == pytest.approx(3.5)  # the last segment's slope continues
    assert VerifyCost((1,), (3.0,))(9) == 1.0
    assert VerifyCost.from_config(cost.to_config()) == cost
    with pytest.raises(ValueError, match="start at 1"):
        VerifyCost((2, 3), (1.0, 2.0))
    with pytest.raises(ValueError, match="finite and > 0"):
        VerifyCost((1, 2), (1.0, float("nan")))
    with pytest.raises(ValueError, match="as many costs"):
        VerifyCost((1, 2), (1.0,))
    with pytest.raises(ValueError, match="at least 1 token"):
        cost(0)
    with pytest.raises(ValueError, match="'sizes' and 'costs'"):
        VerifyCost.from_config({"sizes": [1]})


def _proposal(probs_per_depth):
    """A proposal whose per-depth candidates have the given probabilities (best first)."""
    width = max(len(row) for row in probs_per_depth)
    tokens = torch.zeros(len(probs_per_depth), width, dtype=torch.long)
    logprobs = torch.full((len(probs_per_depth), width), -math.inf)
    for d, row in enumerate(probs_per_depth):
        tokens[d] = torch.arange(width) + 10 * d
        logprobs[d, :len(row)] = torch.log(torch.tensor(row))
    return DraftProposal(tokens=tokens, logprobs=logprobs)


probs_strategy = st.lists(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=3).map(lambda r: sorted(r, reverse=True)),
                          min_size=1, max_size=6)
cost_strategy = st.lists(st.floats(0.0, 0.5), min_size=1, max_size=5).map(
    lambda steps: VerifyCost(tuple(range(1, len(steps) + 2)), tuple([1.0] + [1.0 + sum(steps[:i + 1]) for i in range(len(steps))])))


@settings(max_examples=150, deadline=None)
@given(probs=probs_strategy, cost=cost_strategy, policy=st.sampled_from(["chain", "ddtree"]),
       floor=st.sampled_from([0.0, 0.5]))
def test_best_prefix_maximises_expected_tokens_per_cost(probs, cost, policy, floor):
    proposal = _proposal(probs)
    tree = build_tree(proposal, policy, 6 if policy == "ddtree" else None)
    chosen, expected = plan_verification(proposal, tree, verify_cost=cost, min_expected_accepted=floor)
    node_probs = [math.exp(s) for s in node_logprobs(proposal, tree)]
    rates = [1.0] + [(1 + sum(node_probs[:k])) / cost(k + 1) for k in range(1, tree.n_nodes + 1)]
    allowed = [0] + [k for k in range(1, tree.n_nodes + 1) if sum(node_probs[:k]) >= floor]
    best = max(rates[k] for k in allowed)
    assert rates[chosen.n_nodes] == pytest.approx(best, rel=1e-9)
    assert chosen == tree.prefix(chosen.n_nodes)  # a prefix of the drafted tree
    if chosen.n_nodes:
        assert expected == pytest.approx(expected_accepted(proposal, chosen))
    else:
        assert expected == pytest.approx(expected_accepted(proposal, tree))


def test_constant_cost_reduces_to_the_ratio_gate():
    proposal = _proposal([[0.9], [0.5], [0.3]])  # E = 0.9 + 0.45 + 0.135 = 1.485
    tree = build_tree(proposal, "chain", None)
    for ratio, drafts in ((2.0, True), (2.6, False)):
        flat = VerifyCost((1, 2, 3), (1.0, ratio, ratio))
        by_cost, _ = plan_verification(proposal, tree, verify_cost=flat, min_expected_accepted=0.0)
        by_ratio, _ = plan_verification(proposal, tree, verify_cost=None, min_expected_accepted=ratio - 1)
        assert by_cost == by_ratio
        assert (by_cost.n_nodes == tree.n_nodes) is drafts
        assert by_cost.n_nodes in (0, tree.n_nodes)


def test_measure_verify_cost_on_a_tiny_model():
    adapter = TargetAdapter(tiny_llama(0, vocab=64, max_positions=256))
    cost = measure_verify_cost(adapter, sizes=(1, 2, 8, 32), context_len=64, repeats=2)
    assert cost.sizes == (1, 2, 8, 32)
    assert cost.costs[0] == 1.0 and all(c > 0 for c in cost.costs)
    assert adapter.cache is None
    short = measure_verify_cost(TargetAdapter(tiny_llama(0, vocab=64, max_positions=24)), sizes=(1, 4, 12, 16),
                                context_len=384, repeats=1)
    assert short.sizes == (1, 4, 12)  # sizes up to half the context, at a context that fits


def test_a_bigger_verify_that_costs_less_is_measured_so(monkeypatch):
    """A CPU's forward cost need not grow with the tokens (kernel shapes: on the machine of 2026-12-06 a 3-token
    verify cost 2.0 one-token forwards, a 4-token one 1.4). The curve keeps each size's own timing, so the gate
    and the policy can take the cheaper, bigger verify; a cumulative maximum would price 4 tokens at 3's cost."""
    adapter = TargetAdapter(tiny_llama(0, vocab=64, max_positions=256))
    verify = adapter.verify
    work = {1: 1, 2: 4, 3: 2}  # extra CPU work per tree size (root + nodes), in units of a busy loop

    def shaped(root, tree, context_len):
        out = verify(root, tree, context_len)
        x = 0
        for _ in range(200_000 * work[tree.n_nodes + 1]):  # CPU time on this thread: every clock sees it
            x += 1
        return out

    monkeypatch.setattr(adapter, "verify", shaped)
    cost = measure_verify_cost(adapter, sizes=(1, 2, 3), context_len=16, repeats=2, clock="cpu")
    assert cost(2) > cost(3) > 1.0  # as timed, not made non-decreasing
    assert cost(2) / cost(3) == pytest.approx(4 / 2, rel=0.35)
    assert DEFAULT_COST_SIZES[:17] == tuple(range(1, 18))  # every size a DDTree16 verifies, none interpolated


def test_the_cpu_clock_ignores_time_the_process_does_not_run(monkeypatch):
    """Time another process holds the core is not the forward's cost: a one-token verify that waits (sleeps,
    using no CPU) inflates c(1) on the wall clock, so every larger verify looks free, and not on the calling
    thread's CPU clock (which the process's other threads do not move either)."""
    import time

    adapter = TargetAdapter(tiny_llama(0, vocab=64, max_positions=640))
    verify = adapter.verify

    def delayed(root, tree, context_len):
        out = verify(root, tree, context_len)
        if tree.n_nodes == 0:  # after the forward, inside the timed call: a forward woken from a sleep runs with
            time.sleep(0.2)  # cold caches (c(512) read 1.7-1.9 in 1 of 4 runs when the sleep came first)
        return out  # another process runs meanwhile: wall time passes, this process's CPU time does not

    monkeypatch.setattr(adapter, "verify", delayed)
    options = dict(sizes=(1, 2, 512), context_len=64, repeats=3)  # 512 tokens: compute, not call overhead
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the forward on this thread alone, so that auto picks the CPU clock
    try:
        wall = measure_verify_cost(adapter, clock="wall", **options)
        cpu = measure_verify_cost(adapter, clock="cpu", **options)
        auto = measure_verify_cost(adapter, **options)
    finally:
        torch.set_num_threads(threads)
    assert wall.clock == "wall" and cpu.clock == "cpu"
    assert wall.costs[0] == 1.0 and max(wall.costs[1:]) < 1.0  # every tree looks cheaper than a step
    # a 512-token forward of the tiny model costs several one-token ones on its CPU clock (8.6-13 with two busy
    # loops on the cores and a busy thread in the process; about 10 idle)
    assert cpu(512) > 2.0
    assert auto.clock == "cpu"  # auto: a model on the CPU, one torch thread
    assert VerifyCost.from_config(cpu.to_config()).clock == "cpu" and "clock" not in VerifyCost((1,), (1.0,)).to_config()
    with pytest.raises(ValueError, match="clock must be one of"):
        measure_verify_cost(adapter, clock="gpu", **options)


def test_the_automatic_clock_is_the_wall_clock_for_a_model_off_the_cpu():
    """A model on an accelerator is waited on, not computed by this thread, and with several torch threads this
    thread computes only a share: ``clock="auto"`` times both by the wall clock (a model on the meta device stands
    in for one off the CPU)."""
    import time
    from types import SimpleNamespace

    from entropy_law.decoding.gate import timer_for

    on_cpu = SimpleNamespace(model=torch.nn.Linear(2, 2))
    off_cpu = SimpleNamespace(model=torch.nn.Linear(2, 2, device="meta"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert timer_for(on_cpu, "auto") == (time.thread_time, "cpu")
        assert timer_for(off_cpu, "auto") == (time.perf_counter, "wall")
        assert timer_for(off_cpu, "cpu") == (time.thread_time, "cpu")
        torch.set_num_threads(2)  # this thread's CPU time would be only its share of the forward
        assert timer_for(on_cpu, "auto") == (time.perf_counter, "wall")
    finally:
        torch.set_num_threads(threads)


def test_a_drafters_cost_is_its_compute_per_call_in_target_steps():
    """``measure_draft_cost``: a drafter that computes for a while per call costs several one-token steps of the
    tiny target, one that only waits (sleeps, as while another process holds the core) costs next to nothing on
    the CPU clock, and timing leaves the drafter and the output as they were (lossless)."""
    import time

    from entropy_law.decoding.decoder import ARDecoder, measure_draft_cost
    from entropy_law.drafters.ngram import NgramDrafter

    class Slow(NgramDrafter):
        def __init__(self, work):
            super().__init__()
            self.work, self.calls = work, 0

        def propose(self, tokens, new_features):
            self.calls += 1
            self.work()
            return super().propose(tokens, new_features)

    def compute():  # pure Python work: a few ms, all on this thread
        sum(i * i for i in range(150_000))

    target = tiny_llama(0, vocab=64, max_positions=256)
    prompt = [5, 9, 2, 7, 5, 9, 2, 7, 5, 9]
    options = dict(max_new_tokens=12, repeats=2, clock="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        busy, idle, plain = Slow(compute), Slow(lambda: time.sleep(0.01)), NgramDrafter()
        busy_cost = measure_draft_cost(target, busy, prompt, **options)
        idle_cost = measure_draft_cost(target, idle, prompt, **options)
        plain_cost = measure_draft_cost(target, plain, prompt, **options)
    finally:
        torch.set_num_threads(threads)
    # compute() costs about 8 one-token steps of the tiny model (3.1 at 60 000 squares, 2026-12-06), prompt lookup ~0.03
    assert busy_cost > 2.0 and busy_cost > 10 * plain_cost, (busy_cost, plain_cost)
    assert idle_cost < 0.5 * busy_cost, (idle_cost, busy_cost)  # 10 ms of sleep per call is not compute
    assert busy.calls >= 3 and "propose" not in vars(busy)  # it drafted in every pass; the drafter untouched
    from entropy_law.decoding.decoder import SpeculativeDecoder
    assert (SpeculativeDecoder(target, busy).generate(prompt, max_new_tokens=12).token_ids
            == ARDecoder(target).generate(prompt, max_new_tokens=12).token_ids)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_draft_cost(target, plain, prompt, repeats=0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 2"):
        measure_draft_cost(target, plain, prompt, max_new_tokens=1)


def test_decoder_measures_when_asked_and_records_the_curve():
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.drafters.ngram import NgramDrafter

    model = tiny_llama(0, vocab=64, max_positions=512)
    decoder = SpeculativeDecoder(model, NgramDrafter(), policy=CostGate("measure"))
    assert isinstance(decoder.verify_cost, VerifyCost)
    assert decoder.config["verify_cost"]["sizes"][0] == 1
    assert decoder.min_expected_accepted == 0.0
    with pytest.raises(ValueError, match="'measure' or None"):
        SpeculativeDecoder(model, NgramDrafter(), policy=CostGate("fast"))


def test_a_curve_describes_its_measured_points():
    from entropy_law.decoding.gate import VerifyCost

    assert VerifyCost((1, 2, 16), (2.0, 3.0, 4.9)).describe() == "1: 1.00, 2: 1.50, 16: 2.45"
