"""SpeculativeDecoder / ARDecoder behaviour on tiny random Llama targets: acceptance, stopping inside a
round, the drafting gate, features handed to drafters, observers, prompts and errors.

The greedy reference is Hugging Face ``generate(do_sample=False)`` (tests/tiny_models.hf_greedy).
"""

import math

import pytest
import torch

from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.tree import expected_accepted
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.tree import Tree
from conftest import OracleDrafter, tiny_llama
from tests.tiny_models import FakeRecorder, hf_greedy, random_prompt

VOCAB = 128

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(11)


def _prompt(seed, length=9):
    return random_prompt(torch.Generator().manual_seed(seed), VOCAB, length)


def test_ar_baseline_equals_hf_generate(model):
    for seed in range(3):
        prompt = _prompt(seed)
        reference = hf_greedy(model, prompt, 30)
        result = ARDecoder(model).generate(prompt, max_new_tokens=30)
        assert result.token_ids == reference
        assert result.stop_reason == "max_new_tokens"
        assert len(result.rounds) == 30 and all(r.tree_nodes == 0 and r.committed == 1 for r in result.rounds)


def test_a_drafter_that_proposes_the_greedy_tokens_gets_everything_accepted(model):
    prompt = _prompt(1)
    reference = hf_greedy(model, prompt, 60)
    block = 6
    drafter = OracleDrafter(reference + [0] * block, block_size=block)
    result = SpeculativeDecoder(model, drafter, policy=RatioGate(min_expected_accepted=0)).generate(
        prompt, max_new_tokens=43)
    assert result.token_ids == reference[:43]
    decode_rounds = result.rounds[1:]  # round 0 is the prefill
    # 1 (prefill) + 7 full rounds of 6 = 43: every draft accepted, every round a full block
    assert [r.committed for r in decode_rounds] == [block] * 7
    assert all(r.accepted == block - 1 and r.tree_nodes == block - 1 for r in decode_rounds)
    assert result.mean_committed_per_round == block


def test_stop_at_the_token_budget_inside_a_round(model):
    prompt = _prompt(2)
    reference = hf_greedy(model, prompt, 40)
    drafter = OracleDrafter(reference + [0] * 8, block_size=8)
    result = SpeculativeDecoder(model, drafter, policy=RatioGate(min_expected_accepted=0)).generate(
        prompt, max_new_tokens=12)
    assert result.token_ids == reference[:12] and result.stop_reason == "max_new_tokens"
    # the last round may only draft what the budget can still take: 1 + 8 + 3
    assert [r.committed for r in result.rounds] == [1, 8, 3]
    assert result.rounds[-1].tree_depth == 2  # drafts deeper than the budget are not verified


def test_stop_at_eos_inside_a_round_exactly_like_greedy(model):
    prompt = _prompt(3)
    long_reference = hf_greedy(model, prompt, 40)
    # an EOS id that first appears in the middle of a round
    position = next(i for i in range(5, 40) if long_reference[i] not in long_reference[:i])
    eos = long_reference[position]
    expected = hf_greedy(model, prompt, 40, eos_token_id=eos)
    assert expected == long_reference[: position + 1]
    drafter = OracleDrafter(long_reference + [0] * 8, block_size=8)
    decoder = SpeculativeDecoder(model, drafter, eos_token_ids=[eos], policy=RatioGate(min_expected_accepted=0))
    result = decoder.generate(prompt, max_new_tokens=40)
    assert result.token_ids == expected and result.stop_reason == "eos"
    assert ARDecoder(model, eos_token_ids=eos).generate(prompt, max_new_tokens=40).token_ids == expected


def test_eos_from_the_model_generation_config():
    model = tiny_llama(5, eos_token_id=None)
    prompt = _prompt(4)
    eos = hf_greedy(model, prompt, 10)[6]
    model.generation_config.eos_token_id = eos
    result = ARDecoder(model).generate(prompt, max_new_tokens=30)
    assert result.token_ids[-1] == eos and result.stop_reason == "eos"
    assert result.token_ids == hf_greedy(model, prompt, 30, eos_token_id=eos)


def test_stop_when_the_context_is_full():
    model = tiny_llama(6, max_positions=24)
    prompt = _prompt(5, length=20)
    drafter = OracleDrafter(hf_greedy(model, prompt, 4) + [0] * 8, block_size=8)
    for decoder in (ARDecoder(model), SpeculativeDecoder(model, drafter, policy=RatioGate(min_expected_accepted=0))):
        result = decoder.generate(prompt, max_new_tokens=50)
        # the last pending token sits at position 24 = the context: it is output but cannot be processed
        assert result.stop_reason == "context_full" and result.new_tokens == 24 - 20 + 1
        assert result.token_ids == hf_greedy(model, prompt, 4) + result.token_ids[4:]


def test_expected_accepted_is_the_sum_of_path_probabilities():
    proposal = DraftProposal(tokens=torch.tensor([[5, 6], [7, 8]]),
                             logprobs=torch.log(torch.tensor([[0.6, 0.3], [0.5, 0.2]])))
    # root -> 5 -> 7 ; root -> 6 -> 8 ; root -> 5 -> 9 (9 not a candidate: probability 0)
    tree = Tree(tokens=(5, 6, 7, 8, 9), parents=(0, 0, 1, 2, 1), depths=(1, 1, 2, 2, 2))
    expected = 0.6 + 0.3 + 0.6 * 0.5 + 0.3 * 0.2 + 0.0
    assert math.isclose(expected_accepted(proposal, tree), expected, rel_tol=1e-6)
    assert expected_accepted(proposal, Tree.empty()) == 0.0


def test_the_gate_skips_drafts_that_do_not_pay_and_never_changes_the_output(model):
    prompt = _prompt(6)
    reference = hf_greedy(model, prompt, 20)

    class Unlikely(OracleDrafter):
        def propose(self, tokens, new_features):
            proposal = super().propose(tokens, new_features)
            return DraftProposal(tokens=proposal.tokens, logprobs=torch.full_like(proposal.logprobs, -5.0))

    gated = SpeculativeDecoder(model, Unlikely(reference + [0] * 6), policy=RatioGate(2.0)).generate(
        prompt, max_new_tokens=20)
    assert gated.token_ids == reference
    assert not any(r.drafted for r in gated.rounds) and all(r.tree_nodes == 0 for r in gated.rounds)
    # E = sum exp(-5 k) < threshold 1 (the last round has no room to draft: E = 0)
    assert all(0 < r.expected_accepted < 1 for r in gated.rounds[1:-1]) and gated.rounds[-1].expected_accepted == 0
    ungated = SpeculativeDecoder(model, Unlikely(reference + [0] * 6), policy=RatioGate(1.0)).generate(
        prompt, max_new_tokens=20)
    assert ungated.token_ids == reference and all(r.drafted for r in ungated.rounds[1:-1])


def test_drafter_receives_prompt_features_then_the_accepted_paths_features():
    model = tiny_llama(7, layers=3)
    prompt = _prompt(7)
    reference = hf_greedy(model, prompt, 30)
    drafter = OracleDrafter(reference + [0] * 6, block_size=6, k=2, p_correct=0.7, seed=3, feature_layers=(1, 0))
    result = SpeculativeDecoder(model, drafter, tree="chain", policy=RatioGate(min_expected_accepted=0)).generate(
        prompt, max_new_tokens=30)
    assert result.token_ids == reference
    with torch.inference_mode():
        full = prompt + reference
        hidden = model(torch.tensor([full]), output_hidden_states=True).hidden_states
        oracle = torch.cat([hidden[2][0], hidden[1][0]], dim=-1)  # layers (1, 0), index 0 = embeddings
    begun_ids, prompt_features = drafter.begun_with
    assert begun_ids == prompt
    torch.testing.assert_close(prompt_features, oracle[: len(prompt)], atol=1e-4, rtol=0)
    rows = [prompt_features]
    for call_index, (tokens, new_features) in enumerate(drafter.calls):
        assert tokens == full[: len(tokens)]  # prompt + committed output, ending with the pending root
        if call_index == 0:
            assert new_features is None and len(tokens) == len(prompt) + 1
        else:
            rows.append(new_features)
        # the drafter has been given the features of every position before the pending root
        assert sum(r.shape[0] for r in rows) == len(tokens) - 1
    torch.testing.assert_close(torch.cat(rows), oracle[: sum(r.shape[0] for r in rows)], atol=1e-4, rtol=0)


def test_recorder_observer_sees_every_output_position_once(model):
    prompt = _prompt(8)
    reference = hf_greedy(model, prompt, 25)
    recorder = FakeRecorder()
    drafter = OracleDrafter(reference + [0] * 5, block_size=5, k=2, p_correct=0.6, seed=1)
    decoder = SpeculativeDecoder(model, drafter, observers=[RecorderObserver(recorder)],
                                 policy=RatioGate(min_expected_accepted=0))
    result = decoder.generate(prompt, max_new_tokens=25, category="coding", request_id="r1", question_id="q1")
    assert recorder.requests["r1"]["category"] == "coding"
    assert recorder.requests["r1"]["prompt_tokens"] == len(prompt)
    tokens, position = [], 0
    for index, row in enumerate(recorder.rounds):
        assert row["round_index"] == index and row["start_position"] == position
        assert row["context_len"] == len(prompt) - 1 + position
        assert len(row["target_stats"]["entropy_nats"]) == len(row["token_ids"])
        assert row["accepted"] <= row["tree_depth"] <= row["block_size"] - 1
        tokens += row["token_ids"]
        position += len(row["token_ids"])
    assert tokens == result.token_ids == reference
    ends = dict(recorder.ends["r1"])
    assert 0 < ends.pop("decode_cpu_ms") <= 2 * result.decode_ms + 50  # CPU time of the rounds (one thread)
    assert ends == {"new_tokens": 25, "stop_reason": "max_new_tokens",
                    "prefill_ms": result.prefill_ms, "decode_ms": result.decode_ms}


class _ToyTokenizer:
    """Characters -> ids; a chat template that tags roles. Enough to test prompt handling."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 100 for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def test_prompts_chat_template_raw_text_and_ids(model):
    tokenizer = _ToyTokenizer()
    decoder = ARDecoder(model, tokenizer=tokenizer)
    chat = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
    assert decoder.encode_prompt("hi") == chat
    assert decoder.encode_prompt([{"role": "user", "content": "hi"}]) == chat
    assert decoder.encode_prompt("hi", raw_prompt=True) == tokenizer("hi")["input_ids"]
    assert decoder.encode_prompt([4, 5, 6]) == [4, 5, 6]
    assert decoder.encode_prompt(torch.tensor([[4, 5]])) == [4, 5]
    result = decoder.generate("hi", max_new_tokens=3)
    assert result.prompt_ids == chat and result.text == tokenizer.decode(result.token_ids)
    with pytest.raises(ValueError, match="tokenizer"):
        ARDecoder(model).generate("hi", max_new_tokens=3)


def test_bad_arguments_get_clear_errors(model):
    small = tiny_llama(0, max_positions=16)
    with pytest.raises(ValueError, match="context"):
        ARDecoder(small).generate(list(range(16)), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ARDecoder(model).generate([1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="empty prompt"):
        ARDecoder(model).generate([], max_new_tokens=2)
    drafter = OracleDrafter([1] * 10)
    with pytest.raises(ValueError, match="unknown tree policy"):
        SpeculativeDecoder(model, drafter, tree="star")
    with pytest.raises(ValueError, match="budget"):
        SpeculativeDecoder(model, drafter, tree="ddtree")
    from entropy_law.decoding.adapter import TargetAdapter
    with pytest.raises(ValueError, match="feature_layers"):
        SpeculativeDecoder(TargetAdapter(model), OracleDrafter([1] * 10, feature_layers=(0,)))
