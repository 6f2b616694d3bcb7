"""Capture the output hidden states of chosen target decoder layers with forward hooks.

The feature of layer ``i`` is the output of ``decoder_layers(model)[i]`` (before the final norm); a position's
feature vector concatenates ``layers`` in the order given, ``[rows, len(layers) * H]``. Hooks, because
``output_hidden_states``' indexing differs across transformers versions.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    for path in ("model.layers", "model.language_model.layers", "language_model.model.layers",
                 "model.text_model.layers"):
        try:
            obj = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


class FeatureCapture:
    def __init__(self, layers: Sequence[int]):
        self.layers = tuple(int(i) for i in layers)
        self._outputs: dict[int, torch.Tensor] = {}

    def _hook(self, index: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            self._outputs[index] = hidden.detach()

        return hook

    def features(self) -> torch.Tensor:
        """``[batch, seq, len(layers) * H]`` from the last forward pass."""
        missing = [i for i in self.layers if i not in self._outputs]
        if missing:
            raise RuntimeError(f"no hidden states captured for layers {missing}; run a forward pass first")
        return torch.cat([self._outputs[i] for i in self.layers], dim=-1)

    def clear(self) -> None:
        self._outputs.clear()


@contextmanager
def capture_features(model: torch.nn.Module, layers: Sequence[int]) -> Iterator[FeatureCapture]:
    """Context manager: register hooks on ``layers`` and remove them on exit."""
    capture = FeatureCapture(layers)
    blocks = decoder_layers(model)
    bad = [i for i in capture.layers if not 0 <= i < len(blocks)]
    if bad:
        raise ValueError(f"feature layers {bad} out of range: the model has {len(blocks)} layers")
    handles = [blocks[i].register_forward_hook(capture._hook(i)) for i in capture.layers]
    try:
        yield capture
    finally:
        for handle in handles:
            handle.remove()
