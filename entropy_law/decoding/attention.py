"""Grouped-query eager attention without repeated keys and values: the adapter's attention kernel.

transformers' ``eager`` copies every KV head to the query heads it serves (``repeat_kv``); here those query
heads are stacked as extra query rows instead, so each KV head is read in place with the same arithmetic and the
logits equal ``eager``'s. Used only inside ``TargetAdapter`` forwards of a model loaded with ``eager``
(``lean_attention``); the model's own configuration is restored after each.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

LEAN_EAGER = "entropy_law_gqa_eager"


def gqa_eager_attention(module, query, key, value, attention_mask, scaling, dropout: float = 0.0,
                        softcap: float | None = None, sliding_window: int | None = None, **kwargs):
    """``eager_attention_forward``'s contract: ``query [b, H, q, d]``, ``key/value [b, kv, L, d]``, additive
    float mask ``[b, 1, q, L]`` or None -> (output ``[b, q, H, d]``, attention weights ``[b, H, q, L]``).
    ``softcap``: Gemma's logit soft-capping, in eager's order; ``sliding_window`` is in the mask, not read."""
    if dropout and module.training:
        raise RuntimeError("the lean attention kernel is for inference; load the model with eager attention "
                           "to train it")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("the lean attention kernel has no attention sinks (s_aux); build the "
                                  "adapter with lean_attention=False")
    b, heads, q, d = query.shape
    kv = key.shape[1]
    if heads % kv:
        raise ValueError(f"{heads} query heads do not divide into {kv} key/value heads")
    groups = heads // kv
    # head h reads KV head h // groups (repeat_kv's order), so [b, H, q, d] -> [b, kv, groups * q, d]
    rows = query.reshape(b, kv, groups * q, d)
    weights = torch.matmul(rows, key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = (weights.view(b, kv, groups, q, -1) + attention_mask.unsqueeze(1)).view(b, kv, groups * q, -1)
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).view(b, heads, q, d)
    return out.transpose(1, 2).contiguous(), weights.view(b, heads, q, -1)


AttentionInterface.register(LEAN_EAGER, gqa_eager_attention)
# the same 4-D additive float masks as eager (an unregistered name would get no causal mask at all)
AttentionMaskInterface.register(LEAN_EAGER, eager_mask)


def text_config(model: torch.nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


@contextmanager
def lean_attention(model: torch.nn.Module, enabled: bool = True):
    """Run the model's language attention with ``gqa_eager_attention`` for the duration, if it uses ``eager``
    (the text configuration only: a vision tower keeps its kernel); restored on exit, also after an error."""
    config = text_config(model)
    if not enabled or getattr(config, "_attn_implementation_internal", None) != "eager":
        yield
        return
    config._attn_implementation_internal = LEAN_EAGER
    try:
        yield
    finally:
        config._attn_implementation_internal = "eager"
