"""Sliding-window and hybrid targets: the adapter's KV cache, its tree masks, and exact decoding across the
window.

Tiny randomly initialised models with a window of 8 (smaller than the 12-token prompts, so every round
decodes beyond it): Gemma 3 (text-only, hybrid: sliding, full, sliding), Gemma 2 (sliding and full layers
alternating, attention-logit soft-capping) and Mistral (every layer sliding, one mask, no ``layer_types``).
Oracles are independent: Hugging Face greedy ``generate`` (its own sliding cache and masks), plain
forwards without a cache, and caches a fresh HF forward builds.
"""

from __future__ import annotations

import types
from functools import lru_cache

import numpy as np
import pytest
import torch

from entropy_law.decoding.adapter import CacheLayout, TargetAdapter, UnsupportedCacheLayout
from entropy_law.decoding.attention import gqa_eager_attention
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import CostGate, RatioGate, measure_verify_cost
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.replay import teacher_forced_target_stats
from entropy_law.decoding.tree import Tree
from entropy_law.drafters.ngram import NgramDrafter
from conftest import OracleDrafter, tiny_llama
from tests.tiny_models import FakeRecorder, hf_greedy, random_prompt, random_tree

WINDOW = 8
VOCAB = 96
PROMPT_LEN = 12
MAX_NEW = 40
FAMILIES = ("gemma3", "gemma2", "mistral")

pytestmark = pytest.mark.usefixtures("single_thread")


@lru_cache(maxsize=None)
def tiny_sliding(family: str, window: int = WINDOW, seed: int = 0):
    """A tiny fp32 eager model of ``family`` with sliding window ``window``; weights depend only on the
    arguments. Gemma's tied embeddings give one repeated token at any init, so its head is untied."""
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig,
                              MistralForCausalLM)

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=window,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    if family == "gemma3":
        config = Gemma3TextConfig(**common, num_hidden_layers=3, initializer_range=0.5, tie_word_embeddings=False,
                                  layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        cls = Gemma3ForCausalLM
    elif family == "gemma2":  # layer types alternate sliding / full; soft-capping 50 on attention logits
        config = Gemma2Config(**common, num_hidden_layers=2, initializer_range=0.5, tie_word_embeddings=False)
        cls = Gemma2ForCausalLM
    elif family == "mistral":
        config = MistralConfig(**common, num_hidden_layers=2, initializer_range=0.2)
        cls = MistralForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)  # HF initialises weights from the global generator
    model = cls(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompt_for(seed: int, length: int = PROMPT_LEN) -> list[int]:
    return random_prompt(torch.Generator().manual_seed(seed), VOCAB, length)


@lru_cache(maxsize=None)
def greedy(family: str, prompt_seed: int, length: int = PROMPT_LEN) -> tuple[int, ...]:
    return tuple(hf_greedy(tiny_sliding(family), prompt_for(prompt_seed, length), MAX_NEW))


# --- the layout and the adapter ------------------------------------------------------------------------


def test_layout_is_read_from_the_configuration():
    assert TargetAdapter(tiny_sliding("gemma3")).layout == CacheLayout(
        "gemma3_text", (WINDOW, None, WINDOW), ("sliding_attention", "full_attention", "sliding_attention"))
    assert TargetAdapter(tiny_sliding("gemma2")).layout.windows == (WINDOW, None)
    mistral = TargetAdapter(tiny_sliding("mistral")).layout
    assert mistral.windows == (WINDOW, WINDOW) and mistral.layer_types is None and not mistral.is_hybrid
    assert TargetAdapter(tiny_llama(0)).layout.distinct_windows == (None,)


def test_tree_mask_respects_the_window_inside_and_before_the_tree():
    adapter = TargetAdapter(tiny_sliding("gemma3", window=4))
    # a chain of depth 5 under the root: deeper than the window
    chain = Tree(tokens=(1, 2, 3, 4, 5), parents=(0, 1, 2, 3, 4), depths=(1, 2, 3, 4, 5))
    full = adapter.tree_attention_mask(10, chain)
    assert full.shape == (1, 1, 6, 16) and (full[0, 0, :, :10] == 0).all()
    mask = adapter.tree_attention_mask(10, chain, window=4)
    assert mask.shape == (1, 1, 6, 3 + 6)  # the last W - 1 = 3 committed positions (7, 8, 9) + the tree
    visible = mask[0, 0] == 0
    key_at = [7, 8, 9] + [10 + d for d in range(6)]
    for row in range(6):  # node at position 10 + row sees positions 10 + row - 3 .. 10 + row
        assert [k for k, v in zip(key_at, visible[row].tolist()) if v] == list(range(7 + row, 11 + row))
    # hybrid: one mask per layer type; a short prefix keeps every position
    masks = adapter.tree_attention_masks(2, chain)
    assert set(masks) == {"sliding_attention", "full_attention"}
    assert masks["full_attention"].shape == (1, 1, 6, 8) and masks["sliding_attention"].shape == (1, 1, 6, 8)


@torch.inference_mode()
def fresh_cache(model, ids: list[int]):
    """The cache Hugging Face's own forward leaves over ``ids`` (sliding layers: the last W - 1 rows)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prompt_len", [3, PROMPT_LEN])  # 3: the window fills during the rounds
def test_each_node_matches_a_plain_forward_and_commit_keeps_the_greedy_rows(family, prompt_len):
    window = 4  # trees deeper than the window: ancestors drop out of it too
    model = tiny_sliding(family, window=window)
    generator = torch.Generator().manual_seed(prompt_len)
    adapter = TargetAdapter(model)
    committed = prompt_for(7, prompt_len)
    adapter.prefill(committed)
    assert_greedy_rows(adapter, model, committed)
    for round_ in range(4):
        start = len(committed)
        root = int(torch.randint(VOCAB, (), generator=generator))
        tree = random_tree(generator, n_nodes=9, vocab=VOCAB, max_depth=6)
        logits, _ = adapter.verify(root, tree, start)
        with torch.inference_mode():
            for node in range(tree.n_nodes + 1):
                path = [root] + [tree.tokens[i - 1] for i in tree.path_to(node)]
                plain = model(torch.tensor([committed + path])).logits[0, -1].float()
                torch.testing.assert_close(logits[node], plain, atol=1e-4, rtol=0)
        # accept the deepest path (not contiguous in node order), shortened in one round
        deepest = max(range(tree.n_nodes + 1), key=lambda n: (len(tree.path_to(n)), -n))
        keep = [0] + tree.path_to(deepest)
        keep = keep[:2] if round_ == 2 else keep
        adapter.commit(start, keep)
        committed += [root] + [tree.tokens[n - 1] for n in keep[1:]]
        assert_greedy_rows(adapter, model, committed)
    assert len(committed) > 2 * window


def assert_greedy_rows(adapter, model, committed):
    """The adapter's cache holds exactly the rows (and values, to fp32 noise) HF's own cache holds."""
    assert adapter.cache_len == len(committed)
    for layer, ref in zip(adapter.cache.layers, fresh_cache(model, committed).layers, strict=True):
        assert layer.keys.shape == ref.keys.shape
        assert layer.get_seq_length() == ref.get_seq_length() == len(committed)
        torch.testing.assert_close(layer.keys, ref.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(layer.values, ref.values, atol=1e-5, rtol=0)


def test_truncate_after_a_verify_restores_the_window():
    model = tiny_sliding("gemma3")
    adapter = TargetAdapter(model)
    prompt = prompt_for(3)
    adapter.prefill(prompt)
    adapter.verify(5, Tree(tokens=(6, 7, 8), parents=(0, 1, 2), depths=(1, 2, 3)), len(prompt))
    adapter.truncate(len(prompt))
    assert_greedy_rows(adapter, model, prompt)
    with pytest.raises(ValueError, match="sliding-window"):
        adapter.truncate(2)  # its sliding layers no longer hold positions 0 .. 1


# --- exact decoding across the window ------------------------------------------------------------------


def accepted_beyond_window(result) -> int:
    """Drafts accepted in rounds whose root lies past the window (the sliding layers had dropped rows)."""
    return sum(r.accepted for r in result.rounds if r.context_len >= WINDOW)


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_equals_hf_greedy_and_ar(family):
    model = tiny_sliding(family)
    prompt = prompt_for(1)
    reference = list(greedy(family, 1))
    assert len(set(reference)) > 10  # a varied output, not one repeated token
    ar = SpeculativeDecoder(model, None).generate(prompt, max_new_tokens=MAX_NEW)
    assert ar.token_ids == reference
    drafters = {
        "oracle": lambda: OracleDrafter(reference + [0] * 8, block_size=8, vocab=VOCAB),
        "noisy-oracle": lambda: OracleDrafter(reference + [0] * 8, block_size=8, k=3, p_correct=0.7, vocab=VOCAB,
                                              seed=3),
        "ngram": lambda: NgramDrafter(block_size=6, max_matches=3, min_path_prob=0.0),
    }
    for tree, budget in (("chain", None), ("ddtree", 8)):
        for name, make in drafters.items():
            result = SpeculativeDecoder(model, make(), tree=tree, budget=budget,
                                        policy=RatioGate(min_expected_accepted=0.0)).generate(
                prompt, max_new_tokens=MAX_NEW)
            assert result.token_ids == reference, (family, tree, name)
            if name == "oracle":
                assert accepted_beyond_window(result) >= 30, (tree, [r.accepted for r in result.rounds])
            if name == "noisy-oracle":
                assert accepted_beyond_window(result) >= 8, (tree, [r.accepted for r in result.rounds])


@pytest.mark.parametrize("family", FAMILIES)
def test_rounds_that_fill_the_window_are_exact(family):
    """A 3-token prompt: the window fills inside accepted drafts (root before it, drafts past it)."""
    model = tiny_sliding(family)
    prompt = prompt_for(2, 3)
    reference = list(greedy(family, 2, 3))
    for tree, budget in (("chain", None), ("ddtree", 8)):
        result = SpeculativeDecoder(model, OracleDrafter(reference + [0] * 8, block_size=8, vocab=VOCAB), tree=tree,
                                    budget=budget, policy=RatioGate(min_expected_accepted=0.0)).generate(
            prompt, max_new_tokens=MAX_NEW)
        assert result.token_ids == reference, (family, tree)
        straddling = [r for r in result.rounds if r.context_len < WINDOW <= r.context_len + r.accepted]
        assert straddling, [(r.context_len, r.accepted) for r in result.rounds]


@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_target_entropy_equals_a_plain_forward(family):
    model = tiny_sliding(family)
    prompt = prompt_for(1)
    reference = list(greedy(family, 1))
    recorder = FakeRecorder()
    result = SpeculativeDecoder(model, OracleDrafter(reference + [0] * 6, block_size=6, k=2, p_correct=0.8,
                                                     vocab=VOCAB, seed=4),
                                tree="ddtree", budget=8, policy=RatioGate(min_expected_accepted=0.0),
                                observers=[RecorderObserver(recorder)]).generate(prompt, max_new_tokens=MAX_NEW)
    assert result.token_ids == reference and accepted_beyond_window(result) > 0
    recorded = np.concatenate([row["target_stats"]["entropy_nats"] for row in recorder.rounds])
    frame = teacher_forced_target_stats(model, prompt, reference)  # one forward, HF's own sliding masks
    assert frame["is_greedy"].all()
    np.testing.assert_allclose(recorded, frame["target_entropy_nats"].to_numpy(), atol=1e-4, rtol=0)


def test_a_measured_verify_cost_leaves_decoding_exact():
    """``measure_verify_cost`` verifies and truncates the cache of a sliding-window target."""
    model = tiny_sliding("gemma2")
    adapter = TargetAdapter(model)
    cost = measure_verify_cost(adapter, sizes=(1, 2, 4), repeats=1, context_len=20)
    assert cost.sizes[0] == 1
    reference = list(greedy("gemma2", 1))
    result = SpeculativeDecoder(adapter, OracleDrafter(reference + [0] * 6, block_size=6, vocab=VOCAB),
                                policy=CostGate(cost)).generate(prompt_for(1), max_new_tokens=MAX_NEW)
    assert result.token_ids == reference


# --- the lean kernel ----------------------------------------------------------------------------------


def test_lean_kernel_soft_caps_as_eager_does():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 6, 5, 8, generator=g) * 4, torch.randn(1, 2, 9, 8, generator=g) * 4  # scores > cap
    value = torch.randn(1, 2, 9, 8, generator=g)
    hidden = torch.rand(1, 1, 5, 9, generator=g) < 0.4
    hidden[..., 0] = False
    mask = torch.zeros(1, 1, 5, 9).masked_fill(hidden, torch.finfo(torch.float32).min)
    module = types.SimpleNamespace(num_key_value_groups=3, training=False, head_dim=8)
    want_out, want_w = eager_attention_forward(module, query, key, value, mask, scaling=0.5, softcap=5.0)
    out, w = gqa_eager_attention(module, query, key, value, mask, scaling=0.5, softcap=5.0, sliding_window=4)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_lean_and_eager_adapters_agree_on_sliding_models(family):
    model = tiny_sliding(family)
    prompt = prompt_for(5)
    tree = Tree(tokens=(5, 9, 11, 7, 3, 8), parents=(0, 1, 1, 2, 4, 0), depths=(1, 2, 2, 3, 4, 1))
    results = []
    for lean in (True, False):
        adapter = TargetAdapter(model, lean_attention=lean)
        last, _ = adapter.prefill(prompt)
        logits, _ = adapter.verify(int(last.argmax()), tree, len(prompt))
        results.append((last, logits))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-5)


# --- layouts we cannot keep ---------------------------------------------------------------------------


def test_unsupported_layouts_fail_when_the_decoder_is_built():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Llama4ForCausalLM, Llama4TextConfig

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, head_dim=8)
    torch.manual_seed(0)
    chunked = Llama4ForCausalLM(Llama4TextConfig(**small, intermediate_size_mlp=64, attention_chunk_size=8,
                                                 num_local_experts=2))
    with pytest.raises(UnsupportedCacheLayout, match=r"llama4_text: decoder layer 0 is a 'chunked_attention' layer"
                                                     r".*model\.generate"):
        SpeculativeDecoder(chunked, NgramDrafter())
    bidirectional = Gemma3ForCausalLM(Gemma3TextConfig(**small, use_bidirectional_attention=True))
    with pytest.raises(UnsupportedCacheLayout, match="gemma3_text.*bidirectional"):
        TargetAdapter(bidirectional)
