"""Replayed proposals: the drafter's proposal for a round starting at every output position of a run.

``proposals.parquet`` beside a run's ``run.json`` holds one row per (request, start position, drafted depth):
``start_position`` (none at 0, the prefill), ``proposal_depth`` (0: nothing drafted, one row with ``depth`` 0 and null
``top1_prob``), ``depth`` (1 .. ``proposal_depth``) and ``top1_prob``; derived by replay, never recorded. No torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from entropy_law.traces.layout import RUN_FILE, read_run_json, write_parquet_atomic
from entropy_law.traces.validation import TraceValidationError

PROPOSALS_FILE = "proposals.parquet"
SCHEMA = pa.schema([("run_id", pa.string()), ("request_id", pa.string()), ("start_position", pa.int32()),
                    ("proposal_depth", pa.int16()), ("depth", pa.int16()), ("top1_prob", pa.float32())])
KEYS = ["run_id", "request_id", "start_position", "depth"]
METADATA_KEY = b"entropy_law.proposals"


def check_proposals(frame: pd.DataFrame, where: str = "proposals") -> None:
    """Raise ``TraceValidationError`` unless ``frame`` obeys the rules of the module docstring."""
    missing = [c for c in SCHEMA.names if c not in frame.columns]
    if missing:
        raise TraceValidationError(f"{where}: missing column(s) {missing}; expected {SCHEMA.names}")
    if frame.empty:
        return
    if frame[["run_id", "request_id", "start_position", "proposal_depth", "depth"]].isna().any().any():
        raise TraceValidationError(f"{where}: null run_id, request_id, start_position, proposal_depth or depth")
    start, of, depth = (frame[c].to_numpy(np.int64) for c in ("start_position", "proposal_depth", "depth"))
    prob = frame["top1_prob"].to_numpy(np.float64)
    if (start < 0).any():
        raise TraceValidationError(f"{where}: start_position must be >= 0")
    if (of < 0).any() or ((of == 0) != (depth == 0)).any() or (depth > of).any():
        raise TraceValidationError(f"{where}: depth must be 1..proposal_depth, or 0 exactly where proposal_depth is 0")
    drafted = depth > 0
    if np.isnan(prob[drafted]).any() or (prob[drafted] < 0).any() or (prob[drafted] > 1).any():
        raise TraceValidationError(f"{where}: top1_prob must be a probability in [0, 1] at every drafted depth")
    if not np.isnan(prob[~drafted]).all():
        raise TraceValidationError(f"{where}: top1_prob must be null where nothing was drafted")
    if frame.duplicated(KEYS).any():
        raise TraceValidationError(f"{where}: duplicate rows for {KEYS}")
    rows = frame.groupby(["run_id", "request_id", "start_position"], sort=False)["depth"].agg(["size", "max"])
    if (rows["size"] != rows["max"].clip(lower=1)).any():
        raise TraceValidationError(f"{where}: a start position lacks some depths 1..proposal_depth")


def write_proposals(run_dir, frame: pd.DataFrame, how: dict) -> Path:
    """Write ``frame`` (every request of the run) as ``proposals.parquet`` atomically, ``how`` in its metadata."""
    run_dir = Path(run_dir)
    meta = read_run_json(run_dir / RUN_FILE)
    frame = frame.copy()
    frame["run_id"] = frame["run_id"].astype(str)
    frame["request_id"] = frame["request_id"].astype(str)
    check_proposals(frame, str(run_dir / PROPOSALS_FILE))
    other = set(frame["run_id"].unique()) - {meta["run_id"]}
    if other:
        raise TraceValidationError(f"{run_dir}: proposals of run(s) {sorted(other)} in run {meta['run_id']!r}")
    table = pa.Table.from_pandas(frame[SCHEMA.names], schema=SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(how).encode()})
    return write_parquet_atomic(run_dir / PROPOSALS_FILE, table)


def read_proposals(path) -> pd.DataFrame | None:
    """The replayed proposals of every run under ``path`` (a run folder or a folder of runs), checked; None when
    no run there has them. ``.attrs["how"]``: ``{run_id: how}`` from each file."""
    path = Path(path)
    files = [path / PROPOSALS_FILE] if (path / RUN_FILE).is_file() else sorted(path.rglob(PROPOSALS_FILE))
    files = [f for f in files if f.is_file() and (f.parent / RUN_FILE).is_file()]
    if not files:
        return None
    frames, how = [], {}
    for file in files:
        table = pq.read_table(file)
        if not set(SCHEMA.names) <= set(table.column_names):
            raise TraceValidationError(f"{file}: missing columns {sorted(set(SCHEMA.names) - set(table.column_names))}")
        frame = table.select(SCHEMA.names).cast(SCHEMA).to_pandas()
        run_id = read_run_json(file.parent / RUN_FILE)["run_id"]
        if set(frame["run_id"].unique()) - {run_id}:
            raise TraceValidationError(f"{file}: rows of another run than {run_id!r}")
        check_proposals(frame, str(file))
        frames.append(frame)
        how[run_id] = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["how"] = how
    return out
