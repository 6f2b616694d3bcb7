"""compact_run: a run written a shard per request rewritten as a few shards, every row and key kept."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from entropy_law.traces import TraceRecorder, load_traces, schema
from entropy_law.traces.compact import compact_run
from traces_helpers import log_requests, synthetic_requests


def _frames(path):
    t = load_traces(path)
    return {name: getattr(t, name).reset_index(drop=True) for name in ("tokens", "rounds", "requests")}


def test_compaction_keeps_every_row_and_key_in_fewer_shards(tmp_path):
    path = tmp_path / "run"
    with TraceRecorder(path, flush_every_requests=1, model_id="m", drafter_id="d", arm="x") as rec:
        log_requests(rec, synthetic_requests(seed=31, n_requests=9))
    (path / "proposals.parquet").write_bytes(b"kept as it is")
    before_meta = json.loads((path / "run.json").read_text())
    before = _frames(path)
    n_rounds = len(before["rounds"])
    assert len(list((path / "shards").iterdir())) == 9 and n_rounds > 8

    result = compact_run(path, rounds_per_shard=n_rounds // 2)
    assert result["shards_before"] == 9 and result["shards_after"] in (2, 3)
    assert result["rows"]["rounds"] == n_rounds
    assert len(list((path / "shards").iterdir())) == result["shards_after"]
    after = _frames(path)
    for name in before:
        pd.testing.assert_frame_equal(after[name], before[name])
    meta = json.loads((path / "run.json").read_text())
    assert {k: v for k, v in meta.items() if k != "compacted"} == before_meta  # run_id, times, keys
    assert meta["compacted"][0]["shards_before"] == 9
    assert (path / "proposals.parquet").read_bytes() == b"kept as it is"
    assert not list(tmp_path.glob(".run.*"))  # no sibling left behind


def test_compaction_refuses_a_run_that_is_not_complete_and_changes_nothing(tmp_path):
    path = tmp_path / "run"
    rec = TraceRecorder(path, flush_every_requests=1)
    log_requests(rec, synthetic_requests(seed=32, n_requests=3))
    with pytest.raises(ValueError, match="not complete"):
        compact_run(path)
    rec.finish()
    shards = sorted(p.name for p in (path / "shards").iterdir())
    with pytest.raises(ValueError, match="rounds_per_shard must be >= 1"):
        compact_run(path, rounds_per_shard=0)
    assert sorted(p.name for p in (path / "shards").iterdir()) == shards
    compact_run(path)
    assert len(list((path / "shards").iterdir())) == 1
    meta = (path / "run.json").read_text()
    assert compact_run(path) == {"shards_before": 1, "shards_after": 1, "rows": compact_run(path)["rows"]}
    assert (path / "run.json").read_text() == meta  # compacted already: nothing rewritten


def test_compaction_of_a_run_older_than_a_column_keeps_it_null(tmp_path, monkeypatch):
    """A run written before a column was added to the format (some shards, or all of them) compacts into shards
    that hold the column, null where the old shards had none: what the reader showed before."""
    old, mixed = tmp_path / "old", tmp_path / "mixed"
    requests = synthetic_requests(seed=33, n_requests=4)
    for path in (old, mixed):
        with TraceRecorder(path, flush_every_requests=1, model_id="m") as rec:
            log_requests(rec, requests[:2] if path == mixed else requests)
    extended = schema.ROUNDS_SCHEMA.append(pa.field("probe", pa.float32(), nullable=True))
    monkeypatch.setitem(schema.SCHEMAS, "rounds", extended)
    monkeypatch.setitem(schema.ADDED_COLUMNS, "rounds", ("probe",))
    with TraceRecorder(mixed, resume=True, flush_every_requests=1, model_id="m") as rec:
        log_requests(rec, requests[2:])
    for path in (old, mixed):
        before = _frames(path)
        assert compact_run(path)["shards_after"] == 1
        after = _frames(path)
        for name in before:
            pd.testing.assert_frame_equal(after[name], before[name])
        assert after["rounds"]["probe"].isna().all()
