"""Tiny randomly initialised Llama targets for decoding tests (seeded, CPU, fp32, eager attention)."""

from __future__ import annotations

import torch


def tiny_llama(seed: int = 0, *, vocab: int = 128, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, max_positions: int = 512, eos_token_id: int | None = None,
               init_std: float = 0.2):
    """A small ``LlamaForCausalLM`` with explicit seed. ``init_std`` above the HF default (0.02) gives
    peaked, prompt-dependent next-token distributions, so greedy outputs are not one repeated token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        initializer_range=init_std, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)  # HF initialises weights from the global generator; reseed for determinism
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


def random_prompt(generator: torch.Generator, vocab: int, length: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=generator).tolist()
