"""Drafting arms by name (a drafter plus a tree policy), built for a loaded target.

An AR run's drafter and tree policy are ``"none"``. The block drafter checkpoint is ``$ENTROPY_LAW_BLOCK_DRAFTER``,
else the shipped default; ``find_block_checkpoint`` finds a recorded arm's by its SHA-256. An unavailable block
drafter is reported (``block_drafter_status``) and the other arms go on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from entropy_law.drafters.block import BlockDrafter, check_checkpoint, default_drafter_path
from entropy_law.drafters.hybrid import HybridDrafter
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.traces.layout import file_sha256

BLOCK_DRAFTER_ENV = "ENTROPY_LAW_BLOCK_DRAFTER"
DDTREE_BUDGET = 16
AR = "ar"
# what an AR run writes to its trace metadata (existing traces have these; the analysis looks for them)
AR_DRAFTER_ID = "none"
AR_TREE_POLICY = "none"
BLOCK_READERS = ("block", "hybrid")  # the drafters that load a block drafter checkpoint


@dataclass(frozen=True)
class ArmSpec:
    """``name``: the label of folders and tables; ``drafter``: ``"ngram"``, ``"block"``, ``"hybrid"`` or ``"ar"``;
    ``tree``: ``"chain"`` or ``"ddtree"`` (``"none"`` for AR); ``budget``: draft nodes per tree (DDTree)."""

    name: str
    drafter: str
    tree: str = "chain"
    budget: int | None = None

    @property
    def drafts(self) -> bool:  # False for the autoregressive baseline
        return self.drafter != AR


ARMS = {
    "ar": ArmSpec("ar", AR, AR_TREE_POLICY),
    "ngram": ArmSpec("ngram", "ngram", "chain"),
    "ngram-ddtree16": ArmSpec("ngram-ddtree16", "ngram", "ddtree", DDTREE_BUDGET),
    # other budgets, to time what `entropy-law predict --budgets` prices (bench/predict.py open-ended --arms)
    "ngram-ddtree4": ArmSpec("ngram-ddtree4", "ngram", "ddtree", 4),
    "ngram-ddtree8": ArmSpec("ngram-ddtree8", "ngram", "ddtree", 8),
    "block": ArmSpec("block", "block", "chain"),
    "block-ddtree16": ArmSpec("block-ddtree16", "block", "ddtree", DDTREE_BUDGET),
}


def arm_spec(name: str) -> ArmSpec:
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; known: {', '.join(ARMS)}")
    return ARMS[name]


def block_drafter_checkpoint() -> Path | None:
    """The block drafter checkpoint a run uses when none is named: ``$ENTROPY_LAW_BLOCK_DRAFTER``, else the
    shipped default by name (``default_drafter_path``); ``None`` if that is absent."""
    env = os.environ.get(BLOCK_DRAFTER_ENV)
    if env:
        return Path(env)
    path = default_drafter_path()
    return path if path.is_file() else None


def find_block_checkpoint(sha256: str) -> Path | None:
    """The checkpoint with SHA-256 ``sha256`` among ``$ENTROPY_LAW_BLOCK_DRAFTER`` and ``data/drafters/``, or None."""
    folder = default_drafter_path().parent
    candidates = dict.fromkeys([block_drafter_checkpoint(),  # each file hashed once
                                *(sorted(folder.glob("*.safetensors")) if folder.is_dir() else [])])
    return next((path for path in candidates if path is not None and path.is_file() and file_sha256(path) == sha256),
                None)


def block_drafter_status() -> tuple[bool, str]:
    """(available, message): whether the shipped block drafter checkpoint can be loaded here, and why not."""
    path = block_drafter_checkpoint()
    if path is None:
        return False, (f"block drafter unavailable: no checkpoint under data/drafters/ (or set {BLOCK_DRAFTER_ENV}); "
                       "carrying on with the n-gram drafter")
    if not path.is_file():
        return False, f"block drafter unavailable: checkpoint {path} not found; carrying on with the n-gram drafter"
    return True, f"block drafter checkpoint: {path}"


def load_block_drafter(target, compute_dtype: str = "float32"):
    """The shipped block drafter for ``target`` (raises ``FileNotFoundError`` / ``ValueError`` with the reason)."""
    ok, message = block_drafter_status()
    if not ok:
        raise FileNotFoundError(message)
    return BlockDrafter.load(block_drafter_checkpoint(), target, compute_dtype=compute_dtype)


def make_drafter(spec: ArmSpec, target=None, *, ngram_options: dict | None = None,
                 checkpoint: str | Path | None = None, compute_dtype: str = "float32",
                 hybrid_options: dict | None = None):
    """A fresh drafter for ``spec`` (``None`` for AR): the block drafter from ``checkpoint`` (default: the shipped
    one) for ``target`` in ``compute_dtype``; ``ngram_options`` / ``hybrid_options`` go to those drafters."""
    if spec.drafter == AR:
        return None
    if spec.drafter == "ngram":
        return NgramDrafter(**(ngram_options or {}))
    if spec.drafter == "block":
        return (load_block_drafter(target, compute_dtype) if checkpoint is None
                else BlockDrafter.load(checkpoint, target, compute_dtype=compute_dtype))
    if spec.drafter == "hybrid":  # prompt lookup and the block drafter behind one drafter
        block = make_drafter(ArmSpec(spec.name, "block"), target, checkpoint=checkpoint, compute_dtype=compute_dtype)
        return HybridDrafter(NgramDrafter(**(ngram_options or {})), block, **(hybrid_options or {}))
    raise ValueError(f"unknown drafter {spec.drafter!r}")


def available_arms(names, target=None) -> tuple[list[ArmSpec], list[str]]:
    """(specs that can run here, messages about the ones left out). With ``target``, the block drafter's
    checkpoint header is checked against it: another target leaves the block arms out, with the reason."""
    specs, messages = [], []
    block_ok, block_message = block_drafter_status()
    if block_ok and target is not None and any(arm_spec(n).drafter in BLOCK_READERS for n in names):
        try:
            check_checkpoint(block_drafter_checkpoint(), target)
        except ValueError as err:
            block_ok, block_message = False, (
                f"block drafter unavailable for this target: {err}; carrying on with the other arms (train one for "
                "it with entropy-law train-drafter, and point ENTROPY_LAW_BLOCK_DRAFTER at it)")
    for name in names:
        spec = arm_spec(name)
        if spec.drafter in BLOCK_READERS and not block_ok:
            if block_message not in messages:
                messages.append(block_message)
            continue
        specs.append(spec)
    return specs, messages
