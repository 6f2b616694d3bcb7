"""One writer per trace run: the writer's lock (a second writer is refused, a stale lock is reported and
broken only when asked), shard numbers that never collide, and leftovers of a crashed writer that are
quarantined and reported instead of deleted.

Refusals are matched as ``FileExistsError`` (``RunLockedError`` is one), so that on a recorder without a
lock these tests fail on their assertions rather than on an import.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import entropy_law
from entropy_law import TraceRecorder, load_traces
from tests.traces_helpers import log_requests, synthetic_requests

PACKAGE_ROOT = Path(entropy_law.__file__).resolve().parent.parent  # the package under test, for subprocesses

# Opens a run, writes one request, says so, and keeps the run open until it is killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from entropy_law import TraceRecorder
    from tests.traces_helpers import log_requests, synthetic_requests

    rec = TraceRecorder(sys.argv[1], run_id="held", model_id="m", flush_every_requests=1)
    log_requests(rec, synthetic_requests(seed=1, n_requests=1))
    print("holding", flush=True)
    time.sleep(600)
""")


def _start_holder(run: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    if line.strip() != "holding":
        proc.kill()
        pytest.fail(f"the holding writer did not start: {proc.stderr.read()}")
    return proc


def _messages(caught) -> str:
    return " | ".join(str(w.message) for w in caught)


def test_a_second_writer_of_a_run_is_refused_and_named(tmp_path):
    """The fault sweep's case: two ``resume=True`` writers on one run. The second is refused before it
    touches anything, naming the first (pid and host); break_lock does not take a run from a live process."""
    run = tmp_path / "run"
    first = TraceRecorder(run, model_id="m", flush_every_requests=1)
    requests = synthetic_requests(seed=2, n_requests=3)
    log_requests(first, requests[:1])
    with pytest.raises(FileExistsError, match=rf"being written by another writer, pid {os.getpid()} on host"):
        TraceRecorder(run, resume=True, model_id="m")
    with pytest.raises(FileExistsError, match="break_lock does not take a run from a process that is running"):
        TraceRecorder(run, resume=True, model_id="m", break_lock=True)
    with pytest.raises(FileExistsError, match="being written by another writer"):
        TraceRecorder.check_path(run, resume=True)
    log_requests(first, requests[1:])  # the first writer goes on undisturbed
    first.finish()
    assert not (run / "writer.lock").exists()
    with TraceRecorder(run, resume=True, model_id="m") as again:  # let go: resumable
        assert again.completed_requests == {q["request_id"] for q in requests}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_traces(run).requests) == 3


def test_a_writer_in_another_process_holds_the_run_until_it_dies_then_the_lock_is_stale(tmp_path):
    run = tmp_path / "run"
    proc = _start_holder(run)
    try:
        holder = json.loads((run / "writer.lock").read_text())
        assert holder["pid"] == proc.pid and holder["host"]
        with pytest.raises(FileExistsError, match=rf"pid {proc.pid} on host '{holder['host']}'"):
            TraceRecorder(run, resume=True)
        with pytest.raises(FileExistsError, match="being written"):
            TraceRecorder(run, resume=True, break_lock=True)
        with pytest.warns(UserWarning, match=rf"incomplete.*its writer, pid {proc.pid} .*is still running"):
            load_traces(run)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    # the holder is gone: its lock is stale, reported, and never broken silently
    with pytest.raises(FileExistsError, match=rf"stale writer lock .*pid {proc.pid} .*is not running.*break_lock=True"):
        TraceRecorder(run, resume=True)
    with pytest.raises(FileExistsError, match="stale writer lock"):
        TraceRecorder.check_path(run, resume=True)
    TraceRecorder.check_path(run, resume=True, break_lock=True)  # would be allowed; changes nothing
    assert json.loads((run / "writer.lock").read_text())["pid"] == proc.pid
    with pytest.warns(UserWarning, match=rf"'held'.*incomplete.*lock is stale \(pid {proc.pid} "):
        load_traces(run)
    with pytest.warns(UserWarning, match=rf"broke the writer lock of pid {proc.pid} "):
        rec = TraceRecorder(run, resume=True, break_lock=True)
    assert json.loads((run / "writer.lock").read_text())["pid"] == os.getpid()
    assert len(rec.completed_requests) == 1
    rec.finish()
    assert not (run / "writer.lock").exists()


def test_a_lock_of_another_host_is_refused_unless_broken(tmp_path):
    run = tmp_path / "run"
    TraceRecorder(run, run_id="r").finish()
    (run / "writer.lock").write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": "t",
                                                 "token": "abc"}))
    with pytest.raises(FileExistsError, match="'elsewhere.example' \\(since t\\), another host.*break_lock=True"):
        TraceRecorder(run, resume=True)
    (run / "writer.lock").write_text("")  # a lock cut off while written
    with pytest.raises(FileExistsError, match="unreadable lock.*break_lock=True"):
        TraceRecorder(run, resume=True)
    with pytest.warns(UserWarning, match="broke the writer lock"):
        TraceRecorder(run, resume=True, break_lock=True).finish()


def test_the_lock_is_released_on_finish_on_error_and_when_dropped(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom"):
        with TraceRecorder(run, model_id="m", flush_every_requests=1) as rec:
            log_requests(rec, synthetic_requests(seed=3, n_requests=1))
            assert (run / "writer.lock").exists()
            raise RuntimeError("boom")
    assert not (run / "writer.lock").exists()
    TraceRecorder(run, resume=True, model_id="m")  # dropped at once: nothing held
    assert not (run / "writer.lock").exists()
    refused = tmp_path / "refused"
    TraceRecorder(refused, model_id="m").finish()
    with pytest.raises(ValueError, match="metadata differs"):
        TraceRecorder(refused, resume=True, model_id="other")
    assert not (refused / "writer.lock").exists()  # a refused resume leaves no lock behind


def test_a_writer_whose_lock_was_broken_stops_instead_of_writing_beside_the_new_one(tmp_path):
    run = tmp_path / "run"
    rec = TraceRecorder(run, model_id="m", flush_every_requests=1)
    requests = synthetic_requests(seed=4, n_requests=2)
    log_requests(rec, requests[:1])
    (run / "writer.lock").write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": "t",
                                                 "token": "someone else"}))
    with pytest.raises(RuntimeError, match=f"lock was broken.*'elsewhere.example'.*{requests[1]['request_id']}"):
        log_requests(rec, requests[1:])


def _shard_of(tmp_path: Path, run_id: str, seed: int) -> tuple[Path, set[str]]:
    """A finished shard of ``run_id`` with fresh requests, written by a recorder elsewhere."""
    other = tmp_path / f"other-{seed}"
    requests = synthetic_requests(seed=seed, n_requests=2)
    with TraceRecorder(other, run_id=run_id, model_id="m") as rec:
        log_requests(rec, requests)
    (shard,) = (other / "shards").iterdir()
    return shard, {q["request_id"] for q in requests}


def test_shard_numbers_never_collide(tmp_path):
    """A shard number taken by someone else (the lock aside) is skipped: no shard is replaced, no rename fails."""
    run = tmp_path / "run"
    rec = TraceRecorder(run, run_id="r", model_id="m")
    mine = synthetic_requests(seed=5, n_requests=2)
    log_requests(rec, mine[:1])
    rec.flush()  # shard 0
    theirs, their_ids = _shard_of(tmp_path, "r", seed=6)
    shutil.copytree(theirs, run / "shards" / "000001")  # another writer took number 1
    log_requests(rec, mine[1:])
    rec.flush()  # number 1 is taken: shard 2
    rec.finish()
    assert sorted(p.name for p in (run / "shards").iterdir()) == ["000000", "000001", "000002"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traces = load_traces(run)
    assert set(traces.requests["request_id"].astype(str)) == {q["request_id"] for q in mine} | their_ids


def test_leftover_shards_of_a_crashed_writer_are_quarantined_and_reported_not_deleted(tmp_path):
    """A writer that died while publishing a shard (the fault sweep: its requests sat only in ``.tmp-*``): the
    next resume neither deletes them nor ends "complete" in silence. It moves them to quarantine/, warns with
    the request ids the run lacks, lists them in run.json; load_traces warns as long as they are there."""
    run = tmp_path / "run"
    rec = TraceRecorder(run, run_id="r", model_id="m", flush_every_requests=1)
    log_requests(rec, synthetic_requests(seed=7, n_requests=1))
    done = set(rec.completed_requests)
    del rec  # the writer dies: its lock goes with the object here; the shard it was publishing stays behind
    orphan, orphan_ids = _shard_of(tmp_path, "r", seed=8)
    shutil.copytree(orphan, run / "shards" / ".tmp-000001-deadbeef")
    (run / "shards" / ".tmp-000002-cafecafe").mkdir()  # and one cut off before any table was written
    files = sorted(p.name for p in (run / "shards" / ".tmp-000001-deadbeef").iterdir())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TraceRecorder(run, resume=True, model_id="m") as resumed:
            assert resumed.completed_requests == done  # the orphaned requests are recorded again
    said = _messages(caught)
    assert "found 2 unfinished shard folder(s)" in said and "quarantine" in said and "nothing deleted" in said
    assert all(rid in said for rid in orphan_ids) and "not in the run's shards" in said
    assert not list((run / "shards").glob(".tmp-*"))
    kept = run / "quarantine" / "tmp-000001-deadbeef"
    assert sorted(p.name for p in kept.iterdir()) == files  # moved whole, not deleted
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete"
    listed = {entry["from"]: entry for entry in meta["quarantined"]}
    assert set(listed) == {"shards/.tmp-000001-deadbeef", "shards/.tmp-000002-cafecafe"}
    assert set(listed["shards/.tmp-000001-deadbeef"]["request_ids"]) == orphan_ids
    assert listed["shards/.tmp-000002-cafecafe"]["request_ids"] is None

    with pytest.warns(UserWarning, match=r"'r'.*2 quarantined leftover\(s\).*tmp-000001-deadbeef"):
        traces = load_traces(run)
    assert set(traces.requests["request_id"].astype(str)) == done  # quarantined data is never read


def test_load_traces_warns_about_leftovers_in_a_complete_run(tmp_path):
    run = tmp_path / "run"
    with TraceRecorder(run, run_id="r") as rec:
        log_requests(rec, synthetic_requests(seed=9, n_requests=1))
    (run / "shards" / ".tmp-000007-0badf00d").mkdir()
    with pytest.warns(UserWarning, match=r"'r'.*complete but holds 1 unfinished temporary shard.*\.tmp-000007"):
        load_traces(run)


def test_check_path_refuses_what_the_recorder_refuses_and_writes_nothing(tmp_path):
    TraceRecorder.check_path(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        TraceRecorder.check_path(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match="holds no trace run"):
        TraceRecorder.check_path(tmp_path / "other", resume=True)
    TraceRecorder(tmp_path / "run").finish()
    with pytest.raises(FileExistsError, match="complete run"):
        TraceRecorder.check_path(tmp_path / "run")
    TraceRecorder.check_path(tmp_path / "run", resume=True)
    TraceRecorder.check_path(tmp_path / "run", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json", "shards"]


def test_a_folder_left_with_only_a_stale_lock_is_taken_over_when_asked(tmp_path):
    """A writer killed right after taking the lock of a new run (before run.json): the folder is not 'someone
    else's', it is reported as held by a stale lock."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    (run / "writer.lock").write_text(json.dumps({"pid": dead_pid, "host": __import__("socket").gethostname(),
                                                 "started": "t", "token": "x"}))
    time.sleep(0.01)
    with pytest.raises(FileExistsError, match=f"stale writer lock.*pid {dead_pid}"):
        TraceRecorder(run)
    with pytest.warns(UserWarning, match="broke the writer lock"):
        TraceRecorder(run, break_lock=True, run_id="new").finish()
    assert json.loads((run / "run.json").read_text())["run_id"] == "new"
