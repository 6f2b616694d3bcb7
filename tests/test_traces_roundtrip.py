"""Trace round trips: every value logged is read back; life cycle (resume, overwrite, versions); filters."""

import json
import math
import warnings

import numpy as np
import pyarrow as pa
import pytest
import scipy.special
import scipy.stats

import entropy_law
from entropy_law import TraceRecorder, load_traces
from entropy_law.traces.reader import TraceSet
from entropy_law.traces.schema import FORMAT_VERSION, RUN_METADATA_KEYS
from entropy_law.traces.validation import TraceValidationError
from tests.traces_helpers import expected_tokens, log_requests, synthetic_requests


def _same(a, b) -> bool:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return (a is None or (isinstance(a, float) and math.isnan(a))) and (
            b is None or (isinstance(b, float) and math.isnan(b)))
    return a == b


def test_public_names_resolve():
    import entropy_law.traces

    assert entropy_law.TraceRecorder is TraceRecorder and entropy_law.traces.TraceSet is TraceSet
    assert entropy_law.load_traces is load_traces and entropy_law.traces.FORMAT_VERSION == FORMAT_VERSION
    assert entropy_law.traces.TraceValidationError is TraceValidationError
    # the top level is the short list a user calls; every name in it resolves, and the rest stays in the rooms
    for name in entropy_law.__all__:
        assert getattr(entropy_law, name) is not None, name
    with pytest.raises(AttributeError, match="the rooms export more"):
        entropy_law.aggregate_at_risk


def test_round_trip_every_value(tmp_path):
    requests = synthetic_requests(seed=1, n_requests=7)
    with TraceRecorder(tmp_path / "run", flush_every_rounds=5, model_id="tiny", drafter_id="d",
                       drafter_config={"k": 3}, tree_policy="chain", dtype="float32", device="cpu",
                       seed=7, note="user key") as rec:
        log_requests(rec, requests)
        run_id = rec.run_id
    traces = load_traces(tmp_path / "run")

    tokens = traces.table("tokens").to_pylist()
    want = expected_tokens(requests)
    assert len(tokens) == len(want) > 20
    for got, exp in zip(tokens, want):
        assert got["run_id"] == run_id
        for key, value in exp.items():
            assert _same(got[key], value), (key, got, exp)

    rounds = traces.table("rounds").to_pylist()
    want_rounds = [(q["request_id"], r) for q in requests for r in q["rounds"]]
    assert len(rounds) == len(want_rounds)
    for got, (rid, r) in zip(rounds, want_rounds):
        assert got["request_id"] == rid and got["committed"] == len(r["token_ids"])
        for key in ("round_index", "start_position", "context_len", "block_size", "tree_nodes",
                    "tree_depth", "accepted"):
            assert got[key] == r[key]
        for key in ("draft_ms", "verify_ms", "overhead_ms"):
            assert got[key] == float(np.float32(r[key]))

    reqs = traces.table("requests").to_pylist()
    assert [g["request_id"] for g in reqs] == [q["request_id"] for q in requests]
    for got, q in zip(reqs, requests):
        for key in ("category", "dataset", "question_id", "prompt_tokens", "image_tokens", "new_tokens",
                    "stop_reason"):
            assert got[key] == q[key]
        assert got["rounds"] == len(q["rounds"])
        assert got["prefill_ms"] == float(np.float32(q["prefill_ms"]))

    meta = traces.metadata[run_id]
    assert all(k in meta for k in RUN_METADATA_KEYS)
    assert meta["status"] == "complete" and meta["end_time"] and meta["drafter_config"] == {"k": 3}
    assert meta["note"] == "user key" and meta["package_version"] == entropy_law.__version__
    assert traces.runs.loc[0, "model_id"] == "tiny"
    # pandas views are the same rows, keyed by request_id
    assert list(traces.tokens["request_id"].astype(str)) == [w["request_id"] for w in want]
    assert len(list((tmp_path / "run" / "shards").iterdir())) > 1  # several flushes happened


def test_logits_path_stores_fp32_entropies(tmp_path):
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, size=(3, 257)).astype(np.float32)
    draft = rng.normal(0, 2, size=(2, 257)).astype(np.float32)
    with TraceRecorder(tmp_path / "run") as rec:
        rec.begin_request("a", category="math")
        rec.log_round("a", round_index=0, start_position=0, context_len=4, block_size=4, tree_nodes=3,
                      tree_depth=3, accepted=2, token_ids=[11, 12, 13], ends_at_leaf=False,
                      target_logits=logits, draft_logits=draft)
        rec.end_request("a", new_tokens=3, stop_reason="eos")
    tok = load_traces(tmp_path / "run").tokens
    p = scipy.special.softmax(logits.astype(np.float64), axis=1)
    np.testing.assert_allclose(tok["target_entropy_nats"], scipy.stats.entropy(p, axis=1), atol=1e-5)
    q = scipy.special.softmax(draft.astype(np.float64), axis=1)
    np.testing.assert_allclose(tok["draft_prob"][:2], [q[0, 11], q[1, 12]], atol=1e-6)
    assert np.isnan(tok["draft_prob"][2])  # depth 3 is beyond the 2-row draft
    assert list(tok["role"].astype(str)) == ["accepted", "accepted", "correction"]


def test_log_columns_round_trip_and_run_id_fill(tmp_path):
    src = tmp_path / "src"
    with TraceRecorder(src) as rec:
        log_requests(rec, synthetic_requests(seed=2))
    original = load_traces(src)
    with TraceRecorder(tmp_path / "bulk", run_id="bulk-run") as rec:
        tables = {name: original.table(name).drop_columns(["run_id"]) for name in ("tokens", "rounds", "requests")}
        rec.log_columns(**tables)
        with pytest.raises(ValueError, match="already in run"):
            rec.log_columns(requests=tables["requests"], rounds=tables["rounds"], tokens=tables["tokens"])
    copy = load_traces(tmp_path / "bulk")
    for name in ("tokens", "rounds", "requests"):
        a = original.table(name).drop_columns(["run_id"]).to_pylist()
        b = copy.table(name).drop_columns(["run_id"]).to_pylist()
        assert a == b
    assert set(copy.tokens["run_id"].astype(str)) == {"bulk-run"}


def test_filters_by_run_and_category(tmp_path):
    for name, seed in (("r1", 3), ("r2", 4)):
        with TraceRecorder(tmp_path / "all" / name, run_id=name) as rec:
            log_requests(rec, synthetic_requests(seed=seed, n_requests=6))
    everything = load_traces(tmp_path / "all")
    assert sorted(everything.runs["run_id"]) == ["r1", "r2"]
    only = everything.filter(run_id="r2", category="math")
    assert set(only.requests["run_id"].astype(str)) == {"r2"}
    assert set(only.requests["category"].astype(str)) == {"math"}
    assert set(only.tokens["category"].astype(str)) <= {"math"}
    math_ids = set(only.requests["request_id"].astype(str))
    assert set(only.rounds["request_id"].astype(str)) <= math_ids
    expected_rounds = sum(len(q["rounds"]) for q in synthetic_requests(seed=4, n_requests=6)
                          if q["category"] == "math")
    assert len(only.rounds) == expected_rounds
    assert only.dataset("rounds").to_table().num_rows == expected_rounds
    assert only.dataset("tokens").count_rows() == len(only.tokens)
    same = load_traces(tmp_path / "all", run_id="r2", category="math")
    assert len(same.tokens) == len(only.tokens)
    with pytest.raises(ValueError, match="unknown run id"):
        everything.filter(run_id="nope")
    with pytest.raises(ValueError, match="categories present"):
        everything.filter(category="poetry")


def test_refuses_to_overwrite_a_complete_run_unless_asked(tmp_path):
    path = tmp_path / "run"
    with TraceRecorder(path) as rec:
        log_requests(rec, synthetic_requests(seed=6, n_requests=2))
    with pytest.raises(FileExistsError, match="complete run.*overwrite=True"):
        TraceRecorder(path)
    with TraceRecorder(path, overwrite=True, run_id="fresh") as rec:
        log_requests(rec, synthetic_requests(seed=7, n_requests=1))
    traces = load_traces(path)
    assert list(traces.runs["run_id"]) == ["fresh"] and len(traces.requests) == 1


def test_refuses_other_format_version(tmp_path):
    path = tmp_path / "run"
    with TraceRecorder(path) as rec:
        log_requests(rec, synthetic_requests(seed=8, n_requests=1))
    meta = json.loads((path / "run.json").read_text())
    meta["format_version"] = FORMAT_VERSION + 1
    (path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"format version {FORMAT_VERSION + 1}.*will not append"):
        TraceRecorder(path, resume=True)
    with pytest.raises(TraceValidationError, match=f"unknown format version {FORMAT_VERSION + 1}"):
        load_traces(path)


def test_exception_leaves_run_incomplete_then_resume_skips_done(tmp_path):
    path = tmp_path / "run"
    requests = synthetic_requests(seed=9, n_requests=4)
    with pytest.raises(RuntimeError, match="boom"):
        with TraceRecorder(path, model_id="m", flush_every_rounds=10_000) as rec:
            log_requests(rec, requests[:2])  # ended, still in the buffer: flushed on the way out
            rec.begin_request(requests[2]["request_id"], category="math")  # open: dropped
            raise RuntimeError("boom")
    with pytest.warns(UserWarning, match="incomplete"):
        partial = load_traces(path)
    assert list(partial.requests["request_id"].astype(str)) == [q["request_id"] for q in requests[:2]]
    with pytest.raises(FileExistsError, match="incomplete run.*resume=True"):
        TraceRecorder(path)
    with pytest.raises(ValueError, match="metadata differs"):
        TraceRecorder(path, resume=True, model_id="other")
    with TraceRecorder(path, resume=True, model_id="m") as rec:
        assert rec.completed_requests == {q["request_id"] for q in requests[:2]}
        with pytest.raises(ValueError, match="already complete"):
            rec.begin_request(requests[0]["request_id"], category="math")
        log_requests(rec, [q for q in requests if q["request_id"] not in rec.completed_requests])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = load_traces(path)
    assert list(full.requests["request_id"].astype(str)) == [q["request_id"] for q in requests]
    assert len(full.tokens) == len(expected_tokens(requests))
    assert full.metadata[full.runs.loc[0, "run_id"]]["status"] == "complete"


def test_finish_with_open_request_is_an_error(tmp_path):
    rec = TraceRecorder(tmp_path / "run")
    rec.begin_request("open", category="math")
    with pytest.raises(ValueError, match="begun but not ended"):
        rec.finish()


def test_load_traces_of_several_paths_and_row_counts_from_the_footers(tmp_path):
    for name, seed in (("r1", 3), ("r2", 4)):
        with TraceRecorder(tmp_path / "all" / name, run_id=name) as rec:
            log_requests(rec, synthetic_requests(seed=seed, n_requests=6))
    both = load_traces([tmp_path / "all" / "r1", str(tmp_path / "all" / "r2")])
    assert sorted(both.runs["run_id"]) == ["r1", "r2"]
    # a run reached through two paths is read once
    again = load_traces([tmp_path / "all", tmp_path / "all" / "r1"])
    assert sorted(again.runs["run_id"]) == ["r1", "r2"] and len(again.tokens) == len(both.tokens)
    counts = load_traces(tmp_path / "all", validate=False).row_counts()
    assert counts == {"tokens": len(both.tokens), "rounds": len(both.rounds), "requests": len(both.requests)}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_traces([tmp_path / "all" / "r1", tmp_path / "nowhere"])
    import shutil

    shutil.copytree(tmp_path / "all" / "r1", tmp_path / "copy" / "r1")  # a second folder with run id r1
    with pytest.raises(TraceValidationError, match="appears twice"):
        load_traces([tmp_path / "all", tmp_path / "copy"])


def test_summary_counts(tmp_path):
    requests = synthetic_requests(seed=10, n_requests=5)
    with TraceRecorder(tmp_path / "run") as rec:
        log_requests(rec, requests)
    s = load_traces(tmp_path / "run").summary
    rounds = [r for q in requests for r in q["rounds"]]
    assert s.loc[0, "requests"] == 5 and s.loc[0, "rounds"] == len(rounds)
    assert s.loc[0, "tokens"] == sum(len(r["token_ids"]) for r in rounds)
    assert abs(s.loc[0, "mean_accepted"] - np.mean([r["accepted"] for r in rounds])) < 1e-12


def test_arrow_tables_have_schema_types(tmp_path):
    with TraceRecorder(tmp_path / "run") as rec:
        log_requests(rec, synthetic_requests(seed=11, n_requests=2))
    tbl = load_traces(tmp_path / "run").table("tokens")
    assert tbl.schema.field("target_entropy_nats").type == pa.float32()
    assert tbl.schema.field("depth").type == pa.int16()


def test_recorder_observer_logs_rounds(tmp_path):
    import torch

    from entropy_law.decoding.interface import DraftProposal
    from entropy_law.decoding.observers import RecorderObserver
    from entropy_law.decoding.round import Round

    gen = torch.Generator().manual_seed(0)
    target = torch.randn(3, 120, generator=gen)
    cands = torch.tensor([[7, 8], [9, 10], [11, 12]])
    logprobs = torch.tensor([[-0.2, -1.8], [-0.5, -1.0], [-0.1, float("-inf")]])
    record = Round(request_id="a", round_index=0, start_position=1, context_len=9, block_size=4,
                   tree_nodes=6, tree_depth=3, accepted=2, committed_ids=[8, 9, 50], ends_at_leaf=False,
                   target_logits=target, draft=DraftProposal(tokens=cands, logprobs=logprobs),
                   draft_ms=1.5, verify_ms=2.5, overhead_ms=0.5)
    with TraceRecorder(tmp_path / "run") as rec:
        observer = RecorderObserver(rec)
        observer.on_request_start("a", {"category": "math", "prompt_tokens": 9, "other": "ignored"})
        observer.on_round(record)
        observer.on_request_end("a", {"new_tokens": 4, "stop_reason": "eos", "prefill_ms": 0.0, "decode_ms": 4.5})
    traces = load_traces(tmp_path / "run")
    tok = traces.tokens
    assert tok["draft_rank"].tolist() == [1, 0, -1]  # 50 is not among the depth-3 candidates
    assert np.isnan(tok["draft_prob"].iloc[2]) and tok["draft_entropy_nats"].isna().all()
    np.testing.assert_allclose(tok["draft_prob"].iloc[:2], np.exp([-1.8, -0.5]), rtol=1e-6)
    p = scipy.special.softmax(target.double().numpy(), axis=1)
    np.testing.assert_allclose(tok["target_entropy_nats"], scipy.stats.entropy(p, axis=1), atol=1e-5)
    assert tok["position"].tolist() == [1, 2, 3] and traces.rounds["verify_ms"].iloc[0] == 2.5
    assert traces.requests["decode_ms"].iloc[0] == 4.5


def test_flush_every_requests_writes_each_request_when_it_ends(tmp_path):
    path = tmp_path / "run"
    requests = synthetic_requests(seed=21, n_requests=4)
    rec = TraceRecorder(path, flush_every_requests=1)
    for i, q in enumerate(requests, start=1):
        log_requests(rec, [q])
        assert len(list((path / "shards").iterdir())) == i  # on disk as soon as it ended
        assert q["request_id"] in rec.completed_requests
    rec.finish()
    grouped = tmp_path / "grouped"
    with TraceRecorder(grouped, flush_every_requests=3, flush_every_rounds=10_000) as rec:
        log_requests(rec, requests)
        assert len(list((grouped / "shards").iterdir())) == 1  # the first three; the fourth at finish
    assert len(list((grouped / "shards").iterdir())) == 2
    assert len(load_traces(grouped).requests) == 4
    with pytest.raises(ValueError, match="flush_every_requests must be >= 1"):
        TraceRecorder(tmp_path / "bad", flush_every_requests=0)


def test_resume_compares_every_given_key_and_what_a_missing_key_means(tmp_path):
    """A key given on resume is compared even when the run was recorded without it: with ``absent_means`` it
    compares as what its absence means (and is not added), without a stated meaning it cannot be checked and
    is refused. Keys not given are not compared."""
    path = tmp_path / "run"
    with TraceRecorder(path, model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=22, n_requests=1))
    before = json.loads((path / "run.json").read_text())
    with pytest.raises(ValueError, match=r"gate: run has 'ratio' \(not in its run.json, which means 'ratio'\), "
                                         r"given 'cost'.*new directory.*overwrite=True"):
        TraceRecorder(path, resume=True, model_id="m", gate="cost", absent_means={"gate": "ratio"})
    with pytest.raises(ValueError, match=r"gate: not recorded in the run \(cannot be checked\), given 'ratio'"):
        TraceRecorder(path, resume=True, model_id="m", gate="ratio")
    TraceRecorder(path, resume=True, model_id="m", gate="ratio", absent_means={"gate": "ratio"}).finish()
    after = json.loads((path / "run.json").read_text())
    assert set(after) == set(before) | {"resumed_at"}  # nothing added
    TraceRecorder(path, resume=True).finish()  # nothing given: nothing compared

    # a new run writes only what its absence does not already say
    TraceRecorder(tmp_path / "ratio", gate="ratio", absent_means={"gate": "ratio"}).finish()
    assert "gate" not in json.loads((tmp_path / "ratio" / "run.json").read_text())
    TraceRecorder(tmp_path / "cost", gate="cost", absent_means={"gate": "ratio"}).finish()
    assert json.loads((tmp_path / "cost" / "run.json").read_text())["gate"] == "cost"
    with pytest.raises(ValueError, match=r"gate: run has 'cost', given 'ratio'"):
        TraceRecorder(tmp_path / "cost", resume=True, gate="ratio", absent_means={"gate": "ratio"})
