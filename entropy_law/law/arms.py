"""Arms: which runs of a trace set belong together, and what a reader calls them, from the ``runs`` table alone.

An **arm**, the unit one law describes, is one target model, drafter (checkpoint SHA-256 and settings), tree policy and
budget, and drafting gate (a law policy: the hash of its parameters); AR runs form one arm per model. Its **label**
(``"ngram chain"``, ``"AR"``) gains what tells it apart only where two arms would share it. The **machine** of a run
(model, device, host) says which AR run its timings compare with.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd

AR_LABEL = "AR"  # label of the autoregressive baseline in tables
AR_DRAFTER_IDS = ("none", "ar")
AR_TREE_POLICY = "none"
GATE_COST = "cost"
GATE_RATIO = "ratio"
GATE_POLICY = "law-policy"


class ArmKey(NamedTuple):
    """What makes two runs one arm. AR runs: ``drafter_id`` is ``AR_LABEL`` and only ``model_id`` counts."""

    model_id: str | None
    drafter_id: str
    checkpoint_sha256: str | None
    tree_policy: str | None
    tree_budget: int | None
    gate: str | None  # "cost", "ratio", "ratio <r>" (the ratio gate with its recorded ratio r); None for AR
    drafter_settings: str | None = None  # drafter_config as canonical JSON (no checkpoint path / SHA); None for AR


class Machine(NamedTuple):
    """Where a run was timed: timings (and so speedups) compare only on one machine."""

    model_id: str | None
    device: str | None
    host: str | None

    def __str__(self) -> str:
        host = f" on host {self.host}" if self.host is not None else ""
        return f"model {self.model_id or '?'} on device {self.device or '?'}{host}"


def _missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def _text(value) -> str | None:
    return None if _missing(value) else str(value)


def _integer(value) -> int | None:
    if _missing(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _column(runs: pd.DataFrame, name: str) -> list:
    return list(runs[name]) if name in runs else [None] * len(runs)


def arm_label(drafter_id: str, tree_policy, tree_budget=None) -> str:
    """``"ngram chain"``, ``"block-drafter-b8-l1 ddtree16"``: a drafter with its tree policy (and a DDTree's budget)."""
    policy = _text(tree_policy) or ""
    budget = _integer(tree_budget) if policy == "ddtree" else None
    return f"{drafter_id} {policy}{'' if budget is None else budget}".strip()


def is_ar_run(drafter_id, tree_policy) -> bool:
    """An AR run says it has no drafter: ``drafter_id`` "none" / "ar" or ``tree_policy`` "none"."""
    return str(drafter_id) in AR_DRAFTER_IDS or str(tree_policy) == AR_TREE_POLICY


def _gate(gate, verify_cost, ratio) -> str:
    """The gate as written, else the cost gate where a ``verify_cost`` curve is recorded, else the ratio gate."""
    named = _text(gate)
    if named == GATE_COST or (named is None and not _missing(verify_cost) and verify_cost is not False):
        return GATE_COST
    if named not in (None, GATE_RATIO):
        return named  # a gate this module does not know: its own arm
    if _missing(ratio):
        return GATE_RATIO  # the ratio was not written down
    return f"{GATE_RATIO} {float(ratio):g}"


def policy_gate(policy) -> str | None:
    """``"law-policy:<8 hex>"``: the SHA-256 of a law policy's parameters without ``verify_cost``; or None."""
    if _missing(policy) or policy is False:
        return None
    text = str(policy)
    if isinstance(policy, dict):
        text = json.dumps({k: v for k, v in policy.items() if k != "verify_cost"}, sort_keys=True, default=str)
    return f"{GATE_POLICY}:{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _checkpoint(config) -> str | None:
    return _text(config.get("checkpoint_sha256")) if isinstance(config, dict) else None


# where a checkpoint lies is not what it is (its SHA-256 is ArmKey.checkpoint_sha256)
_NOT_SETTINGS = ("checkpoint", "checkpoint_sha256")


def _settings(config) -> str | None:
    """The drafter's settings as canonical JSON without the checkpoint; None where the run recorded none."""
    if not isinstance(config, dict):
        return None
    kept = {k: v for k, v in config.items() if k not in _NOT_SETTINGS}
    return json.dumps(kept, sort_keys=True, default=str) if kept else None


def run_checkpoints(runs: pd.DataFrame) -> list[str]:
    """The distinct checkpoint SHA-256s the runs' drafters were loaded from, sorted."""
    if "drafter_config" not in runs:
        return []
    return sorted({sha for sha in map(_checkpoint, runs["drafter_config"]) if sha})


def arm_keys(runs: pd.DataFrame) -> list[ArmKey]:
    """One ``ArmKey`` per row of ``runs`` (missing metadata columns read as not recorded)."""
    keys = []
    for model, drafter, config, policy, budget, gate, cost, ratio, law_policy in zip(
            _column(runs, "model_id"), _column(runs, "drafter_id"), _column(runs, "drafter_config"),
            _column(runs, "tree_policy"), _column(runs, "tree_budget"), _column(runs, "gate"),
            _column(runs, "verify_cost"), _column(runs, "verify_cost_ratio"), _column(runs, "policy")):
        if is_ar_run(drafter, policy):
            keys.append(ArmKey(_text(model), AR_LABEL, None, AR_TREE_POLICY, None, None))
        else:
            keys.append(ArmKey(_text(model), str(drafter), _checkpoint(config), _text(policy), _integer(budget),
                               policy_gate(law_policy) or _gate(gate, cost, ratio), _settings(config)))
    return keys


def machines(runs: pd.DataFrame) -> list[Machine]:
    """One ``Machine`` per row of ``runs``: model, ``device`` and ``host`` (None where not recorded)."""
    return [Machine(_text(m), _text(d), _text(h))
            for m, d, h in zip(_column(runs, "model_id"), _column(runs, "device"), _column(runs, "host"))]


def _gate_part(key: ArmKey) -> str:
    if (key.gate or "").startswith(GATE_POLICY):
        return key.gate
    return key.gate.replace(" ", "-gate") if " " in (key.gate or "") else f"{key.gate}-gate"


# the parts that may tell two arms with one base label apart, in the order they are added
_DISTINGUISHING = (
    ("model_id", lambda key: key.model_id or "unknown-model"),
    ("checkpoint_sha256", lambda key: f"sha256:{key.checkpoint_sha256[:8]}" if key.checkpoint_sha256
     else "no-checkpoint"),
    ("gate", _gate_part),
    ("tree_budget", lambda key: f"budget{key.tree_budget}" if key.tree_budget is not None else "no-budget"),
)


def base_label(key: ArmKey) -> str:
    return AR_LABEL if key.drafter_id == AR_LABEL else arm_label(key.drafter_id, key.tree_policy, key.tree_budget)


def arm_labels(keys: Sequence[ArmKey]) -> dict[ArmKey, str]:
    """A readable, unique label per distinct key: ``base_label``, plus what tells apart the keys that share it."""
    distinct = list(dict.fromkeys(keys))
    groups: dict[str, list[ArmKey]] = {}
    for key in distinct:
        groups.setdefault(base_label(key), []).append(key)
    labels = {}
    for base, group in groups.items():
        varying = [(field, part) for field, part in _DISTINGUISHING
                   if len({getattr(k, field) for k in group}) > 1]
        # the settings that differ, unless checkpoints already tell the drafters apart
        settings = {} if "checkpoint_sha256" in dict(varying) else _varying_settings(group)
        for key in group:
            label = base
            for field, part in varying:
                label = f"{part(key)}/{label}" if field == "model_id" else f"{label} {part(key)}"
            labels[key] = f"{label} {settings[key]}" if settings else label
    seen: dict[str, int] = {}
    for key in distinct:  # a last guard (e.g. two checkpoints whose SHA-256 share 8 hex digits)
        n = seen[labels[key]] = seen.get(labels[key], 0) + 1
        if n > 1:
            labels[key] = f"{labels[key]} #{n}"
    return labels


def _varying_settings(group: Sequence[ArmKey]) -> dict[ArmKey, str]:
    """Per key of ``group``, the drafter settings that differ within it (``"block_size=3 max_ngram=1"``)."""
    if len({k.drafter_settings for k in group}) < 2:
        return {}
    parsed = {k: json.loads(k.drafter_settings) if k.drafter_settings else {} for k in group}
    names = sorted({n for p in parsed.values() for n in p})
    differ = [n for n in names if len({json.dumps(p.get(n), sort_keys=True, default=str) for p in parsed.values()}) > 1]
    return {k: " ".join(f"{n}={json.dumps(p[n], default=str) if n in p else 'unset'}" for n in differ)
            for k, p in parsed.items()}


def run_arms(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: ``run_id``, ``is_ar``, ``arm_key``, ``arm`` (the label) and ``machine``; a runs table that
    carries ``arm_key`` and ``arm`` (``make_view``) keeps its labels."""
    if {"arm_key", "arm"} <= set(runs.columns):
        keys, labels = list(runs["arm_key"]), list(runs["arm"])
    else:
        keys = arm_keys(runs)
        named = arm_labels(keys)
        labels = [named[k] for k in keys]
    return pd.DataFrame({"run_id": runs["run_id"].astype(str).to_numpy(),
                         "is_ar": [k.drafter_id == AR_LABEL for k in keys],
                         "arm_key": pd.Series(keys, dtype=object).to_numpy(), "arm": labels,
                         "machine": pd.Series(machines(runs), dtype=object).to_numpy()})


def describe_arms(arms: pd.DataFrame) -> str:
    """``"ngram chain (runs r1), ngram ddtree16 (runs r2)"``: the arms of ``run_arms`` rows with their runs."""
    parts = [f"{label} (runs {', '.join(part['run_id'])})" for label, part in arms.groupby("arm", sort=False)]
    return ", ".join(parts)


def check_one_arm_per_drafter(runs: pd.DataFrame, run_ids=None) -> None:
    """Raise where the runs ``run_ids`` (default: all) hold two arms under one ``drafter_id``, naming them."""
    arms = run_arms(runs).assign(drafter_id=runs["drafter_id"].astype(str).to_numpy())
    if run_ids is not None:
        arms = arms.loc[arms["run_id"].isin({str(r) for r in run_ids})]
    arms = arms.loc[~arms["is_ar"]]
    mixed = [(d, part) for d, part in arms.groupby("drafter_id", sort=False) if part["arm_key"].nunique() > 1]
    if not mixed:
        return
    found = "; ".join(f"drafter_id {d!r} holds {part['arm_key'].nunique()} arms: {describe_arms(part)}"
                      for d, part in mixed)
    raise ValueError(
        f"the traces mix arms that one law must not pool ({found}). An arm is one model, drafter (checkpoint and "
        "settings), tree policy, budget and drafting gate. Select one arm with traces.filter(run_id=[...]) (its runs "
        "above), "
        "or let TraceAnalysis(traces) split the arms (its arm_view(label) is one arm; make_view(traces) relabels "
        "drafter_id with the arm labels, so drafter='<label>' selects one where a function takes drafter=).")
