"""Drafting arms by name: a drafter id plus a tree policy, built for a loaded target.

Known here: the arms the demo and the reference-trace script decode with (``ngram`` chain, ``ngram``
DDTree, ``block`` chain / DDTree N=16, and ``ar``, the autoregressive baseline), where the shipped block
drafter checkpoint is looked for (``$ENTROPY_LAW_BLOCK_DRAFTER``, else the first ``*.safetensors``
under ``data/drafters/``), and how to say that the block drafter is unavailable (no checkpoint, or a
checkout without ``entropy_law.drafters.block``) without failing: ``block_drafter_status``
returns the reason, callers print it and carry on with the other arms.

Not known here: decoding (``SpeculativeDecoder``), recording, replay (``scripts/make_reference_traces.py``).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

BLOCK_DRAFTER_ENV = "ENTROPY_LAW_BLOCK_DRAFTER"
DDTREE_BUDGET = 16


@dataclass(frozen=True)
class ArmSpec:
    """``name``: label used in folders and tables; ``drafter``: ``"ngram"``, ``"block"`` or ``"ar"``;
    ``tree``: ``"chain"`` or ``"ddtree"``; ``budget``: draft nodes per tree (DDTree)."""

    name: str
    drafter: str
    tree: str = "chain"
    budget: int | None = None


ARMS = {
    "ar": ArmSpec("ar", "ar", "none"),
    "ngram": ArmSpec("ngram", "ngram", "chain"),
    "ngram-ddtree16": ArmSpec("ngram-ddtree16", "ngram", "ddtree", DDTREE_BUDGET),
    "block": ArmSpec("block", "block", "chain"),
    "block-ddtree16": ArmSpec("block-ddtree16", "block", "ddtree", DDTREE_BUDGET),
}


def arm_spec(name: str) -> ArmSpec:
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known: {', '.join(ARMS)}")
    return ARMS[name]


def block_drafter_checkpoint() -> Path | None:
    """The block drafter checkpoint: ``$ENTROPY_LAW_BLOCK_DRAFTER``, else the first (sorted)
    ``*.safetensors`` under ``data/drafters/`` of the checkout; ``None`` if there is none."""
    env = os.environ.get(BLOCK_DRAFTER_ENV)
    if env:
        return Path(env)
    folder = Path(__file__).resolve().parents[2] / "data" / "drafters"
    found = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return found[0] if found else None


def block_drafter_status() -> tuple[bool, str]:
    """(available, message): whether the block drafter can be loaded here, and why not."""
    try:
        importlib.import_module("entropy_law.drafters.block")
    except ModuleNotFoundError:
        return False, ("block drafter unavailable: this checkout has no entropy_law.drafters.block "
                       "(it lands with the drafter branch); carrying on with the n-gram drafter")
    path = block_drafter_checkpoint()
    if path is None:
        return False, (f"block drafter unavailable: no checkpoint under data/drafters/ (or set {BLOCK_DRAFTER_ENV}); "
                       "carrying on with the n-gram drafter")
    if not path.is_file():
        return False, f"block drafter unavailable: checkpoint {path} not found; carrying on with the n-gram drafter"
    return True, f"block drafter checkpoint: {path}"


def load_block_drafter(target):
    """The shipped block drafter for ``target`` (raises ``FileNotFoundError`` / ``ValueError`` with the reason)."""
    ok, message = block_drafter_status()
    if not ok:
        raise FileNotFoundError(message)
    module = importlib.import_module("entropy_law.drafters.block")
    return module.BlockDrafter.load(block_drafter_checkpoint(), target)


def make_drafter(spec: ArmSpec, target=None, *, ngram_options: dict | None = None):
    """A fresh drafter for ``spec`` (``None`` for AR). The n-gram drafter keeps no state across
    requests beyond ``begin``; the block drafter needs ``target``."""
    if spec.drafter == "ar":
        return None
    if spec.drafter == "ngram":
        from entropy_law.drafters.ngram import NgramDrafter

        return NgramDrafter(**(ngram_options or {}))
    if spec.drafter == "block":
        return load_block_drafter(target)
    raise ValueError(f"unknown drafter {spec.drafter!r}")


def available_arms(names) -> tuple[list[ArmSpec], list[str]]:
    """(specs that can run here, messages about the ones left out)."""
    specs, messages = [], []
    block_ok, block_message = block_drafter_status()
    for name in names:
        spec = arm_spec(name)
        if spec.drafter == "block" and not block_ok:
            if block_message not in messages:
                messages.append(block_message)
            continue
        specs.append(spec)
    return specs, messages
