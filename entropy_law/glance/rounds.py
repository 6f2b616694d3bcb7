"""GLANCE's round logs (JSONL, ``ROUND_LOG_FIELDS``): the per-round table of any round data (``round_table``,
``glance_rounds``), its import (errors name file:line and field) and its export (rows GLANCE's fit reads)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from entropy_law.law import arms, atrisk
from entropy_law.prompts.paths import read_json_lines

ROUND_LOG_FIELDS = ("round", "entropy", "accepted", "tau", "tree_size", "extended", "task", "prompt")
REQUIRED_FIELDS = ("round", "entropy", "accepted", "tau")  # task, prompt, tree_size, extended may be absent
DEFAULT_TASK = "all"  # GLANCE's fit_law.py name for rows without a task


def round_table(data, *, drafting_only: bool = True) -> pd.DataFrame:
    """The per-round table of ``data``: traces (``glance_rounds``) or a DataFrame with ``entropy`` and
    ``accepted`` (``category`` taken from ``task`` where absent, else ``"all"``), checked."""
    if isinstance(data, pd.DataFrame):
        missing = [c for c in ("entropy", "accepted") if c not in data]
        if missing:
            raise ValueError(f"a per-round table needs columns 'entropy' and 'accepted' (GLANCE's round log, or "
                             f"glance_rounds(traces)); it lacks {missing}")
        rounds = data.copy()
        if "category" not in rounds:
            rounds["category"] = rounds["task"].astype(str) if "task" in rounds else DEFAULT_TASK
        h = rounds["entropy"].to_numpy(dtype=float)
        a = rounds["accepted"].to_numpy(dtype=float)
        if np.any(~np.isfinite(h)) or np.any(h < -atrisk.NEGATIVE_TOLERANCE):
            raise ValueError("per-round entropies must be finite and >= 0 nats")
        if np.any(~np.isfinite(a)) or np.any(a < 0):
            raise ValueError("per-round accepted lengths must be finite and >= 0")
        rounds["entropy"] = np.maximum(h, 0.0)
        return rounds
    if not all(hasattr(data, name) for name in ("tokens", "rounds", "runs")):
        raise TypeError("fit_glance takes traces (.tokens, .rounds, .runs) or a per-round DataFrame, "
                        f"got {type(data).__name__}")
    return glance_rounds(data, drafting_only=drafting_only)


def _check_one_arm(traces, run_ids) -> None:
    runs = traces.runs
    found = arms.run_arms(runs)
    found = found.loc[found["run_id"].isin({str(r) for r in run_ids}) & ~found["is_ar"]]
    if found["arm_key"].nunique() > 1:
        raise ValueError(f"the traces hold several drafting arms ({arms.describe_arms(found)}); GLANCE's law describes "
                         "one. Select one with traces.filter(run_id=[...]) or TraceAnalysis(traces).arm_view(label)")


def glance_rounds(traces, *, drafting_only: bool = True) -> pd.DataFrame:
    """One drafting arm's rounds (those that drafted, unless ``drafting_only=False``) as GLANCE's round log."""
    tokens, rounds = traces.tokens, traces.rounds
    keys = ["run_id", "request_id", "round_index"]
    for name, frame, cols in (("tokens", tokens, keys + ["category", "depth", "target_entropy_nats"]),
                              ("rounds", rounds, keys + ["start_position", "tree_nodes", "tree_depth", "accepted",
                                                         "committed"])):
        missing = [c for c in cols if c not in frame]
        if missing:
            raise ValueError(f"traces.{name} lacks columns {missing} (trace format v1)")
    rounds = rounds[keys + ["start_position", "tree_nodes", "tree_depth", "accepted", "committed"]]
    if drafting_only:
        rounds = rounds.loc[rounds["tree_depth"] > 0]
    _check_one_arm(traces, rounds["run_id"].unique())
    root = tokens.loc[tokens["depth"] == 1, keys + ["category", "target_entropy_nats"]]
    root = root.astype({"run_id": str, "request_id": str, "category": str})
    out = rounds.astype({"run_id": str, "request_id": str}).merge(root, on=keys, how="left", validate="one_to_one")
    if out["target_entropy_nats"].isna().any():
        bad = out.loc[out["target_entropy_nats"].isna(), keys].iloc[0].tolist()
        raise ValueError(f"round {bad[2]} of request {bad[1]} (run {bad[0]}) has no depth-1 token row with an entropy")
    out = atrisk.validate_covariates(out, ["target_entropy_nats"])
    order = {key: i for i, key in enumerate(dict.fromkeys(zip(out["run_id"], out["request_id"])))}
    out["_request_order"] = [order[key] for key in zip(out["run_id"], out["request_id"])]
    out = out.sort_values(["category", "_request_order", "round_index"], kind="stable", ignore_index=True)
    first = out.drop_duplicates("_request_order")
    prompt_of = dict(zip(first["_request_order"], first.groupby("category", sort=False).cumcount()))
    accepted = out["accepted"].to_numpy(dtype=np.int64)
    return pd.DataFrame({
        "round": out.groupby("_request_order", sort=False).cumcount().to_numpy(dtype=np.int64),
        "entropy": out["target_entropy_nats"].to_numpy(dtype=float),
        "accepted": accepted, "tau": accepted + 1,
        "tree_size": out["tree_nodes"].to_numpy(dtype=np.int64) + 1,
        "extended": False,
        "task": out["category"].to_numpy(),
        "prompt": out["_request_order"].map(prompt_of).to_numpy(dtype=np.int64),
        "category": out["category"].to_numpy(),
        "run_id": out["run_id"].to_numpy(), "request_id": out["request_id"].to_numpy(),
        "round_index": out["round_index"].to_numpy(dtype=np.int64),
        "start_position": out["start_position"].to_numpy(dtype=np.int64),
        "tree_depth": out["tree_depth"].to_numpy(dtype=np.int64),
        "committed": out["committed"].to_numpy(dtype=np.int64),
    })


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value) -> bool:
    return _is_number(value) and math.isfinite(value) and float(value).is_integer()


def read_glance_rounds(path) -> pd.DataFrame:
    """GLANCE's round log (JSONL) as a per-round table: its eight fields, ``category`` (= task), ``request_id``
    (``"<task>/<prompt>"``) and ``line``. A field missing on every line takes its default; missing on some lines, or
    invalid, is a ``ValueError`` naming ``file:line`` and the field."""
    path = Path(path)
    numbered = list(read_json_lines(path, "a JSON object (one round)"))
    if not numbered:
        raise ValueError(f"{path}: no rounds (the file is empty)")
    present = {name for _, row in numbered for name in ROUND_LOG_FIELDS if name in row}
    required = set(REQUIRED_FIELDS) | present
    out = pd.DataFrame([_round_record(row, f"{path}:{number}", required) | {"line": number}
                        for number, row in numbered])
    if "prompt" not in present:  # a new prompt wherever round restarts at 0 within a task
        out["prompt"] = out.groupby("task", sort=False)["round"].transform(lambda r: (r.to_numpy() == 0).cumsum() - 1)
        if (out["prompt"] < 0).any():
            number = int(out.loc[out["prompt"] < 0, "line"].iloc[0])
            raise ValueError(f"{path}:{number}: field 'prompt' is absent and the task's first round is not round 0, "
                             "so its prompt cannot be told")
    out["prompt"] = out["prompt"].astype(np.int64)
    if "tree_size" in present:
        out["tree_size"] = out["tree_size"].astype(np.int64)
    seen = out.duplicated(["task", "prompt", "round"], keep=False)
    if seen.any():
        twice = out.loc[seen]
        first = twice.iloc[0]
        other = twice.loc[(twice["task"] == first["task"]) & (twice["prompt"] == first["prompt"])
                          & (twice["round"] == first["round"]), "line"].tolist()
        raise ValueError(f"{path}:{other[1]}: round {first['round']} of prompt {first['prompt']} of task "
                         f"{first['task']!r} appears twice (lines {other[0]} and {other[1]}; field 'round')")
    out["category"] = out["task"]
    out["request_id"] = out["task"] + "/" + out["prompt"].astype(str)
    return out[list(ROUND_LOG_FIELDS) + ["category", "request_id", "line"]]


def _round_record(row: dict, where: str, required: set) -> dict:
    """One line of a round log, checked (errors name ``where`` and the field)."""
    for name in ROUND_LOG_FIELDS:
        if name in required and name not in row:
            raise ValueError(f"{where}: field '{name}' is missing")
    entropy = row["entropy"]
    if not _is_number(entropy) or not math.isfinite(entropy):
        raise ValueError(f"{where}: field 'entropy' must be a finite number of nats, got {entropy!r}")
    if entropy < -atrisk.NEGATIVE_TOLERANCE:
        raise ValueError(f"{where}: field 'entropy' is negative ({entropy!r} nats)")
    for name in ("round", "accepted", "tau"):
        if not _whole(row[name]):
            raise ValueError(f"{where}: field '{name}' must be a whole number, got {row[name]!r}")
    if row["accepted"] < 0:
        raise ValueError(f"{where}: field 'accepted' is negative ({row['accepted']!r})")
    if row["round"] < 0:
        raise ValueError(f"{where}: field 'round' is negative ({row['round']!r})")
    if row["tau"] != row["accepted"] + 1:
        raise ValueError(f"{where}: field 'tau' must be accepted + 1 = {int(row['accepted']) + 1}, got {row['tau']!r}")
    if "prompt" in row and not (_whole(row["prompt"]) and row["prompt"] >= 0):
        raise ValueError(f"{where}: field 'prompt' must be a prompt index (a whole number >= 0), got {row['prompt']!r}")
    if "tree_size" in row and not (_whole(row["tree_size"]) and row["tree_size"] >= 1):
        raise ValueError(f"{where}: field 'tree_size' must be a whole number >= 1, got {row['tree_size']!r}")
    if "extended" in row and not isinstance(row["extended"], bool):
        raise ValueError(f"{where}: field 'extended' must be true or false, got {row['extended']!r}")
    task = row.get("task", DEFAULT_TASK)
    if not isinstance(task, (str, int)) or isinstance(task, bool):
        raise ValueError(f"{where}: field 'task' must be a name, got {task!r}")
    return dict(round=int(row["round"]), entropy=max(float(entropy), 0.0), accepted=int(row["accepted"]),
                tau=int(row["tau"]), tree_size=float(row["tree_size"]) if "tree_size" in row else np.nan,
                extended=bool(row.get("extended", False)), task=str(task),
                prompt=int(row["prompt"]) if "prompt" in row else None)


def write_glance_rounds(rounds: pd.DataFrame, path) -> int:
    """Write a per-round table as GLANCE's round log (its eight fields in order; ``task`` from ``category`` where
    absent) to a path or an open text file; returns the number of rows."""
    frame = rounds.copy()
    if "task" not in frame and "category" in frame:
        frame["task"] = frame["category"]
    missing = [c for c in ROUND_LOG_FIELDS if c not in frame]
    if missing:
        raise ValueError(f"the per-round table lacks GLANCE's fields {missing}")

    def line(rec) -> str:
        tree_size = None if pd.isna(rec.tree_size) else int(rec.tree_size)
        return json.dumps({"round": int(rec.round), "entropy": float(rec.entropy), "accepted": int(rec.accepted),
                           "tau": int(rec.tau), "tree_size": tree_size, "extended": bool(rec.extended),
                           "task": str(rec.task), "prompt": int(rec.prompt)}) + "\n"

    text = "".join(line(rec) for rec in frame[list(ROUND_LOG_FIELDS)].itertuples(index=False))
    if hasattr(path, "write"):
        path.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")
    return len(frame)
