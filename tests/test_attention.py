"""The adapter's lean grouped-query attention kernel against transformers' eager attention."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.attention import LEAN_EAGER, gqa_eager_attention, lean_attention
from entropy_law.decoding.tree import Tree
from conftest import tiny_llama
from tests.tiny_models import random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (3, 1)])
@pytest.mark.parametrize("with_mask", [True, False])
def test_kernel_equals_eager(heads, kv_heads, with_mask):
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    b, q, length, d = 2, 5, 9, 8
    query = torch.randn(b, heads, q, d, generator=g)
    key = torch.randn(b, kv_heads, length, d, generator=g)
    value = torch.randn(b, kv_heads, length, d, generator=g)
    mask = None
    if with_mask:
        hidden = torch.rand(b, 1, q, length, generator=g) < 0.4
        hidden[..., 0] = False  # every row sees at least one key
        mask = torch.zeros(b, 1, q, length).masked_fill(hidden, torch.finfo(torch.float32).min)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    want_out, want_w = eager_attention_forward(module, query, key, value, mask, scaling=0.3)
    out, w = gqa_eager_attention(module, query, key, value, mask, scaling=0.3)
    assert out.shape == want_out.shape and w.shape == want_w.shape
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-6)


def test_kernel_refuses_training_dropout():
    module = types.SimpleNamespace(num_key_value_groups=1, training=True)
    x = torch.zeros(1, 1, 1, 4)
    with pytest.raises(RuntimeError, match="inference"):
        gqa_eager_attention(module, x, x, x, None, scaling=1.0, dropout=0.1)


def test_context_switches_only_eager_models_and_restores():
    model = tiny_llama(0)
    assert model.config._attn_implementation == "eager"
    with lean_attention(model):
        assert model.config._attn_implementation == LEAN_EAGER
    assert model.config._attn_implementation == "eager"
    with pytest.raises(KeyError):
        with lean_attention(model):
            raise KeyError("boom")
    assert model.config._attn_implementation == "eager"  # restored after an error too
    with lean_attention(model, enabled=False):
        assert model.config._attn_implementation == "eager"
    model.config._attn_implementation = "sdpa"
    with lean_attention(model):
        assert model.config._attn_implementation == "sdpa"  # other kernels are left alone


def test_adapter_forwards_match_eager_and_leave_the_model_as_loaded():
    model = tiny_llama(3, heads=6, kv_heads=2, hidden=48)
    prompt = random_prompt(torch.Generator().manual_seed(1), 128, 23)
    tree = Tree(tokens=(5, 9, 11, 7, 3), parents=(0, 1, 1, 2, 0), depths=(1, 2, 2, 3, 1))
    results = {}
    for lean in (True, False):
        adapter = TargetAdapter(model, lean_attention=lean)
        assert adapter.attention_kernel == (LEAN_EAGER if lean else "eager")
        last, _ = adapter.prefill(prompt)
        logits, _ = adapter.verify(int(last.argmax()), tree, len(prompt))
        results[lean] = (last, logits)
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0, atol=1e-5)
