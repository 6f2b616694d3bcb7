"""Exactness and exogeneity on tiny random Llama targets.

Exactness: whatever the drafter, tree shape, budget, gate, EOS and token budget, speculative output ids
== our AR baseline == Hugging Face ``generate(do_sample=False)``. A divergence is tolerated only at a
numerical near-tie: the target's top-1 minus top-2 logit at the first differing position must be
<= 1e-3 (reported in the failure message otherwise).

Exogeneity: the target statistics recorded at each output position do not depend on the drafter:
equal to the AR baseline's within 1e-4 nats, and to scipy on a teacher-forced forward.
"""

from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import softmax
from scipy.stats import entropy as scipy_entropy

from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.decoding.observers import RecorderObserver, committed_token_draft_stats, distribution_stats
from conftest import OracleDrafter, tiny_llama
from tests.tiny_models import FakeRecorder, RandomTreePolicy, first_divergence_margin, hf_greedy, random_prompt

MARGIN_TOLERANCE = 1e-3

MODEL_CONFIGS = {  # seed -> (vocab, layers, kv heads)
    0: dict(vocab=96, layers=2, kv_heads=2),
    1: dict(vocab=128, layers=3, kv_heads=4),
    2: dict(vocab=200, layers=2, kv_heads=1),
}

pytestmark = pytest.mark.usefixtures("single_thread")


@lru_cache(maxsize=None)
def model_for(seed: int):
    return tiny_llama(seed, **MODEL_CONFIGS[seed])


def assert_same_or_near_tie(model, prompt, got, expected, what):
    divergence = first_divergence_margin(model, prompt, got, expected)
    if divergence is not None:
        index, margin = divergence
        assert margin <= MARGIN_TOLERANCE, (
            f"{what}: first difference at output position {index} with target top1-top2 margin {margin:.3g} "
            f"(> {MARGIN_TOLERANCE}): got {got}, expected {expected}")


@settings(max_examples=36, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_seed=st.sampled_from(sorted(MODEL_CONFIGS)),
    prompt_seed=st.integers(0, 10_000),
    prompt_len=st.integers(1, 24),
    max_new_tokens=st.integers(1, 32),
    drafter_kind=st.sampled_from(["oracle", "ngram"]),
    block_size=st.integers(2, 9),
    k=st.integers(1, 4),
    p_correct=st.sampled_from([0.3, 0.7, 0.95, 1.0]),
    tree=st.sampled_from(["chain", "ddtree", "random"]),
    budget=st.one_of(st.none(), st.integers(1, 16)),
    eos_at=st.one_of(st.none(), st.integers(0, 31)),
    gated=st.booleans(),
)
def test_speculative_equals_ar_equals_hf_generate(model_seed, prompt_seed, prompt_len, max_new_tokens, drafter_kind,
                                                  block_size, k, p_correct, tree, budget, eos_at, gated):
    model = model_for(model_seed)
    vocab = MODEL_CONFIGS[model_seed]["vocab"]
    prompt = random_prompt(torch.Generator().manual_seed(prompt_seed), vocab, prompt_len)
    reference = hf_greedy(model, prompt, max_new_tokens)  # no EOS
    eos = None
    if eos_at is not None and eos_at < len(reference):
        eos = reference[eos_at]
        reference = hf_greedy(model, prompt, max_new_tokens, eos_token_id=eos)
    if drafter_kind == "oracle":
        drafter = OracleDrafter(reference + [0] * block_size, block_size=block_size, k=k, p_correct=p_correct,
                                vocab=vocab, seed=prompt_seed)
    else:
        drafter = NgramDrafter(block_size=block_size, max_matches=k, min_path_prob=0.0)
    if tree == "ddtree" and budget is None:
        budget = block_size
    policy = RandomTreePolicy(prompt_seed) if tree == "random" else tree
    decoder = SpeculativeDecoder(model, drafter, tree=policy, budget=budget, eos_token_ids=eos,
                                 policy=RatioGate(min_expected_accepted=None if gated else 0.0))
    result = decoder.generate(prompt, max_new_tokens=max_new_tokens)
    ar = ARDecoder(model, eos_token_ids=eos).generate(prompt, max_new_tokens=max_new_tokens)
    assert_same_or_near_tie(model, prompt, ar.token_ids, reference, "AR vs HF generate")
    assert_same_or_near_tie(model, prompt, result.token_ids, ar.token_ids, f"speculative ({tree}) vs AR")
    assert sum(r.committed for r in result.rounds) == result.new_tokens
    for r in result.rounds:
        assert r.accepted <= r.tree_depth and r.committed <= r.accepted + 1


def _recorded_entropy(recorder: FakeRecorder) -> np.ndarray:
    return np.concatenate([row["target_stats"]["entropy_nats"] for row in recorder.rounds])


@pytest.mark.parametrize("model_seed", sorted(MODEL_CONFIGS))
def test_recorded_target_entropy_does_not_depend_on_the_drafter(model_seed):
    model = model_for(model_seed)
    vocab = MODEL_CONFIGS[model_seed]["vocab"]
    prompt = random_prompt(torch.Generator().manual_seed(40 + model_seed), vocab, 12)
    max_new = 28
    reference = hf_greedy(model, prompt, max_new)

    ar_recorder = FakeRecorder()
    ar = ARDecoder(model, observers=[RecorderObserver(ar_recorder)]).generate(prompt, max_new_tokens=max_new)
    ar_entropy = _recorded_entropy(ar_recorder)
    assert ar.token_ids == reference and len(ar_entropy) == max_new

    # independent oracle: scipy entropy of a teacher-forced forward over prompt + output
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + reference])).logits[0, len(prompt) - 1: -1].double().numpy()
    np.testing.assert_allclose(ar_entropy, scipy_entropy(softmax(logits, axis=-1), axis=-1), atol=1e-4, rtol=0)

    drafters = [
        ("oracle-chain", OracleDrafter(reference + [0] * 8, block_size=8, vocab=vocab), "chain", None),
        ("noisy-ddtree", OracleDrafter(reference + [0] * 6, block_size=6, k=3, p_correct=0.7, vocab=vocab, seed=5),
         "ddtree", 10),
        ("ngram-ddtree", NgramDrafter(block_size=6, max_matches=3, min_path_prob=0.0), "ddtree", 8),
    ]
    for name, drafter, tree, budget in drafters:
        recorder = FakeRecorder()
        result = SpeculativeDecoder(model, drafter, tree=tree, budget=budget, observers=[RecorderObserver(recorder)],
                                    policy=RatioGate(min_expected_accepted=0.0)).generate(prompt,
                                                                                          max_new_tokens=max_new)
        assert result.token_ids == reference, name
        np.testing.assert_allclose(_recorded_entropy(recorder), ar_entropy, atol=1e-4, rtol=0, err_msg=name)
        if name == "oracle-chain":  # the drafter really changed the rounds
            assert len(recorder.rounds) < len(ar_recorder.rounds)


def test_distribution_stats_match_scipy():
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([0.01, 1.0, 5.0, 30.0]).repeat_interleave(3).unsqueeze(1)
    logits = torch.randn(12, 1000, generator=generator) * scales
    logits[0, 7] = logits[0, 3]  # an exact tie for top-1/top-2
    stats = distribution_stats(logits)
    z = logits.double().numpy()
    p = softmax(z, axis=-1)
    np.testing.assert_allclose(stats["entropy_nats"].numpy(), scipy_entropy(p, axis=-1), atol=1e-5, rtol=0)
    np.testing.assert_allclose(stats["renyi2_nats"].numpy(), -np.log((p ** 2).sum(-1)), atol=1e-5, rtol=0)
    top = np.sort(p, axis=-1)[:, ::-1]
    np.testing.assert_allclose(stats["top1_prob"].numpy(), top[:, 0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(stats["top2_prob"].numpy(), top[:, 1], atol=1e-6, rtol=0)
    zs = np.sort(z, axis=-1)[:, ::-1]
    np.testing.assert_allclose(stats["logit_gap"].numpy(), zs[:, 0] - zs[:, 1], atol=1e-5, rtol=0)
    # -inf logits (masked vocabulary) contribute nothing
    masked = logits[:2].clone()
    masked[:, 500:] = -float("inf")
    ref = scipy_entropy(softmax(masked[:, :500].double().numpy(), axis=-1), axis=-1)
    np.testing.assert_allclose(distribution_stats(masked)["entropy_nats"].numpy(), ref, atol=1e-5, rtol=0)


def test_committed_token_draft_stats_match_scipy():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 300, generator=generator) * torch.tensor([[0.1], [2.0], [8.0], [40.0]])
    logits[1, 200:] = -float("inf")  # a masked draft vocabulary
    committed = [5, 17, 290, 3, 9]  # one more committed token than drafted depths: NaN there
    stats = committed_token_draft_stats(logits, committed)
    z = logits.double().numpy()
    p = softmax(z, axis=-1)
    rows = np.arange(4)
    ids = np.array(committed[:4])
    np.testing.assert_allclose(stats["prob"][:4].numpy(), p[rows, ids], atol=1e-6, rtol=0)
    np.testing.assert_array_equal(stats["rank"][:4].numpy(), (z > z[rows, ids][:, None]).sum(-1))
    np.testing.assert_allclose(stats["entropy_nats"][:4].numpy(), scipy_entropy(p, axis=-1), atol=1e-5, rtol=0)
    assert all(torch.isnan(stats[key][4]) for key in ("prob", "rank", "entropy_nats"))
