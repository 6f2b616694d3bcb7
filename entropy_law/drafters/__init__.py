"""Drafters (torch): n-gram, the block drafter and its training, behind ``decoding.interface.Drafter``.

Drafters import the decoding layer's contracts; the decoding layer never imports a drafter.
"""

from entropy_law.drafters.block import BlockDrafter, BlockDrafterConfig, load_default_drafter
from entropy_law.drafters.ngram import NgramDrafter

__all__ = ["BlockDrafter", "BlockDrafterConfig", "NgramDrafter", "load_default_drafter"]
