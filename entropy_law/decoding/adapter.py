"""The target side of speculative decoding: one Hugging Face causal LM, its KV cache, one forward per call.

Known here: how to prefill a prompt, how to verify a candidate tree in ONE forward pass (a 4-D additive
float mask ``[1, 1, N+1, start+N+1]`` in which the whole committed prefix is visible and the tree part is
ancestor-only, position ids ``start + depth``), how to keep only the accepted rows of the KV cache
(``commit``; our own gather-and-truncate over ``cache.layers[i].keys/values``, never ``DynamicCache.crop``,
whose meaning changed across transformers versions), and how to capture hidden states of chosen layers
(``entropy_law.decoding.features``). Batch size 1. Forwards run the language attention with the lean
grouped-query kernel of ``entropy_law.decoding.attention`` when the model uses ``eager`` (same logits, no
copies of the KV cache); ``lean_attention=False`` keeps transformers' own kernel.

Not known here: drafters, tree policies, acceptance, stopping (see ``decoder``). A vision-language
subclass overrides ``tree_position_ids`` (3-D M-RoPE ids) and ``prefill`` (pixel inputs); nothing else
needs to change.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from transformers import DynamicCache

from entropy_law.decoding.attention import lean_attention, text_config
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.tree import Tree


def cache_keyword(model: torch.nn.Module) -> str:
    """Name of the cache argument of ``model.forward`` (``cache`` in recent 5.x, ``past_key_values`` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TargetAdapter:
    """Wraps a causal LM (eval mode, batch 1) and owns its KV cache.

    ``feature_layers``: decoder layers whose output hidden states are returned with the logits
    (concatenated, ``[rows, len(feature_layers) * hidden]``); empty: no features, ``None`` returned.

    Invariant between calls: the cache holds exactly the committed positions ``0 .. cache_len - 1``.
    ``verify`` appends ``N + 1`` rows (root + tree nodes, node order); ``commit`` brings the cache back to
    the invariant.
    """

    def __init__(self, model: torch.nn.Module, *, feature_layers: Sequence[int] = (), lean_attention: bool = True):
        self.model = model
        self.lean_attention = bool(lean_attention)
        self.feature_layers = tuple(int(i) for i in feature_layers)
        params = next(model.parameters())
        self.device = params.device
        self.dtype = params.dtype
        self.max_context = getattr(model.config, "max_position_embeddings", None)
        self._cache_kw = cache_keyword(model)
        self.cache = None

    @classmethod
    def from_target(cls, target, *, feature_layers: Sequence[int] = (), lean_attention: bool = True) -> "TargetAdapter":
        """From a ``LoadedTarget`` (or anything with ``.model``)."""
        return cls(target.model, feature_layers=feature_layers, lean_attention=lean_attention)

    @property
    def cache_len(self) -> int:
        if self.cache is None or not self.cache.layers or not self.cache.layers[0].is_initialized:
            return 0
        return int(self.cache.layers[0].keys.shape[-2])

    # --- forward passes -------------------------------------------------------------------------

    @property
    def attention_kernel(self) -> str:
        """The language attention this adapter's forwards run: the model's own, or the lean GQA kernel."""
        with self._attention():
            return str(text_config(self.model)._attn_implementation)

    def _attention(self):
        """Context for one forward: the lean attention kernel when enabled and the model uses eager."""
        return lean_attention(self.model, self.lean_attention)

    @torch.inference_mode()
    def _forward(self, input_ids, position_ids, attention_mask, logits_to_keep: int = 0, **extra):
        """One forward over the cache: logits ``[rows, V]`` (fp32) and features (or None). ``extra``: further
        model inputs (pixel values of a VLM prefill)."""
        kwargs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                      use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: self.cache}, **extra)
        with self._attention():
            if not self.feature_layers:
                return self.model(**kwargs).logits[0].float(), None
            with capture_features(self.model, self.feature_layers) as capture:
                out = self.model(**kwargs)
                return out.logits[0].float(), capture.features()[0]

    def prefill(self, input_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Start a new sequence: a fresh cache over ``input_ids``.

        Returns the last position's logits ``[V]`` (fp32) and the features of every prompt position
        ``[n, F]`` (or ``None``).
        """

        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).reshape(1, -1)
        n = ids.shape[1]
        if n == 0:
            raise ValueError("empty prompt: give at least one token")
        if self.max_context is not None and n > self.max_context:
            raise ValueError(
                f"prompt has {n} tokens but the model's context is {self.max_context}; shorten the prompt"
            )
        self.cache = DynamicCache(config=self.model.config)
        positions = torch.arange(n, device=self.device).unsqueeze(0)
        logits, features = self._forward(ids, positions, None, logits_to_keep=1)
        return logits[-1], features

    def tree_position_ids(self, start: int, tree: Tree) -> torch.Tensor:
        """Position ids ``[1, N + 1]``: ``start + depth`` (siblings share a position). Override for M-RoPE."""
        return (tree.depth_positions() + start).to(self.device).unsqueeze(0)

    def tree_attention_mask(self, start: int, tree: Tree) -> torch.Tensor:
        """Additive float mask ``[1, 1, N + 1, start + N + 1]``: 0 = visible, dtype minimum = hidden.

        Every tree row sees the whole committed prefix ``[0, start)``; inside the tree a row sees itself
        and its ancestors only (``tree.visibility()``).
        """
        n = tree.n_nodes + 1
        mask = torch.zeros((n, start + n), dtype=self.dtype, device=self.device)
        hidden = ~tree.visibility().to(self.device)
        mask[:, start:].masked_fill_(hidden, torch.finfo(self.dtype).min)
        return mask.view(1, 1, n, start + n)

    def verify(self, root_id: int, tree: Tree, start: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over ``[root] + tree.tokens`` at cache length ``start``.

        Returns logits ``[N + 1, V]`` (fp32; row ``i`` is the target's next-token distribution after the
        path ending at node ``i``) and features ``[N + 1, F]`` (or ``None``). The cache then holds
        ``start + N + 1`` rows until ``commit``. With an empty tree this is a plain one-token step.
        """
        if start != self.cache_len:
            raise RuntimeError(f"verify at start={start} but the cache holds {self.cache_len} positions; "
                               "call commit() after every verify")
        if self.max_context is not None and start + tree.max_depth >= self.max_context:
            raise ValueError(f"tree reaches position {start + tree.max_depth}, beyond the model's context "
                             f"({self.max_context})")
        ids = torch.tensor([(int(root_id),) + tree.tokens], dtype=torch.long, device=self.device)
        positions = self.tree_position_ids(start, tree)
        # a lone root (or a chain) is ordinary causal attention; a chain still gets the explicit mask so
        # that every tree shape goes through the same code path
        mask = None if tree.n_nodes == 0 else self.tree_attention_mask(start, tree)
        return self._forward(ids, positions, mask)

    # --- cache surgery -------------------------------------------------------------------------

    def commit(self, start: int, accepted_nodes: Sequence[int]) -> None:
        """Keep the cache rows of ``accepted_nodes`` (tree node indices on the accepted path, root = 0
        first, in path order) at positions ``start, start + 1, ...`` and drop everything after them.
        """
        nodes = [int(i) for i in accepted_nodes]
        if not nodes or nodes[0] != 0:
            raise ValueError(f"accepted_nodes must start with the root (0), got {nodes}")
        total = self.cache_len
        if start + max(nodes) >= total:
            raise ValueError(f"node {max(nodes)} is not in the cache ({total} rows from start={start})")
        compact_cache(self.cache, start, nodes)

    def truncate(self, length: int) -> None:
        """Drop every cache row at or after ``length``."""
        if not 0 <= length <= self.cache_len:
            raise ValueError(f"cannot truncate a cache of {self.cache_len} rows to {length}")
        for layer in self.cache.layers:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def compact_cache(cache, start: int, nodes: Sequence[int]) -> None:
    """In every layer, move rows ``start + nodes[j]`` to ``start + j`` and truncate to ``start + len(nodes)``.

    Works on the per-layer ``keys``/``values`` tensors ``[batch, kv_heads, seq, head_dim]`` of a
    transformers 5.x ``DynamicCache``; refuses sliding-window layers (their rows are not positions).
    """
    m = len(nodes)
    contiguous = list(nodes) == list(range(m))  # chains: the accepted rows are already in place
    index = None
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError("sliding-window cache layers cannot be compacted by position")
        if not layer.is_initialized:
            continue
        if contiguous:
            layer.keys = layer.keys[..., : start + m, :]
            layer.values = layer.values[..., : start + m, :]
            continue
        if index is None or index.device != layer.keys.device:
            index = torch.tensor(nodes, dtype=torch.long, device=layer.keys.device) + start
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, index)], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, index)], dim=-2)
