"""GLANCE-style one-pass block drafter (placeholder: filled in below)."""

from __future__ import annotations


def default_feature_layers(num_target_layers: int, n: int = 3) -> tuple[int, ...]:
    """DFlash's choice of target layers: ``L // 2`` for one feature, else ``n`` evenly spaced from 1 to L-3."""
    if num_target_layers < 4:
        raise ValueError(f"a target with {num_target_layers} layers is too shallow for feature selection")
    if n == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(int(round(1 + i * span / (n - 1))) for i in range(n))
