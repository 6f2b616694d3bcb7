"""Bad input gets a clear error: at log time (log_round, begin/end_request, log_columns) and on read."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from entropy_law import TraceRecorder, load_traces
from entropy_law.traces.validation import TraceValidationError
from tests.traces_helpers import log_requests, synthetic_requests


def _stats(n, entropy=None):
    h = np.full(n, 0.5, np.float32) if entropy is None else np.asarray(entropy, np.float32)
    return {"entropy_nats": h, "renyi2_nats": h * 0.5, "top1_prob": np.full(n, 0.6, np.float32),
            "top2_prob": np.full(n, 0.3, np.float32), "logit_gap": np.ones(n, np.float32)}


def _round(**overrides):
    args = dict(round_index=0, start_position=0, context_len=10, block_size=4, tree_nodes=3, tree_depth=3,
                accepted=1, token_ids=[5, 6], ends_at_leaf=False, target_stats=_stats(2))
    args.update(overrides)
    return args


@pytest.fixture
def rec(tmp_path):
    recorder = TraceRecorder(tmp_path / "run")
    recorder.begin_request("q", category="math")
    return recorder


@pytest.mark.parametrize("overrides, message", [
    (dict(accepted=4, tree_depth=3), r"accepted \(tau\) 4 must lie in \[0, tree_depth = 3\]"),
    (dict(tree_depth=4, block_size=4), r"tree_depth 4 must lie in \[0, block_size - 1 = 3\]"),
    (dict(tree_nodes=1), "tree_nodes 1 < tree_depth 3"),
    (dict(token_ids=[5, 6, 7], target_stats=_stats(3)), "3 committed tokens; a round commits 1..accepted \\+ 1 = 2"),
    (dict(token_ids=[]), "0 committed tokens"),
    (dict(target_stats=None), "exactly one of target_logits"),
    (dict(target_logits=np.zeros((2, 10))), "exactly one of target_logits"),
    (dict(target_stats=None, target_logits=np.zeros((3, 10))), r"shape \[committed=2, V\]; got \(3, 10\)"),
    (dict(target_stats=_stats(2, [0.1, np.nan])), r"target_stats\['entropy_nats'\] is NaN at depth 2"),
    (dict(target_stats=_stats(2, [0.1, -0.2])), r"target_stats\['entropy_nats'\] must be finite and >= 0"),
    (dict(target_stats=_stats(3)), "length committed=2"),
    (dict(target_stats={**_stats(2), "top2_prob": np.full(2, 0.9, np.float32)}), "top2 <= top1"),
    (dict(target_stats={**_stats(2), "logit_gap": np.array([1.0, -1.0], np.float32)}), "logit_gap'\\] must be >= 0"),
    (dict(target_stats={"entropy_nats": [0.1, 0.2]}), "missing"),
    (dict(accepted=3, token_ids=[1, 2, 3, 4], target_stats=_stats(4), ends_at_leaf=False), "ends_at_leaf must be True"),
    (dict(draft_stats={"prob": [0.5, 1.5]}), r"draft_stats\['prob'\] must lie in \[0, 1\]"),
    (dict(draft_stats={"rank": [0, -3]}), "draft_stats\\['rank'\\] must be integers >= -1"),
    (dict(verify_ms=float("nan")), "verify_ms must be finite"),
])
def test_log_round_errors(rec, overrides, message):
    with pytest.raises(ValueError, match=message):
        rec.log_round("q", **_round(**overrides))


def test_request_life_cycle_errors(rec):
    with pytest.raises(ValueError, match="unknown request 'nope'.*begin_request"):
        rec.log_round("nope", **_round())
    with pytest.raises(ValueError, match="duplicate request id 'q'"):
        rec.begin_request("q", category="math")
    with pytest.raises(ValueError, match="category"):
        rec.begin_request("r", category="")
    rec.log_round("q", **_round())
    with pytest.raises(ValueError, match="round_index must increase"):
        rec.log_round("q", **_round(start_position=2))
    with pytest.raises(ValueError, match="overlaps tokens already logged"):
        rec.log_round("q", **_round(round_index=1, start_position=1))
    with pytest.raises(ValueError, match="stop_reason must be one of"):
        rec.end_request("q", new_tokens=2, stop_reason="tired")
    with pytest.raises(ValueError, match="new_tokens 1 < 2"):
        rec.end_request("q", new_tokens=1, stop_reason="eos")
    rec.end_request("q", new_tokens=2, stop_reason="eos")
    with pytest.raises(ValueError, match="already ended"):
        rec.log_round("q", **_round(round_index=1, start_position=2))
    rec.finish()
    with pytest.raises(RuntimeError, match="finished"):
        rec.begin_request("z", category="math")


def test_recorder_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        TraceRecorder(tmp_path / "a", overwrite=True, resume=True)
    with pytest.raises(TypeError, match="'seed' is not JSON-serialisable"):
        TraceRecorder(tmp_path / "b", seed=object())
    with pytest.raises(ValueError, match="filled in by the recorder"):
        TraceRecorder(tmp_path / "c", status="complete")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty and holds no trace run"):
        TraceRecorder(tmp_path / "d")


def test_log_columns_errors(tmp_path):
    src = tmp_path / "src"
    with TraceRecorder(src) as r:
        log_requests(r, synthetic_requests(seed=3, n_requests=3))
    t = load_traces(src)
    tokens, rounds, requests = (t.table(n).drop_columns(["run_id"]) for n in ("tokens", "rounds", "requests"))
    rec = TraceRecorder(tmp_path / "bulk")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['depth'\]"):
        rec.log_columns(tokens=tokens.drop_columns(["depth"]), rounds=rounds, requests=requests)
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['colour'\]"):
        rec.log_columns(tokens=tokens.append_column("colour", pa.array(["x"] * len(tokens))),
                        rounds=rounds, requests=requests)
    bad = tokens.set_column(tokens.schema.get_field_index("target_entropy_nats"), "target_entropy_nats",
                            pa.array(np.full(len(tokens), np.nan, np.float32)))
    with pytest.raises(TraceValidationError, match="log_columns\\(tokens=...\\): NaN target_entropy_nats"):
        rec.log_columns(tokens=bad, rounds=rounds, requests=requests)
    with pytest.raises(TraceValidationError, match="number of token rows differs"):
        rec.log_columns(tokens=tokens.slice(1), rounds=rounds, requests=requests)
    with pytest.raises(TraceValidationError, match="no requests row"):
        rec.log_columns(tokens=tokens, rounds=rounds)
    assert not list((tmp_path / "bulk" / "shards").iterdir())  # nothing written by failed calls


# --- errors on read: corrupt one file of a valid run and check the message names the problem and place


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    with TraceRecorder(path, run_id="victim") as rec:
        log_requests(rec, synthetic_requests(seed=5, n_requests=4))
    return path


def _rewrite(run_dir, table, change):
    file = run_dir / "shards" / "000000" / f"{table}.parquet"
    pq.write_table(change(pq.read_table(file)), file)
    return file


def _set(tbl, name, values):
    return tbl.set_column(tbl.schema.get_field_index(name), tbl.schema.field(name), pa.array(values, tbl.schema.field(name).type))


def test_read_missing_column(run_dir):
    file = _rewrite(run_dir, "tokens", lambda t: t.drop_columns(["target_entropy_nats"]))
    with pytest.raises(TraceValidationError, match=f"{file}.*missing column.*target_entropy_nats"):
        load_traces(run_dir)


def test_read_nan_entropy_names_request_and_position(run_dir):
    def poison(t):
        h = t.column("target_entropy_nats").to_numpy().copy()
        h[3] = np.nan
        return _set(t, "target_entropy_nats", h)

    file = _rewrite(run_dir, "tokens", poison)
    row = pq.read_table(file).slice(3, 1).to_pylist()[0]
    with pytest.raises(TraceValidationError,
                       match=f"NaN target_entropy_nats.*request '{row['request_id']}', round {row['round_index']}, "
                             f"position {row['position']}"):
        load_traces(run_dir)
    assert len(load_traces(run_dir, validate=False).tokens) > 3  # opt-out still reads


def test_read_tau_larger_than_block(run_dir):
    def inflate(t):
        acc = t.column("accepted").to_numpy().copy()
        acc[0] = t.column("block_size").to_numpy()[0]
        return _set(t, "accepted", acc)

    _rewrite(run_dir, "rounds", inflate)
    with pytest.raises(TraceValidationError, match=r"accepted \(tau\) larger than the block.*run 'victim'"):
        load_traces(run_dir)


def test_read_tokens_per_round_differ_from_committed(run_dir):
    _rewrite(run_dir, "tokens", lambda t: t.slice(0, len(t) - 1))
    with pytest.raises(TraceValidationError, match="number of token rows differs from rounds.committed"):
        load_traces(run_dir)


def test_read_unknown_role_and_stop_reason(run_dir):
    _rewrite(run_dir, "tokens", lambda t: _set(t, "role", ["free"] + t.column("role").to_pylist()[1:]))
    with pytest.raises(TraceValidationError, match="unknown role"):
        load_traces(run_dir)


def test_read_rounds_count_mismatch(run_dir):
    _rewrite(run_dir, "requests", lambda t: _set(t, "rounds", (t.column("rounds").to_numpy() + 1).astype(np.int32)))
    with pytest.raises(TraceValidationError, match="requests.rounds differs"):
        load_traces(run_dir)


def test_read_unknown_version_and_missing_metadata(run_dir):
    meta = json.loads((run_dir / "run.json").read_text())
    del meta["model_id"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    with pytest.raises(TraceValidationError, match=r"missing key\(s\) \['model_id'\]"):
        load_traces(run_dir)
    meta["model_id"], meta["format_version"] = "m", 99
    (run_dir / "run.json").write_text(json.dumps(meta))
    with pytest.raises(TraceValidationError, match="unknown format version 99"):
        load_traces(run_dir)


def test_read_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace run under"):
        load_traces(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_traces(tmp_path / "missing")


def test_leftover_temporary_shard_is_ignored_with_warning(run_dir):
    meta = json.loads((run_dir / "run.json").read_text())
    meta["status"] = "running"
    (run_dir / "run.json").write_text(json.dumps(meta))
    tmp = run_dir / "shards" / ".tmp-000001-deadbeef"
    tmp.mkdir()
    (tmp / "tokens.parquet").write_bytes(b"half a file")
    with pytest.warns(UserWarning, match="'victim'.*incomplete.*ignored 1 unfinished temporary shard"):
        traces = load_traces(run_dir)
    assert len(traces.requests) == 4


def test_damaged_shard_without_all_tables(run_dir):
    (run_dir / "shards" / "000000" / "rounds.parquet").unlink()
    with pytest.raises(TraceValidationError, match="000000: shard has no rounds.parquet"):
        load_traces(run_dir)


def test_read_positions_and_depth_order(run_dir):
    def shift(t):
        pos = t.column("position").to_numpy().copy()
        pos[2] += 1
        return _set(t, "position", pos)

    _rewrite(run_dir, "tokens", shift)
    with pytest.raises(TraceValidationError, match="positions differ from start_position \\+ depth - 1"):
        load_traces(run_dir)


def test_read_depths_out_of_order(run_dir):
    def swap(t):
        depth = t.column("depth").to_numpy().copy()
        rounds = t.column("round_index").to_numpy()
        req = t.column("request_id").to_pylist()
        i = next(i for i in range(len(depth) - 1) if rounds[i] == rounds[i + 1] and req[i] == req[i + 1])
        depth[i], depth[i + 1] = depth[i + 1], depth[i]
        return _set(t, "depth", depth)

    _rewrite(run_dir, "tokens", swap)
    with pytest.raises(TraceValidationError, match="token depths are not 1, 2, ..., committed in order"):
        load_traces(run_dir)


def test_read_request_in_two_shards(run_dir):
    shutil.copytree(run_dir / "shards" / "000000", run_dir / "shards" / "000001")
    with pytest.raises(TraceValidationError, match="'victim'.*appears in more than one shard"):
        load_traces(run_dir)
