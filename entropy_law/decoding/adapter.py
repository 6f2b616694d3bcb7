"""The target side of speculative decoding: one Hugging Face causal LM (batch 1), its KV cache, one forward per call.

Prefill; verify a tree in one forward (committed prefix visible, tree ancestor-only, positions ``start + depth``);
``commit`` keeps the accepted cache rows (gather-and-truncate, never ``DynamicCache.crop``). Sliding-window layers
record their past so rejected rows can be dropped, then keep the last ``min(length, W - 1)`` committed positions
as greedy ``generate`` does; hybrid models get a mask per ``config.layer_types``. ``CacheLayout`` refuses any
other layout (``UnsupportedCacheLayout``). A VLM subclass overrides ``tree_position_ids`` and ``prefill``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from entropy_law.decoding.attention import lean_attention, text_config
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.tree import Tree

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def cache_keyword(model: torch.nn.Module) -> str:
    """Name of the cache argument of ``model.forward`` (``cache`` in recent 5.x, ``past_key_values`` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def left_padded(sequences: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """Input ids, attention mask and position ids ``[b, longest]`` of a left-padded batch of token id lists."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, sequence in enumerate(sequences):
        ids[i, width - len(sequence):] = torch.tensor(sequence, dtype=torch.long)
        mask[i, width - len(sequence):] = 1
    return ids.to(device), mask.to(device), (mask.cumsum(-1) - 1).clamp(min=0).to(device)


class UnsupportedCacheLayout(NotImplementedError):
    """The target's KV cache has a layout the adapter cannot keep and roll back (raised when it is built)."""


@dataclass(frozen=True)
class CacheLayout:
    """What every decoder layer's KV cache keeps: ``windows[i]`` is ``None`` (full attention) or the sliding
    window ``W``; ``layer_types``: the keys of a mapping of masks (``config.layer_types``), or ``None``."""

    model_type: str
    windows: tuple[int | None, ...]
    layer_types: tuple[str, ...] | None = None

    @property
    def distinct_windows(self) -> tuple[int | None, ...]:
        """The different windows, ``None`` (full attention) first."""
        return tuple(sorted(set(self.windows) or {None}, key=lambda w: -1 if w is None else w))

    @property
    def is_hybrid(self) -> bool:
        """Layers with different windows: the model must be given one mask per layer type."""
        return len(self.distinct_windows) > 1


_WHAT_TO_DO = ("Decode this model with plain greedy `model.generate`, or teach entropy_law/decoding/adapter.py "
               "(cache_layout, compact_cache, tree_attention_mask) this layout.")


def _unsupported(model_type: str, layer: int, layer_type: str, why: str) -> UnsupportedCacheLayout:
    return UnsupportedCacheLayout(
        f"{model_type}: decoder layer {layer} is a '{layer_type}' layer, and speculative decoding cannot keep "
        f"its KV cache: {why}. The adapter keeps and rolls back 'full_attention' and 'sliding_attention' "
        f"layers only. {_WHAT_TO_DO}")


def cache_layout(model: torch.nn.Module) -> CacheLayout:
    """The ``CacheLayout`` of ``model``'s language model (from the configuration, no tensors allocated), or
    ``UnsupportedCacheLayout`` naming the first layer that cannot be kept and what to do."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") \
        else model.config
    model_type = str(getattr(config, "model_type", None) or type(model).__name__)
    names = getattr(config, "layer_types", None)
    names = tuple(str(n) for n in names) if names is not None else None
    if getattr(config, "use_bidirectional_attention", False) or not getattr(config, "is_causal", True):
        raise _unsupported(model_type, 0, names[0] if names else "bidirectional",
                           "its attention is bidirectional, so a tree node would see its descendants")
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception as err:  # transformers cannot build a dynamic cache from this configuration
        raise UnsupportedCacheLayout(f"{model_type}: transformers builds no DynamicCache from this configuration "
                                     f"({type(err).__name__}: {err}). {_WHAT_TO_DO}") from err
    if not layers:  # transformers adds plain full-attention layers as the forward goes
        return CacheLayout(model_type, (), None)
    config_window = getattr(config, "sliding_window", None)
    windows: list[int | None] = []
    for i, layer in enumerate(layers):
        name = names[i] if names is not None and i < len(names) else None
        kind = type(layer)
        if kind is DynamicLayer and name in (None, FULL_ATTENTION):
            windows.append(None)
            continue
        if kind is not DynamicSlidingWindowLayer or name not in (None, SLIDING_ATTENTION) or config_window is None:
            why = (f"transformers keeps it in a {kind.__name__}, whose rows are neither every committed "
                   "position nor the last ones of a window") if kind is not DynamicSlidingWindowLayer else \
                  "its mask is not a sliding window (chunked attention restarts at every chunk boundary)"
            raise _unsupported(model_type, i, name or kind.__name__, why)
        if int(layer.sliding_window) != int(config_window):
            raise _unsupported(model_type, i, SLIDING_ATTENTION,
                               f"its cache window ({layer.sliding_window}) differs from the sliding_window of "
                               f"the configuration ({config_window}), which transformers builds the mask with")
        if not hasattr(layer, "activate_past_recording"):
            raise _unsupported(model_type, i, SLIDING_ATTENTION, "this transformers version drops the rows of "
                               "rejected drafts at every forward (no activate_past_recording); upgrade it")
        windows.append(int(layer.sliding_window))
    if len(set(windows)) > 1 and names is None:
        raise _unsupported(model_type, windows.index(config_window), SLIDING_ATTENTION,
                           "the model mixes full and sliding layers without config.layer_types, so it cannot "
                           "be given one mask per layer type")
    return CacheLayout(model_type, tuple(windows), names)


def truncate_cache(cache, length: int) -> None:
    """Keep the committed positions ``[0, length)``: every row in a full-attention layer, the last
    ``min(length, W - 1)`` in a sliding-window layer (the rows greedy decoding holds there)."""
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if not layer.is_sliding:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
            continue
        first = layer.cumulative_length - layer.keys.shape[-2]  # position of the layer's row 0
        lo = max(0, length - (layer.sliding_window - 1))
        if lo < first or length > layer.cumulative_length:
            raise ValueError(f"cannot truncate a sliding-window layer holding positions {first}.."
                             f"{layer.cumulative_length - 1} to length {length}")
        layer.keys = layer.keys[..., lo - first: length - first, :]
        layer.values = layer.values[..., lo - first: length - first, :]
        layer.cumulative_length = length


def compact_cache(cache, start: int, nodes: Sequence[int]) -> None:
    """In every layer of a ``DynamicCache``, keep the rows of tree nodes ``nodes`` (verified at ``start``) as
    positions ``start, start + 1, ...``, drop the other tree rows and trim to ``start + len(nodes)``."""
    nodes = [int(i) for i in nodes]
    m = len(nodes)
    contiguous = nodes == list(range(m))  # chains: the accepted rows are already in place
    index = None
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if not isinstance(layer, DynamicLayer):
            raise NotImplementedError(f"cannot compact a {type(layer).__name__} cache layer")
        rows = layer.keys.shape[-2]
        if layer.is_sliding:
            if not getattr(layer, "record_past", False):
                raise RuntimeError("a sliding-window layer that does not record its past has dropped the rows "
                                   "of this verify; build caches with TargetAdapter.new_cache()")
            root_row = rows - (layer.cumulative_length - start)
        else:
            root_row = start
        if contiguous:
            layer.keys = layer.keys[..., : root_row + m, :]
            layer.values = layer.values[..., : root_row + m, :]
        else:
            if index is None or index.device != layer.keys.device:
                index = torch.tensor(nodes, dtype=torch.long, device=layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :root_row, :], layer.keys.index_select(-2, index + root_row)],
                                   dim=-2)
            layer.values = torch.cat([layer.values[..., :root_row, :],
                                      layer.values.index_select(-2, index + root_row)], dim=-2)
        if layer.is_sliding:
            layer.cumulative_length = start + m
    truncate_cache(cache, start + m)  # sliding layers: back to their window


class TargetAdapter:
    """Wraps a causal LM (eval mode, batch 1) and owns its KV cache, which between calls holds the committed
    positions ``0 .. cache_len - 1`` (``verify`` appends ``N + 1`` rows, ``commit`` restores that).
    ``feature_layers``: decoder layers whose outputs are returned with the logits, concatenated (empty: None)."""

    def __init__(self, model: torch.nn.Module, *, feature_layers: Sequence[int] = (), lean_attention: bool = True):
        self.model = model
        self.layout = cache_layout(model)
        self.lean_attention = bool(lean_attention)
        self.feature_layers = tuple(int(i) for i in feature_layers)
        params = next(model.parameters())
        self.device = params.device
        self.dtype = params.dtype
        self.max_context = getattr(model.config, "max_position_embeddings", None)
        self._cache_kw = cache_keyword(model)
        self.cache = None

    @property
    def cache_len(self) -> int:
        """Committed positions (plus the rows of an uncommitted verify)."""
        if self.cache is None or not self.cache.layers or not self.cache.layers[0].is_initialized:
            return 0
        return int(self.cache.layers[0].get_seq_length())  # sliding layers count positions, not rows

    def new_cache(self) -> DynamicCache:
        """An empty cache for the model; its sliding-window layers record their past until we trim them."""
        cache = DynamicCache(config=self.model.config)
        for layer in cache.layers:
            if layer.is_sliding:
                layer.activate_past_recording()
        return cache

    @property
    def attention_kernel(self) -> str:
        """The language attention this adapter's forwards run: the model's own, or the lean GQA kernel."""
        with self._attention():
            return str(text_config(self.model)._attn_implementation)

    def _attention(self):  # the lean attention kernel when enabled and the model uses eager
        return lean_attention(self.model, self.lean_attention)

    @torch.inference_mode()
    def _forward(self, input_ids, position_ids, attention_mask, logits_to_keep: int = 0, **extra):
        """One forward over the cache: logits ``[rows, V]`` (fp32) and features (or None); ``extra``: model inputs."""
        kwargs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                      use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: self.cache}, **extra)
        with self._attention():
            if not self.feature_layers:
                return self.model(**kwargs).logits[0].float(), None
            with capture_features(self.model, self.feature_layers) as capture:
                out = self.model(**kwargs)
                return out.logits[0].float(), capture.features()[0]

    def _prefill_forward(self, ids: torch.Tensor, positions: torch.Tensor, **extra):
        """A fresh cache, one causal forward over ``ids`` ``[1, n]``, sliding layers trimmed to their window:
        the last position's logits ``[V]`` and the features ``[n, F]`` (or ``None``)."""
        self.cache = self.new_cache()
        logits, features = self._forward(ids, positions, None, logits_to_keep=1, **extra)
        truncate_cache(self.cache, ids.shape[1])
        return logits[-1], features

    def prefill(self, input_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A fresh cache over the prompt: the last position's logits ``[V]`` (fp32), the features ``[n, F]`` or None."""
        ids = self._prompt_tensor(input_ids)
        return self._prefill_forward(ids, torch.arange(ids.shape[1], device=self.device).unsqueeze(0))

    def _prompt_tensor(self, input_ids, advice: str = "shorten the prompt") -> torch.Tensor:
        """``input_ids`` as ``[1, n]`` on the device; ``ValueError`` if empty or longer than the context."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).reshape(1, -1)
        n = ids.shape[1]
        if n == 0:
            raise ValueError("empty prompt: give at least one token")
        if self.max_context is not None and n > self.max_context:
            raise ValueError(f"prompt has {n} tokens but the model's context is {self.max_context}; {advice}")
        return ids

    def tree_position_ids(self, start: int, tree: Tree) -> torch.Tensor:
        """Position ids ``[1, N + 1]``: ``start + depth`` (siblings share a position). Override for M-RoPE."""
        return (tree.depth_positions() + start).to(self.device).unsqueeze(0)

    def tree_attention_mask(self, start: int, tree: Tree, window: int | None = None) -> torch.Tensor:
        """Additive mask ``[1, 1, N + 1, keys]`` (0: visible, dtype minimum: hidden): a tree row sees itself and
        its ancestors; with full attention (``window=None``) the whole prefix, ``keys = start + N + 1``; with a
        window ``W``, the last ``r = min(start, W - 1)`` committed keys, each only if ``start + depth - k < W``."""
        n = tree.n_nodes + 1
        prefix = start if window is None else min(start, window - 1)
        hidden_tree = ~tree.visibility()
        mask = torch.zeros((n, prefix + n), dtype=self.dtype, device=self.device)
        lowest = torch.finfo(self.dtype).min
        if window is not None:
            depth = tree.depth_positions()
            hidden_tree |= depth[:, None] - depth[None, :] >= window  # ancestors too far up
            # committed key c of the prefix is at start - prefix + c: out of the window iff
            # (start + depth) - (start - prefix + c) >= window
            hidden_prefix = torch.arange(prefix)[None, :] <= depth[:, None] + prefix - window
            mask[:, :prefix].masked_fill_(hidden_prefix.to(self.device), lowest)
        mask[:, prefix:].masked_fill_(hidden_tree.to(self.device), lowest)
        return mask.view(1, 1, n, prefix + n)

    def tree_attention_masks(self, start: int, tree: Tree) -> torch.Tensor | Mapping[str, torch.Tensor]:
        """What the model is given: one mask when every layer has the same window, else a mask per layer type
        (``{"full_attention": ..., "sliding_attention": ...}``)."""
        windows = self.layout.distinct_windows
        if len(windows) == 1:
            return self.tree_attention_mask(start, tree, windows[0])
        masks = {window: self.tree_attention_mask(start, tree, window) for window in windows}
        return {name: masks[window] for name, window in zip(self.layout.layer_types, self.layout.windows)}

    def verify(self, root_id: int, tree: Tree, start: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over ``[root] + tree.tokens`` at cache length ``start``: logits ``[N + 1, V]`` (fp32; row
        ``i`` follows the path ending at node ``i``) and features (or ``None``); ``commit`` must follow."""
        if start != self.cache_len:
            raise RuntimeError(f"verify at start={start} but the cache holds {self.cache_len} positions; "
                               "call commit() after every verify")
        if self.max_context is not None and start + tree.max_depth >= self.max_context:
            raise ValueError(f"tree reaches position {start + tree.max_depth}, beyond the model's context "
                             f"({self.max_context})")
        ids = torch.tensor([(int(root_id),) + tree.tokens], dtype=torch.long, device=self.device)
        positions = self.tree_position_ids(start, tree)
        mask = None if tree.n_nodes == 0 else self.tree_attention_masks(start, tree)
        return self._forward(ids, positions, mask)

    def commit(self, start: int, accepted_nodes: Sequence[int]) -> None:
        """Keep the rows of ``accepted_nodes`` (root 0 first) at positions ``start, start + 1, ...``; drop the rest."""
        nodes = [int(i) for i in accepted_nodes]
        if not nodes or nodes[0] != 0:
            raise ValueError(f"accepted_nodes must start with the root (0), got {nodes}")
        total = self.cache_len
        if start + max(nodes) >= total:
            raise ValueError(f"node {max(nodes)} is not in the cache ({total} rows from start={start})")
        compact_cache(self.cache, start, nodes)

    def truncate(self, length: int) -> None:
        """Drop every cache position at or after ``length`` (``truncate_cache``)."""
        if not 0 <= length <= self.cache_len:
            raise ValueError(f"cannot truncate a cache of {self.cache_len} rows to {length}")
        truncate_cache(self.cache, length)
