"""Columns added to format v1 after its first release: old files lack them and read as null, writers fill
them with nulls when they have no value, and a run written before the column existed still resumes."""

import pyarrow as pa
import pytest

from entropy_law import TraceRecorder, load_traces
from entropy_law.traces import schema
from entropy_law.traces.validation import TraceValidationError
from tests.traces_helpers import log_requests, synthetic_requests


@pytest.fixture
def added_rounds_column(monkeypatch):
    """Pretend format v1 gained a nullable rounds column ``probe`` after ``run`` files were written."""
    def add():
        extended = schema.ROUNDS_SCHEMA.append(pa.field("probe", pa.float32(), nullable=True))
        monkeypatch.setitem(schema.SCHEMAS, "rounds", extended)
        monkeypatch.setitem(schema.ADDED_COLUMNS, "rounds", ("probe",))
    return add


def test_old_files_read_added_column_as_null_and_resume(tmp_path, added_rounds_column):
    requests = synthetic_requests(seed=1, n_requests=4)
    path = tmp_path / "run"
    with TraceRecorder(path, model_id="m", flush_every_rounds=10_000) as rec:
        log_requests(rec, requests[:2])
    added_rounds_column()
    old = load_traces(path)
    assert "probe" in old.rounds.columns and old.rounds["probe"].isna().all() and len(old.rounds) > 0
    assert old.dataset("rounds").to_table().column("probe").null_count == len(old.rounds)
    with TraceRecorder(path, resume=True, model_id="m") as rec:  # writes the new column (nulls: no value)
        log_requests(rec, requests[2:])
    both = load_traces(path)
    assert len(both.requests) == 4 and both.rounds["probe"].isna().all()


def test_log_columns_may_leave_out_added_columns_but_not_others(tmp_path, added_rounds_column):
    added_rounds_column()
    requests = synthetic_requests(seed=4, n_requests=2)
    with TraceRecorder(tmp_path / "a", model_id="m") as rec:
        log_requests(rec, requests)
    traces = load_traces(tmp_path / "a")
    tables = {name: traces.table(name) for name in ("tokens", "rounds", "requests")}
    rounds = tables["rounds"].drop_columns(["probe"])
    with TraceRecorder(tmp_path / "b", model_id="m") as rec:
        rec.log_columns(tokens=tables["tokens"].drop_columns(["run_id"]), rounds=rounds.drop_columns(["run_id"]),
                        requests=tables["requests"].drop_columns(["run_id"]))
    assert load_traces(tmp_path / "b").rounds["probe"].isna().all()
    with TraceRecorder(tmp_path / "c", model_id="m") as rec, pytest.raises(ValueError, match="accepted"):
        rec.log_columns(rounds=rounds.drop_columns(["run_id", "accepted"]))


def test_a_missing_original_column_is_still_an_error(tmp_path):
    import pyarrow.parquet as pq

    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=5, n_requests=1))
    file = next((tmp_path / "run").rglob("rounds.parquet"))
    pq.write_table(pq.read_table(file).drop_columns(["verify_ms"]), file)
    with pytest.raises(TraceValidationError, match="verify_ms"):
        load_traces(tmp_path / "run")


def test_a_tokens_file_from_before_draft_top1_prob_reads_it_as_null(tmp_path):
    import pyarrow.parquet as pq

    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=6, n_requests=2))
    assert "draft_top1_prob" in schema.ADDED_COLUMNS["tokens"]
    file = next((tmp_path / "run").rglob("tokens.parquet"))
    pq.write_table(pq.read_table(file).drop_columns(["draft_top1_prob"]), file)
    traces = load_traces(tmp_path / "run")
    assert traces.tokens["draft_top1_prob"].isna().all() and len(traces.tokens) > 0
