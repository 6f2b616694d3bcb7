"""Drafters (torch): the draft sources that plug into the decoder through ``decoding.interface.Drafter``.

``ngram`` (prompt lookup over prompt + output), ``block`` (the one-pass block drafter over fused target
states: the network, its online state, checkpoint I/O) and ``training`` (the block drafter's data
generation, losses and training loop). Drafters import the decoding layer's contracts; the decoding
layer never imports a drafter.
"""

from entropy_law.drafters.block import BlockDrafter, BlockDrafterConfig, load_default_drafter
from entropy_law.drafters.ngram import NgramDrafter

__all__ = ["BlockDrafter", "BlockDrafterConfig", "NgramDrafter", "load_default_drafter"]
