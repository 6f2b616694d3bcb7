"""``entropy-law record`` killed with SIGKILL loses at most the prompt in flight: every finished prompt is
in its own shard, the run loads, and ``--resume --break-lock`` finishes the rest with the output an
uninterrupted run gives.

The recording runs in a subprocess on the tiny local model folder of ``test_cli_record``; it stops for good
inside the second prompt (an observer that sleeps), and the test kills it there with a real SIGKILL.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import entropy_law
from entropy_law import load_traces
from entropy_law.cli import main
from test_cli_record import make_tiny_model_folder, read_table

PACKAGE_ROOT = Path(entropy_law.__file__).resolve().parent.parent  # the package under test, for the subprocess

# entropy-law record, with an observer that hangs in round 1 of the second prompt (the first has ended)
HANGING_RECORD = textwrap.dedent("""
    import sys, time
    from entropy_law.cli import main
    from entropy_law.decoding.observers import RecorderObserver

    original = RecorderObserver.on_round

    def on_round(self, record):
        if record.request_id == "tasks:2" and record.round_index == 1:
            print("in flight", record.request_id, flush=True)
            time.sleep(600)
        return original(self, record)

    RecorderObserver.on_round = on_round
    sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def three_prompts(tmp_path):
    rows = [{"question_id": 1, "category": "alpha", "turns": ["the cat sat on the mat"]},
            {"question_id": 2, "category": "alpha", "turns": ["one two three four five one two three"]},
            {"question_id": 3, "category": "beta", "turns": ["red blue green red blue green red"]}]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(model_folder, tasks, out, *extra):
    return ["record", "--model", str(model_folder), "--tasks", str(tasks), "--out", str(out),
            "--max-new-tokens", "24", "--block-size", "4", "--no-progress", *extra]


def _finished_shards(run: Path) -> list[Path]:
    root = run / "shards"
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()) if root.is_dir() else []


def test_sigkill_loses_at_most_the_prompt_in_flight_and_resume_finishes(model_folder, three_prompts, tmp_path, capsys):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", HANGING_RECORD, *_args(model_folder, three_prompts, run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # blocks until the second prompt hangs, or the process ends
        if not line.startswith("in flight"):
            pytest.fail(f"record did not reach the second prompt: {line!r}; stderr: {proc.stderr.read()[-2000:]}")
        deadline = time.monotonic() + 30
        while not _finished_shards(run) and time.monotonic() < deadline:
            time.sleep(0.05)
        shards = _finished_shards(run)
        assert shards, "the first prompt ended, but no shard holds it: a kill now would lose it"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # the finished prompt is on disk and loads; the one in flight is not there, nothing else is
    with pytest.warns(UserWarning, match="incomplete"):
        traces = load_traces(run)
    assert list(traces.requests["request_id"].astype(str)) == ["tasks:1"]
    assert traces.requests["new_tokens"].iloc[0] == len(traces.tokens)

    # the killed writer's lock is stale: --resume alone is refused before the model loads, naming it
    assert main(_args(model_folder, three_prompts, run, "--resume")) == 2
    err = capsys.readouterr().err
    assert f"pid {proc.pid}" in err and "stale" in err and "--break-lock" in err
    with pytest.warns(UserWarning, match=f"broke the writer lock of pid {proc.pid} "):
        assert main(_args(model_folder, three_prompts, run, "--resume", "--break-lock")) == 0
    capsys.readouterr()

    # the resumed run holds every prompt once, with the tokens of an uninterrupted run
    assert main(_args(model_folder, three_prompts, tmp_path / "uninterrupted")) == 0
    resumed, reference = read_table(run, "tokens"), read_table(tmp_path / "uninterrupted", "tokens")
    assert sorted(set(resumed["request_id"])) == ["tasks:1", "tasks:2", "tasks:3"]
    for request_id, group in reference.groupby("request_id"):
        mine = resumed[resumed["request_id"] == request_id].sort_values("position")
        assert mine["token_id"].tolist() == group.sort_values("position")["token_id"].tolist()
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    assert len(_finished_shards(run)) == 3  # a shard per prompt (--flush-every 1, the default)
    assert not (run / "writer.lock").exists()


def test_flush_every_groups_prompts_into_shards(model_folder, three_prompts, tmp_path):
    run = tmp_path / "run"
    assert main(_args(model_folder, three_prompts, run, "--flush-every", "2")) == 0
    assert len(_finished_shards(run)) == 2  # prompts 1-2, then 3 at the end
    assert len(load_traces(run).requests) == 3
