"""GLANCE's round log into a trace run (``entropy-law import glance ROUNDS.jsonl --out RUN``), and back.

One request per (task, prompt), the task as category; positions rebuilt from tau; token ids null; of the target
statistics only ``target_entropy_nats`` at depth 1 (the round root's); times 0. ``run.json`` says what is missing
and how the rest was filled, with ``target_stats_scope: "round_root"``, which ``law.atrisk`` reads to refuse laws
that need per-position entropy. ``export_glance_rounds`` writes any run's rounds as GLANCE's round log. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from entropy_law.importers.records import FieldError, decoded_line
from entropy_law.importers.writer import SkippedLine, nothing_kept, with_null_columns
from entropy_law import glance
from entropy_law.traces.layout import file_sha256
from entropy_law.traces.recorder import TraceRecorder

ENGINE = "glance"
METADATA_KEY = "glance_import"
TIMINGS = ("draft_ms", "verify_ms", "overhead_ms")
TARGET_STATS_SCOPE = "round_root"  # run.json target_stats_scope: target statistics only at each round's depth-1 row
MISSING = {
    "token_id": "null: GLANCE's round log saves no token ids",
    "target statistics": ("only target_entropy_nats at depth 1 of each round (the log's 'entropy', the round "
                          "root's distribution); every other target statistic and depth is null"),
    "timings": ("none in GLANCE's round log: draft_ms, verify_ms, overhead_ms, prefill_ms and decode_ms are 0 "
                "(not reported, as the engine importers write them); no speedup can be computed"),
    "prompt": "GLANCE's 'prompt' is an index, not text: prompt_tokens is 0 (unknown), context_len = start_position",
    "tree_depth": "not logged: the deepest draft a round could hold, see filled.tree_depth",
}


@dataclass
class GlanceImportSummary:
    run_dir: Path
    run_id: str
    lines: int
    rounds: int
    requests: int
    categories: list
    skipped: list = field(default_factory=list)

    def lines_to_print(self) -> list[str]:
        return [f"imported {self.rounds} round(s) of {self.requests} prompt(s) from GLANCE's round log into "
                f"{self.run_dir} (run {self.run_id})",
                f"  categories (GLANCE tasks):       {', '.join(self.categories)}",
                f"  malformed lines skipped:         {len(self.skipped)}",
                "target statistics: the root entropy of each round only (depth 1); token ids null; no timings. "
                "Fit GLANCE's law (fit_law(traces, family=\"glance\")); laws of per-position entropy cannot be "
                "fitted on this run"]


def read_rounds(path, *, skip_bad: bool = False) -> tuple[pd.DataFrame, list[SkippedLine], int]:
    """``read_glance_rounds`` with ``skip_bad``: a line that fails its checks is dropped and listed (its
    ``file:line: field ...`` error), and the remaining lines are read again. Returns (rounds, skipped, lines)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (GLANCE's round log: JSONL, one round per line)")
    hint = " (entropy-law import glance --skip-bad skips such lines and lists them in run.json)"
    text, skipped = [], []
    for number, raw in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
        try:
            text.append(decoded_line(raw))
        except FieldError as err:  # not UTF-8: the line is named, and skipped with skip_bad
            if not skip_bad:
                raise ValueError(f"{path}:{number}: {err}{hint}") from None
            skipped.append(SkippedLine(number, err.field, err.problem))
            text.append("\n")
    n_lines = sum(1 for t in text if t.strip()) + len(skipped)
    while True:
        if skipped and len(skipped) == n_lines:
            raise ValueError(f"{path}: no round to import: all {n_lines} line(s) are bad and were skipped (first: "
                             f"{nothing_kept(skipped)})")
        try:
            if not skipped:
                return glance.read_glance_rounds(path), skipped, n_lines
            kept = [t if i + 1 not in {s.line for s in skipped} else "\n" for i, t in enumerate(text)]
            tmp = path.with_name(f".skip-bad-{path.name}")
            try:
                tmp.write_text("".join(kept), encoding="utf-8")
                rounds = glance.read_glance_rounds(tmp)
            finally:
                tmp.unlink(missing_ok=True)
            return rounds, skipped, n_lines
        except ValueError as err:
            message = str(err)
            line, fieldname = _where(message, path)
            if not skip_bad or line is None:
                raise ValueError(message.replace(f".skip-bad-{path.name}", path.name)
                                 + (hint if line is not None else "")) from None
            skipped.append(SkippedLine(line, fieldname, message.split(": ", 2)[-1]))


def _where(message: str, path: Path) -> tuple[int | None, str]:
    """(line, field) of a ``read_glance_rounds`` error ``<file>:<line>: ... field '<name>' ...``."""
    number = message.split(": ", 1)[0].rsplit(":", 1)[-1]
    if not number.isdigit():
        return None, ""
    fieldname = message.split("field '", 1)[1].split("'", 1)[0] if "field '" in message else "(line)"
    return int(number), fieldname


def _tables(rounds: pd.DataFrame, block_size: int) -> dict:
    """The three trace tables of the round log (columns as numpy / Arrow arrays)."""
    rounds = rounds.sort_values(["category", "prompt", "round"], kind="stable", ignore_index=True)
    tau = rounds["tau"].to_numpy(dtype=np.int64)
    accepted = rounds["accepted"].to_numpy(dtype=np.int64)
    request = rounds["request_id"].to_numpy(dtype=object)
    start = rounds.groupby("request_id", sort=False)["tau"].cumsum().to_numpy(dtype=np.int64) - tau
    has_size = rounds["tree_size"].notna().to_numpy()
    nodes_logged = np.where(has_size, rounds["tree_size"].fillna(1).to_numpy(dtype=float) - 1, np.nan)
    depth = np.full(len(rounds), block_size - 1, dtype=np.int64)  # the deepest draft a round could hold
    depth = np.where(has_size, np.minimum(depth, np.nan_to_num(nodes_logged, nan=0).astype(np.int64)), depth)
    depth = np.maximum(depth, accepted)  # a round accepted at least this deep
    nodes = np.where(has_size, np.maximum(np.nan_to_num(nodes_logged, nan=0), depth), depth).astype(np.int64)
    rounds_table = {
        "request_id": request, "round_index": rounds["round"].to_numpy(dtype=np.int32),
        "start_position": start.astype(np.int32), "context_len": start.astype(np.int32),
        "block_size": np.full(len(rounds), block_size, dtype=np.int16), "tree_nodes": nodes.astype(np.int32),
        "tree_depth": depth.astype(np.int16), "accepted": accepted.astype(np.int16),
        "committed": tau.astype(np.int16), **{c: np.zeros(len(rounds), np.float32) for c in TIMINGS},
    }
    which = np.repeat(np.arange(len(rounds)), tau)  # one token row per committed token
    token_depth = np.arange(which.size) - np.repeat(np.cumsum(tau) - tau, tau) + 1
    role = np.where(token_depth <= accepted[which], "accepted",
                    np.where(accepted[which] == depth[which], "bonus", "correction"))
    root = token_depth == 1
    entropy = rounds["entropy"].to_numpy(dtype=np.float32)[which]
    tokens = {
        "request_id": request[which], "category": rounds["category"].to_numpy(dtype=object)[which],
        "round_index": rounds["round"].to_numpy(dtype=np.int32)[which],
        "position": (start[which] + token_depth - 1).astype(np.int32), "depth": token_depth.astype(np.int16),
        "role": role, "target_entropy_nats": pa.array(np.where(root, entropy, 0).astype(np.float32), mask=~root),
    }
    per_request = rounds.groupby("request_id", sort=False).agg(category=("category", "first"), rounds=("tau", "size"),
                                                               new_tokens=("tau", "sum"), task=("task", "first"),
                                                               prompt=("prompt", "first"))
    m = len(per_request)
    requests = {
        "request_id": per_request.index.to_numpy(dtype=object), "category": per_request["category"].to_numpy(object),
        "dataset": np.full(m, "glance", dtype=object),
        "question_id": per_request["prompt"].astype(str).to_numpy(dtype=object),
        "prompt_tokens": np.zeros(m, np.int32), "image_tokens": np.zeros(m, np.int32),
        "new_tokens": per_request["new_tokens"].to_numpy(dtype=np.int32),
        "rounds": per_request["rounds"].to_numpy(dtype=np.int32),
        "stop_reason": np.full(m, "max_new_tokens", dtype=object),
        "prefill_ms": np.zeros(m, np.float32), "decode_ms": np.zeros(m, np.float32),
    }
    return {"tokens": with_null_columns(tokens, "tokens", which.size), "rounds": rounds_table, "requests": requests}


def import_glance(path, out, *, skip_bad: bool = False, model_id: str | None = None, drafter_id: str | None = None,
                  cap: int = glance.CAP, overwrite: bool = False) -> GlanceImportSummary:
    """Write GLANCE's round log ``path`` as a trace run in ``out`` (module docstring); ``cap``: GLANCE's
    reachable accepted length (15), so block_size = max(cap, the largest accepted in the log) + 1."""
    path = Path(path)
    rounds, skipped, n_lines = read_rounds(path, skip_bad=skip_bad)
    block_size = int(max(cap, int(rounds["accepted"].max()))) + 1
    sizes = rounds["tree_size"].dropna()
    meta = {
        "model_id": model_id,
        "drafter_id": drafter_id if drafter_id is not None else f"glance:{path.stem}",
        "drafter_config": {"tree_size": int(sizes.max())} if len(sizes) and sizes.nunique() == 1 else {},
        "tree_policy": "glance-tree" if len(sizes) and sizes.max() > block_size else "unknown",
        "imported_from": ENGINE,
        "target_stats_scope": TARGET_STATS_SCOPE,
        METADATA_KEY: {
            "source": str(path), "source_sha256": file_sha256(path), "lines_read": n_lines,
            "rounds": len(rounds), "requests": int(rounds["request_id"].nunique()),
            "skipped_bad": len(skipped), "skipped_lines": [vars(s) for s in skipped],
            "positions": ("rebuilt from tau: the sum of tau of the prompt's earlier logged rounds"
                          + ("; a skipped line's round is absent, so the later positions of its prompt are short "
                             "by its (unknown) tau" if skipped else "")),
            "missing": MISSING,
            "filled": {
                "block_size": f"{block_size}: max(cap {cap}, largest accepted in the log) + 1",
                "tree_depth": ("not logged: min(block_size - 1, tree_size - 1), at least accepted; an upper bound "
                               "on the round's drafted depth, not a measurement"),
                "tree_nodes": ("tree_size - 1 (the root excluded), at least tree_depth; tree_depth where tree_size is "
                               "absent"),
                "role": ("depths 1..accepted 'accepted'; the last token 'bonus' when accepted = tree_depth, else "
                         "'correction'"),
                "stop_reason": "max_new_tokens (GLANCE logs no stop reason)",
                "extended": ("GLANCE's 'extended' flag has no trace column: the rounds logged true are listed in "
                             "extended_rounds ([request_id, round]); export writes them back"),
            },
            "timings": MISSING["timings"],
            "tree_size_logged": bool(len(sizes)),
            "extended_rounds": [[str(r), int(k)] for r, k in
                                rounds.loc[rounds["extended"], ["request_id", "round"]].itertuples(index=False)],
        },
    }
    with TraceRecorder(out, overwrite=overwrite, **meta) as recorder:
        recorder.log_columns(**_tables(rounds, block_size))
        run_id = recorder.run_id
    return GlanceImportSummary(run_dir=Path(out), run_id=run_id, lines=n_lines, rounds=len(rounds),
                               requests=int(rounds["request_id"].nunique()),
                               categories=sorted(rounds["category"].unique()), skipped=skipped)


def export_glance_rounds(traces, out) -> int:
    """Write the drafting rounds of ``traces`` (one drafting arm) as GLANCE's round log to ``out`` (a path or an open
    text file; an imported GLANCE run gets its own ``round``, ``prompt`` and ``tree_size``); returns the rows."""
    rounds = glance.glance_rounds(traces)
    if rounds.empty:  # refused before anything is written (an empty file would read as a log of nothing)
        raise ValueError("these traces hold no drafting round (an AR run, or a drafter that never drafted): GLANCE's "
                         "round log would be empty; pass the run of a drafting arm")
    runs = traces.runs
    imported = (set(runs.loc[runs["imported_from"] == ENGINE, "run_id"].astype(str)) if "imported_from" in runs
                else set())
    if imported:
        rounds = _as_logged(traces, rounds, imported)
    return glance.write_glance_rounds(rounds, out)


def _as_logged(traces, rounds: pd.DataFrame, imported: set) -> pd.DataFrame:
    """Rows of imported GLANCE runs as the log had them (``round``, ``prompt``, ``tree_size``, ``extended``)."""
    out = rounds.copy()
    mine = out["run_id"].isin(imported).to_numpy()
    out.loc[mine, "round"] = out.loc[mine, "round_index"]
    out.loc[mine, "prompt"] = out.loc[mine, "request_id"].str.rsplit("/", n=1).str[-1].astype(np.int64)
    out["tree_size"] = out["tree_size"].astype(object)
    for run_id, meta in traces.metadata.items():
        if str(run_id) not in imported:
            continue
        info = meta.get(METADATA_KEY) or {}
        rows = mine & (out["run_id"] == str(run_id)).to_numpy()
        if not info.get("tree_size_logged", True):
            out.loc[rows, "tree_size"] = None
        extended = {(str(r), int(k)) for r, k in info.get("extended_rounds", [])}
        out.loc[rows, "extended"] = [(r, int(k)) in extended
                                     for r, k in zip(out.loc[rows, "request_id"], out.loc[rows, "round"])]
    return out


__all__ = ["ENGINE", "GlanceImportSummary", "export_glance_rounds", "import_glance", "read_rounds"]
