"""A writer killed with SIGKILL mid-run leaves a loadable dataset: flushed shards intact, run incomplete, its
lock stale (resuming needs break_lock=True), an unfinished shard quarantined on resume."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from entropy_law import TraceRecorder, load_traces

ROOT = Path(__file__).resolve().parent.parent

# The writer logs requests forever; entropies encode (request, round, depth) so the reader can check
# every value; after each flush it prints the ids it flushed.
WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from entropy_law import TraceRecorder

    rec = TraceRecorder(sys.argv[1], run_id="killed", flush_every_rounds=6)
    i = 0
    while True:
        rid = f"req-{i}"
        rec.begin_request(rid, category="math")
        for r in range(3):
            h = np.array([i + r / 10 + d / 100 for d in range(1, 3)], np.float32)
            stats = {"entropy_nats": h, "renyi2_nats": h, "top1_prob": np.full(2, 0.5, np.float32),
                     "top2_prob": np.full(2, 0.25, np.float32), "logit_gap": np.ones(2, np.float32)}
            rec.log_round(rid, round_index=r, start_position=2 * r, context_len=5 + 2 * r, block_size=4,
                          tree_nodes=3, tree_depth=3, accepted=1, token_ids=[i % 50, r], ends_at_leaf=False,
                          target_stats=stats)
        flushed_before = len(rec.completed_requests)
        rec.end_request(rid, new_tokens=6, stop_reason="eos")  # flushes every second request
        if len(rec.completed_requests) > flushed_before:
            print("flushed", " ".join(sorted(rec.completed_requests)), flush=True)
        i += 1
""")


def test_sigkill_mid_run_leaves_loadable_incomplete_run(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    flushed: set[str] = set()
    deadline = time.monotonic() + 120
    try:
        while len(flushed) < 20:  # at least 10 shards confirmed, then kill while it keeps writing
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"writer exited early: {proc.stderr.read()}")
            flushed = set(line.split()[1:])
            assert time.monotonic() < deadline, "writer too slow"
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    with pytest.warns(UserWarning, match="'killed'.*incomplete.*lock is stale"):
        traces = load_traces(run)  # validates every shard and the cross-table rules
    on_disk = set(traces.requests["request_id"].astype(str))
    assert flushed <= on_disk  # every flush reported before the kill is there
    tokens = traces.tokens
    assert len(tokens) == 6 * len(on_disk)
    i = tokens["request_id"].astype(str).str.slice(4).astype(int).to_numpy()
    expected = (i + tokens["round_index"].to_numpy() / 10 + tokens["depth"].to_numpy() / 100).astype(np.float32)
    np.testing.assert_array_equal(tokens["target_entropy_nats"].to_numpy(), expected)
    assert traces.runs.loc[0, "status"] == "running"

    # the killed writer's lock is stale: resuming is refused until it is broken explicitly
    with pytest.raises(FileExistsError, match=f"stale writer lock.*pid {proc.pid} .*break_lock=True"):
        TraceRecorder(run, resume=True)
    # then completed requests are known, an unfinished shard (if the kill hit one) is quarantined, not deleted
    leftovers = [p.name for p in (run / "shards").glob(".tmp-*")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TraceRecorder(run, resume=True, break_lock=True) as rec:
            assert rec.completed_requests == on_disk
    said = " ".join(str(w.message) for w in caught)
    assert f"broke the writer lock of pid {proc.pid}" in said
    assert not list((run / "shards").glob(".tmp-*"))
    assert sorted(p.name for p in (run / "quarantine").glob("*")) == sorted(n.lstrip(".") for n in leftovers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_traces(run).runs.loc[0, "status"] == "complete"
    said = [str(w.message) for w in caught]
    if leftovers:  # the reader says so for as long as the quarantined leftovers are there
        assert len(said) == 1 and "quarantined leftover" in said[0]
    else:
        assert said == []
