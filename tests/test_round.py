"""The one round (``entropy_law.decoding.round``): its walk, commit and stop rules on hand-made trees, and the
decoder options it brings to both drivers."""

import dataclasses

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import PredicateGate, RatioGate
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.observers import distribution_stats
from entropy_law.decoding.replay import replay_rounds
from entropy_law.decoding.round import RequestState, Round, RoundRules, play_round, prefill_round
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.traces.stats import TARGET_STAT_KEYS, target_stats_from_logits


class ScriptedTarget:
    """A verifier whose correct next tokens are a fixed sequence (as a greedy output would be)."""

    def __init__(self, continuation):
        self.continuation = continuation
        self.kept = []

    def verify(self, state, tree):
        done = len(state.output)  # the continuation's first tokens are the committed output
        return lambda node, depth: self.continuation[done + depth]

    def commit(self, state, kept_nodes):
        self.kept.append(list(kept_nodes))
        return None


def chain(tokens, prob=0.9):
    return DraftProposal(tokens=torch.tensor(tokens).reshape(-1, 1),
                         logprobs=torch.full((len(tokens), 1), float(np.log(prob))))


def test_round_walks_the_tree_commits_the_correction_and_counts_accepted():
    # output so far [10] (pending root); the target continues 11, 12, 99, ...; the chain drafts 11, 12, 13
    state = RequestState(prompt_ids=[1, 2, 3], max_new_tokens=20, output=[10], start=3)
    target = ScriptedTarget([10, 11, 12, 99, 5, 6])
    rules = RoundRules.make("chain", policy=RatioGate(min_expected_accepted=0.0))
    record = play_round(state, rules, lambda tokens: chain([11, 12, 13]), target, timed=False)
    assert record.committed_ids == [11, 12, 99] and record.accepted == 2 and not record.ends_at_leaf
    assert (record.start_position, record.context_len, record.tree_nodes, record.tree_depth) == (1, 3, 3, 3)
    assert record.drafted and record.expected_accepted == pytest.approx(0.9 + 0.81 + 0.729)
    assert target.kept == [[0, 1, 2]]  # the root and the two accepted nodes enter the cache
    assert state.output == [10, 11, 12, 99] and state.start == 6
    assert record.draft_ms == record.verify_ms == record.overhead_ms == 0.0


def test_round_takes_the_bonus_token_at_a_leaf_and_stops_at_eos_and_budget():
    rules = RoundRules.make("chain", eos_token_ids=[12], policy=RatioGate(min_expected_accepted=0.0))
    state = RequestState(prompt_ids=[1], max_new_tokens=20, output=[10], start=1)
    record = play_round(state, rules, lambda tokens: chain([11, 12]), ScriptedTarget([10, 11, 12, 13]),
                        timed=False)
    assert record.committed_ids == [11, 12] and record.accepted == 2  # cut after EOS, no bonus
    assert rules.stop_reason(state) == "eos"
    # EOS inside an accepted path: only the drafts up to it count as accepted
    state = RequestState(prompt_ids=[1], max_new_tokens=20, output=[10], start=1)
    record = play_round(state, rules, lambda tokens: chain([12, 13]), ScriptedTarget([10, 12, 13, 14]), timed=False)
    assert record.committed_ids == [12] and record.accepted == 1 and not record.ends_at_leaf

    rules = RoundRules.make("chain", policy=RatioGate(min_expected_accepted=0.0))
    state = RequestState(prompt_ids=[1], max_new_tokens=20, output=[10], start=1)
    record = play_round(state, rules, lambda tokens: chain([11, 12]), ScriptedTarget([10, 11, 12, 13]),
                        timed=False)
    assert record.committed_ids == [11, 12, 13] and record.accepted == 2 and record.ends_at_leaf

    # a budget of 3 new tokens: the drafts are cut to the usable depth before verifying
    state = RequestState(prompt_ids=[1], max_new_tokens=3, output=[10], start=1)
    record = play_round(state, rules, lambda tokens: chain([11, 12, 13, 14]), ScriptedTarget([10, 11, 12, 13]),
                        timed=False)
    assert record.tree_depth == 1 and record.committed_ids == [11, 12]
    assert rules.stop_reason(state) == "max_new_tokens"


def test_gate_declines_a_weak_draft_and_the_round_is_a_plain_step():
    rules = RoundRules.make("chain", policy=RatioGate(2.0))  # drafts only if E >= 1
    state = RequestState(prompt_ids=[1], max_new_tokens=20, output=[10], start=1)
    record = play_round(state, rules, lambda tokens: chain([11, 12], prob=0.3), ScriptedTarget([10, 11, 12]),
                        timed=False)
    assert not record.drafted and record.tree_nodes == 0 and record.committed_ids == [11]
    assert record.expected_accepted == pytest.approx(0.3 + 0.09)


def test_rules_refuse_bad_trees():
    with pytest.raises(ValueError, match="unknown tree policy"):
        RoundRules.make("bush")
    with pytest.raises(ValueError, match="needs a node budget"):
        RoundRules.make("ddtree")
    with pytest.raises(ValueError, match="budget must be >= 0"):
        RoundRules.make("chain", budget=-1)


def test_round_records_keep_no_tensors_in_results_and_are_frozen():
    state = RequestState(prompt_ids=[1, 2], max_new_tokens=4, output=[7], start=2, request_id="r", block_size=3)
    record = prefill_round(state, torch.zeros(1, 5))
    assert record.prefill and record.committed == 1 and record.context_len == 1 and record.request_id == "r"
    bare = record.bare()
    assert bare.target_logits is None and bare.draft is None and bare == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.accepted = 3
    assert isinstance(record, Round)


def test_should_draft_works_online_and_in_replay_alike():
    """The drifted option: replay had ``should_draft``, the decoder did not. Both drivers now share it."""
    model = tiny_llama(1, vocab=48, init_std=0.05)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    never = lambda proposal, tree: False  # noqa: E731
    ungated = SpeculativeDecoder(model, NgramDrafter(block_size=4), eos_token_ids=[],
                                 policy=RatioGate(min_expected_accepted=0.0)).generate(prompt, max_new_tokens=24)
    assert any(r.drafted for r in ungated.rounds), "the case must draft for the option to matter"
    gated = SpeculativeDecoder(model, NgramDrafter(block_size=4), eos_token_ids=[],
                               policy=PredicateGate(never)).generate(prompt, max_new_tokens=24)
    assert gated.token_ids == ungated.token_ids and not any(r.drafted for r in gated.rounds)
    replayed = replay_rounds(prompt, gated.token_ids, NgramDrafter(block_size=4), should_draft=never,
                             max_new_tokens=24)
    assert [r.committed_ids for r in replayed.rounds] == [r.committed_ids for r in gated.rounds]


def test_the_decoder_takes_one_policy_and_rules_ask_only_it():
    """One decision interface: the gates are round policies, the decoder's constructor has one ``policy`` (no gate
    settings of its own) and at most 8 parameters, and anything that is not a ``RoundPolicy`` is refused."""
    import inspect

    from entropy_law.decoding.gate import CostGate, VerifyCost, make_gate
    from entropy_law.decoding.round import RoundPolicy

    params = [name for name in inspect.signature(SpeculativeDecoder.__init__).parameters if name != "self"]
    assert len(params) <= 8 and "policy" in params
    assert not {"verify_cost_ratio", "min_expected_accepted", "verify_cost", "should_draft"} & set(params)
    fields = {f.name for f in dataclasses.fields(RoundRules)}
    assert fields == {"tree", "budget", "eos_token_ids", "max_context", "policy"}
    curve = VerifyCost((1, 2), (1.0, 1.5))
    assert isinstance(make_gate(), RatioGate) and make_gate().min_expected_accepted == 1.0
    assert isinstance(make_gate(verify_cost=curve), CostGate) and make_gate(verify_cost=curve).min_expected_accepted == 0
    assert isinstance(make_gate(should_draft=lambda p, t: True), PredicateGate)
    members = [name for name in vars(RoundPolicy) if not name.startswith("_")]
    for gate in (RatioGate(), CostGate(curve), PredicateGate(lambda p, t: True)):
        assert all(callable(getattr(gate, name)) for name in members), (gate, members)
    with pytest.raises(TypeError, match="RoundPolicy"):
        RoundRules.make("chain", policy=lambda proposal, tree: True)
    with pytest.raises(ValueError, match="curve the run used"):
        CostGate().bind(None, NgramDrafter())  # replay has no target to time


class SpyPolicy(RatioGate):
    """A ratio gate that keeps a decision per round and logs what the protocol gave it: the workload at the request's
    start, the request's earlier rounds (with this policy's decisions) before drafting, the drafter's confidences
    after."""

    def __init__(self):
        super().__init__(min_expected_accepted=0.0)
        self.log = []

    def begin_request(self, state):
        self.log.append(("begin", state.category, state.dataset, len(state.prompt_ids), state.max_new_tokens))

    def before_draft(self, entropies, n_output, max_depth, history=(), context=None):
        kept = [r.policy["n"] for r in history if r.policy is not None]
        self.log.append(("before", n_output, len(history), kept, list(context[-2:])))
        return {"draft": n_output % 3 != 0, "n": n_output}

    def plan(self, proposal, tree, decision):
        self.log.append(("plan", tuple(proposal.logprobs.shape), tree.n_nodes, decision["n"]))
        return super().plan(proposal, tree, decision)


def test_a_policy_gets_the_workload_history_and_confidences_alike_online_and_in_replay():
    """What the controllers of the field need, given the same way by both drivers: a replayed policy makes its online
    rounds and sees the same inputs."""
    model = tiny_llama(1, vocab=48, init_std=0.05)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    online_spy, replay_spy = SpyPolicy(), SpyPolicy()
    online = SpeculativeDecoder(model, NgramDrafter(block_size=4), eos_token_ids=[], policy=online_spy).generate(
        prompt, max_new_tokens=24, category="qa", dataset="spec_bench")
    replayed = replay_rounds(prompt, online.token_ids, NgramDrafter(block_size=4), policy=replay_spy,
                             max_new_tokens=24, category="qa", dataset="spec_bench")
    untimed = dict(draft_ms=0.0, verify_ms=0.0, overhead_ms=0.0, request_id="", replayed=False)
    assert [dataclasses.replace(r, **untimed) for r in online.rounds] == \
        [dataclasses.replace(r, **untimed) for r in replayed.rounds]
    assert [r.policy for r in online.rounds] == [r.policy for r in replayed.rounds]
    assert online_spy.log == replay_spy.log
    assert online_spy.log[0] == ("begin", "qa", "spec_bench", len(prompt), 24)
    befores = [entry for entry in online_spy.log if entry[0] == "before"]
    assert [entry[2] for entry in befores] == list(range(1, len(online.rounds)))  # every earlier round, prefill too
    assert all(entry[3] == [n for _, n, *_ in befores[:i]] for i, entry in enumerate(befores))
    plans = [entry for entry in online_spy.log if entry[0] == "plan"]
    assert plans and all(entry[3] % 3 != 0 and entry[1][0] >= 1 for entry in plans)  # declined rounds never plan
    assert any(not r.drafted for r in online.rounds[1:]) and any(r.drafted for r in online.rounds[1:])


def test_torch_and_numpy_target_statistics_agree_in_the_schema_order():
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 4
    logits[1, :50] = float("-inf")  # masked tokens have probability 0
    torch_stats = distribution_stats(logits)
    numpy_stats = target_stats_from_logits(logits.numpy())
    assert tuple(torch_stats) == TARGET_STAT_KEYS == tuple(numpy_stats)
    for key in TARGET_STAT_KEYS:
        np.testing.assert_allclose(torch_stats[key].numpy(), numpy_stats[key], rtol=1e-5, atol=1e-5)
