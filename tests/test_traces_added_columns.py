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


def _as_v1_run(path):
    """Rewrite a run as a version-1 writer left it: run.json says 1, the tokens files lack the v2 top-k columns."""
    import json

    import pyarrow.parquet as pq

    meta = json.loads((path / "run.json").read_text())
    meta["format_version"] = 1
    (path / "run.json").write_text(json.dumps(meta))
    for file in path.rglob("tokens.parquet"):
        pq.write_table(pq.read_table(file).drop_columns(list(schema.TOPK_COLUMNS)), file)


def test_a_version_1_run_loads_with_the_topk_columns_null_and_resumes(tmp_path):
    requests = synthetic_requests(seed=7, n_requests=4)
    path = tmp_path / "run"
    with TraceRecorder(path, model_id="m") as rec:
        log_requests(rec, requests[:2])
    assert load_traces(path).metadata[next(iter(load_traces(path).metadata))]["format_version"] == 2
    _as_v1_run(path)
    old = load_traces(path)
    assert len(old.tokens) > 0 and old.tokens[list(schema.TOPK_COLUMNS)].isna().all().all()
    with TraceRecorder(path, resume=True, model_id="m") as rec:  # an older run is continued in its own version
        log_requests(rec, requests[2:])
    both = load_traces(path)
    assert len(both.requests) == 4 and next(iter(both.metadata.values()))["format_version"] == 1


def test_a_reader_older_than_the_topk_columns_refuses_a_new_run(tmp_path, monkeypatch):
    """A v1 reader compares format_version with the one version it knows: a run written now says 2."""
    from entropy_law.traces import reader

    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=8, n_requests=1))
    monkeypatch.setattr(reader, "READABLE_FORMAT_VERSIONS", (1,))  # what this package read before v2
    with pytest.raises(TraceValidationError, match=r"unknown format version 2; this package reads v1 \(upgrade "
                                                   r"entropy-law to read newer runs\)"):
        load_traces(tmp_path / "run")


def test_topk_columns_are_checked(tmp_path):
    import numpy as np

    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=9, n_requests=1))
    tokens = load_traces(tmp_path / "run").table("tokens")
    n = tokens.num_rows

    def with_bounds(lower, upper, estimate):
        t = tokens
        for name, value in zip(schema.TOPK_COLUMNS[:3], (lower, upper, estimate)):
            t = t.set_column(t.schema.get_field_index(name), name, pa.array(np.full(n, value, np.float32)))
        return t

    from entropy_law.traces.validation import check_values

    check_values(with_bounds(1.0, 2.0, 1.5), "tokens", "t")
    for bad, match in (((2.0, 1.0, 1.5), "lower_nats > target_entropy_upper"), ((1.0, 2.0, 2.5), "above"),
                       ((1.0, 2.0, 0.5), "below"), ((-1.0, 2.0, 1.0), "negative")):
        with pytest.raises(TraceValidationError, match=match):
            check_values(with_bounds(*bad), "tokens", "t")
