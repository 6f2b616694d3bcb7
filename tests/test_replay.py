"""Offline replay: teacher-forced target statistics and simulated rounds (no online decoder needed)."""

import math
from functools import partial

import numpy as np
import pytest
import torch
from scipy.special import log_softmax as np_log_softmax
from scipy.stats import entropy as scipy_entropy

from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.decoding.replay import (replay_request, replay_rounds, target_stats, teacher_forced_logits,
                                         teacher_forced_target_stats)
import conftest
from conftest import OracleDrafter

# this module's target: HF's default init, special ids bos 1 / eos 2 / pad 0, tied embeddings, 256 positions
tiny_llama = partial(conftest.tiny_llama, vocab=96, max_positions=256, init_std=0.02, tie_embeddings=True,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0)


def independent_stats(logits_row: np.ndarray) -> dict:
    logp = np_log_softmax(logits_row.astype(np.float64))
    p = np.exp(logp)
    top = np.sort(p)[::-1]
    z = np.sort(logits_row.astype(np.float64))[::-1]
    return {"target_entropy_nats": scipy_entropy(p), "target_renyi2_nats": -math.log((p ** 2).sum()),
            "target_top1_prob": top[0], "target_top2_prob": top[1], "target_logit_gap": z[0] - z[1]}


def test_target_stats_match_scipy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 3
    logits[2, :10] = -math.inf  # masked tokens have probability 0
    stats = target_stats(logits)
    for row in range(6):
        expected = independent_stats(logits[row].numpy())
        for key, value in expected.items():
            assert float(stats[key][row]) == pytest.approx(value, rel=1e-5, abs=1e-5), key


def test_teacher_forced_stats_equal_autoregressive_ones():
    model = tiny_llama(0)
    prompt = [5, 17, 33, 8, 61, 12]
    generated = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
                               output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    output = generated.sequences[0, len(prompt):].tolist()
    step_logits = torch.cat(generated.logits).float()  # [24, V]: what AR decoding saw at each position
    frame = teacher_forced_target_stats(model, prompt, output)
    assert frame["is_greedy"].all() and frame["token_id"].tolist() == output
    assert frame["position"].tolist() == list(range(24))
    for pos in range(24):
        expected = independent_stats(step_logits[pos].numpy())
        for key, value in expected.items():
            assert abs(frame[key][pos] - value) < 1e-4, (pos, key)
    forced = teacher_forced_logits(model, prompt, output)
    assert forced.shape == (24, model.config.vocab_size)
    assert torch.allclose(forced, step_logits, atol=1e-4)


def check_rounds_cover_output(result, prompt, output):
    committed = [t for r in result.rounds for t in r.committed_ids]
    assert committed == output
    starts = [r.start_position for r in result.rounds]
    assert starts == [sum(r.committed for r in result.rounds[:i]) for i in range(len(result.rounds))]
    # the root (output token s - 1) sits at absolute position len(prompt) + s - 1 = the cache length
    assert [r.context_len for r in result.rounds[1:]] == [len(prompt) + s - 1 for s in starts[1:]]


def test_oracle_drafter_accepts_everything_up_to_the_budget():
    prompt, output = [1, 2, 3], list(range(10, 40))
    drafter = OracleDrafter(output, block_size=5, stated_prob=1.0)
    result = replay_rounds(prompt, output, drafter, "chain", None, max_new_tokens=30)
    check_rounds_cover_output(result, prompt, output)
    # round 0 commits 1; then 4 drafts + bonus = 5 per round; 29 = 5 * 5 + 4 (last round cut to budget)
    assert result.accepted_lengths == [4, 4, 4, 4, 4, 3]
    assert [r.committed for r in result.rounds] == [1, 5, 5, 5, 5, 5, 4]
    assert result.stop_reason == "max_new_tokens"
    assert [len(tokens) for tokens, _ in drafter.calls] == [len(prompt) + s for s in (1, 6, 11, 16, 21, 26)]


def test_wrong_drafts_and_the_gate_give_one_token_rounds():
    prompt, output = [1, 2, 3], list(range(10, 20)) + [2]
    wrong = replay_rounds(prompt, output, OracleDrafter(output, block_size=4, p_correct=0.0, stated_prob=1.0), "chain",
                          eos_token_ids=2, max_new_tokens=50)
    assert wrong.accepted_lengths == [0] * 10 and wrong.stop_reason == "eos"
    assert all(r.drafted for r in wrong.rounds[1:])
    check_rounds_cover_output(wrong, prompt, output)
    # p = 0.3 per depth: expected accepted 0.3 + 0.09 + 0.027 < 1 = the default gate -> never drafts
    gated = replay_rounds(prompt, output, OracleDrafter(output, block_size=4, stated_prob=0.3), "chain",
                          eos_token_ids=[2], max_new_tokens=50)
    assert not any(r.drafted for r in gated.rounds) and gated.accepted_lengths == [0] * 10
    assert gated.rounds[1].expected_accepted == pytest.approx(0.3 + 0.09 + 0.027, rel=1e-5)
    # ... but drafts when told to
    forced = replay_rounds(prompt, output, OracleDrafter(output, block_size=4, stated_prob=0.3), "chain",
                           eos_token_ids=[2], max_new_tokens=50, min_expected_accepted=0.0)
    assert forced.accepted_lengths[0] == 3
    custom = replay_rounds(prompt, output, OracleDrafter(output, block_size=4, stated_prob=0.3), "chain",
                           eos_token_ids=[2], max_new_tokens=50, should_draft=lambda proposal, tree: False)
    assert custom.accepted_lengths == [0] * 10


def test_replay_refuses_outputs_it_cannot_explain():
    prompt, output = [1, 2, 3], [5, 6, 2, 7]
    with pytest.raises(ValueError, match="EOS at position 2"):
        replay_rounds(prompt, output, NgramDrafter(), "chain", eos_token_ids=2)
    with pytest.raises(ValueError, match="not a complete greedy output"):
        replay_rounds(prompt, [5, 6], NgramDrafter(), "chain", eos_token_ids=2, max_new_tokens=10)
    with pytest.raises(ValueError, match="needs a node budget"):
        replay_rounds(prompt, [5, 6], NgramDrafter(), "ddtree")
    with pytest.raises(ValueError, match="unknown tree policy"):
        replay_rounds(prompt, [5, 6], NgramDrafter(), "beam", 4)


def test_ngram_replay_on_repetitive_text_drafts_and_covers_the_output():
    rng = np.random.default_rng(4)
    motif = rng.integers(10, 90, size=7).tolist()
    prompt = motif * 2
    output = motif * 6 + [3, 4]
    for policy, budget in (("chain", None), ("ddtree", 8)):
        result = replay_rounds(prompt, output, NgramDrafter(max_ngram=3, block_size=6), policy, budget)
        check_rounds_cover_output(result, prompt, output)
        assert max(result.accepted_lengths) == 5  # full blocks once calibrated
        assert result.mean_committed_per_round > 2.0
        for r, proposal, tree in zip(result.rounds, result.proposals, result.trees):
            assert r.drafted == (proposal is not None) and r.tree_nodes == tree.n_nodes
            if policy == "chain" and r.drafted:
                assert tree.n_nodes == proposal.depth
            if policy == "ddtree":
                assert tree.n_nodes <= 8
        assert result.summary["accepted"].tolist() == [r.accepted for r in result.rounds]


class ListObserver:
    def __init__(self):
        self.events = []

    def on_request_start(self, request_id, info):
        self.events.append(("start", request_id, info))

    def on_round(self, record):
        self.events.append(("round", record))

    def on_request_end(self, request_id, info):
        self.events.append(("end", request_id, info))


def test_replay_request_feeds_observers_with_teacher_forced_logits():
    model = tiny_llama(1)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    output = model.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
    observer = ListObserver()
    result = replay_request(model, prompt, output, NgramDrafter(block_size=4), "chain", None,
                            observers=[observer], request_id="r1", category="qa", min_expected_accepted=0.0)
    assert observer.events[0][0] == "start" and observer.events[0][2]["category"] == "qa"
    assert observer.events[-1] == ("end", "r1", {"new_tokens": 20, "stop_reason": "max_new_tokens",
                                                 "prefill_ms": 0.0, "decode_ms": 0.0})
    records = [e[1] for e in observer.events if e[0] == "round"]
    assert len(records) == len(result.rounds)
    logits = teacher_forced_logits(model, prompt, output)
    for record in records:
        assert record.replayed is True
        rows = record.target_logits
        assert rows.shape[0] == len(record.committed_ids)
        # each committed token is the argmax of its logit row (greedy path)
        assert rows.argmax(-1).tolist() == record.committed_ids
        assert torch.equal(rows, logits[record.start_position:record.start_position + len(record.committed_ids)])


def test_replay_request_writes_a_trace_run_flagged_as_replayed(tmp_path):
    import json

    import pyarrow.parquet as pq

    from entropy_law.decoding.observers import RecorderObserver
    from entropy_law.decoding.replay import replay_run_metadata
    from entropy_law.traces.recorder import TraceRecorder

    model = tiny_llama(2)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    output = model.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                            pad_token_id=0)[0, len(prompt):].tolist()
    drafter = NgramDrafter(block_size=4)
    run = tmp_path / "replayed"
    with TraceRecorder(run, model_id="tiny", **replay_run_metadata(drafter, "chain", None)) as recorder:
        result = replay_request(model, prompt, output, drafter, "chain", None, observers=[RecorderObserver(recorder)],
                                request_id="r1", category="qa", min_expected_accepted=0.0)
    meta = json.loads((run / "run.json").read_text())
    assert meta["replayed"] is True and meta["status"] == "complete" and meta["drafter_id"] == "ngram"
    shard = sorted((run / "shards").iterdir())[0]
    tokens = pq.read_table(shard / "tokens.parquet").to_pandas().sort_values("position")
    rounds = pq.read_table(shard / "rounds.parquet").to_pandas().sort_values("round_index")
    assert tokens["token_id"].tolist() == output
    assert rounds["accepted"].tolist() == [r.accepted for r in result.rounds]
    expected = teacher_forced_target_stats(model, prompt, output)
    np.testing.assert_allclose(tokens["target_entropy_nats"].to_numpy(), expected["target_entropy_nats"], atol=1e-5)
