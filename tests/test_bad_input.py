"""Bad input, swept: each case gets a clear one-line error (or a refusal that changes nothing) and loses nothing.

The recorder: a refused call (a bad round, request start or end) leaves it as it was, so that any sequence of
valid and invalid calls leaves exactly the valid requests on disk (a property test, ``N_SEQUENCES`` generated
sequences), and float token ids are refused, never truncated. The command line: an output file is replaced only
with ``--overwrite``; every ``OSError`` is one line naming the path (exit 2); Ctrl-C is one line (exit 130) and
``record`` says what was kept and how to resume; a writer whose lock file is removed stops at once, in one line.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entropy_law.cli import main
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder
from tests.traces_helpers import log_requests, synthetic_requests

N_SEQUENCES = 120  # generated call sequences of the property test (derandomized: the same ones on every run)
INT32_MAX = 2**31 - 1


def _stats(n: int) -> dict:
    h = np.full(n, 0.5, np.float32)
    return {"entropy_nats": h, "renyi2_nats": h * np.float32(0.5), "top1_prob": np.full(n, 0.6, np.float32),
            "top2_prob": np.full(n, 0.3, np.float32), "logit_gap": np.ones(n, np.float32)}


def _round(**overrides) -> dict:
    args = dict(round_index=0, start_position=0, context_len=10, block_size=4, tree_nodes=3, tree_depth=3,
                accepted=1, token_ids=[5, 6], ends_at_leaf=False, target_stats=_stats(2))
    args.update(overrides)
    return args


# -- the recorder: a refused call changes nothing -------------------------------------------------------------
# (name, what the call gets wrong, the refusal's words); each "before" note says what the recorder did before
BAD_ROUNDS = [
    # before: appended the round, then raised; every later flush failed (column lengths), the run was lost
    ("misspelt policy key", dict(policy={"policy_entropy_natz": 0.4}), r"unknown policy column\(s\)"),
    # before: accepted; the flush then failed in pyarrow and took every later request with it
    ("policy value of another type", dict(policy={"policy_budget": "three"}), r"policy\['policy_budget'\]"),
    ("policy that is not a dict", dict(policy=[("policy_budget", 1)]), "policy must be a dict"),
    # before: silently truncated to [1, 2]
    ("float token ids", dict(token_ids=[1.7, 2.2]), r"token_ids must be integers .*float64"),
    ("integral float token ids", dict(token_ids=np.array([5.0, 6.0])), "token_ids must be integers"),
    # before: wrapped around in the int32 column (a wrong token id on disk)
    ("token id beyond int32", dict(token_ids=[5, 2**33]), r"token ids must lie in \[0, 2147483647\]"),
    # before: accepted; the flush then failed (int16 column) and the recorder was stuck
    ("block size beyond int16", dict(block_size=40_000), r"block_size must lie in \[1, 32767\]"),
    # before: stored as inf, which load_traces then refused: the whole run unreadable
    ("time beyond float32", dict(draft_ms=1e39), "draft_ms must be finite and >= 0"),
    # before: truncated to 0
    ("non-integral round index", dict(round_index=0.5), "round_index must be an integer"),
    # already refused before any change (kept so that they stay so)
    ("negative token id", dict(token_ids=[5, -6]), "token ids must lie in"),
    ("more tokens than a round commits", dict(token_ids=[5, 6, 7], target_stats=_stats(3)), "3 committed tokens"),
    ("target statistics of another length", dict(target_stats=_stats(3)), "length committed=2"),
    ("NaN target entropy", dict(target_stats={**_stats(2), "entropy_nats": np.array([0.1, np.nan], np.float32)}),
     "is NaN at depth 2"),
]


@pytest.mark.parametrize("name, overrides, message", BAD_ROUNDS, ids=[case[0] for case in BAD_ROUNDS])
def test_a_refused_round_leaves_the_recorder_usable_and_the_run_whole(tmp_path, name, overrides, message):
    run = tmp_path / "run"
    with TraceRecorder(run, model_id="m", flush_every_requests=1) as rec:
        rec.begin_request("q", category="math")
        with pytest.raises((ValueError, TypeError), match=message):
            rec.log_round("q", **_round(**overrides))
        rec.log_round("q", **_round(policy={"policy_budget": 3, "policy_drafted": True}))
        rec.end_request("q", new_tokens=2, stop_reason="eos")
        log_requests(rec, synthetic_requests(seed=5, n_requests=2))
    traces = load_traces(run)
    assert sorted(traces.requests["request_id"]) == ["q", "req-5-0", "req-5-1"]
    q_rounds = traces.rounds[traces.rounds["request_id"] == "q"]
    assert q_rounds["round_index"].tolist() == [0] and q_rounds["policy_budget"].tolist() == [3]
    assert traces.tokens.loc[traces.tokens["request_id"] == "q", "token_id"].tolist() == [5, 6]


BAD_ENDS = [
    # before: accepted; the flush then failed (int32 column), the request and every later one lost
    ("new_tokens beyond int32", dict(new_tokens=2**40), r"new_tokens must lie in \[0, 2147483647\]"),
    # before: stored as inf: load_traces refused the run
    ("decode time beyond float32", dict(decode_ms=1e39), "decode_ms must be finite and >= 0"),
    ("unknown stop reason", dict(stop_reason="tired"), "stop_reason must be one of"),
    ("fewer tokens than logged", dict(new_tokens=1), "new_tokens 1 < 2"),
]


@pytest.mark.parametrize("name, overrides, message", BAD_ENDS, ids=[case[0] for case in BAD_ENDS])
def test_a_refused_end_leaves_the_request_open_and_endable(tmp_path, name, overrides, message):
    run = tmp_path / "run"
    with TraceRecorder(run, model_id="m", flush_every_requests=1) as rec:
        rec.begin_request("q", category="math")
        rec.log_round("q", **_round())
        with pytest.raises(ValueError, match=message):
            rec.end_request("q", **{"new_tokens": 2, "stop_reason": "eos", **overrides})
        rec.end_request("q", new_tokens=3, stop_reason="eos")
    requests = load_traces(run).requests
    assert requests["request_id"].tolist() == ["q"] and requests["new_tokens"].tolist() == [3]


def test_a_prompt_length_beyond_int32_is_refused_at_begin_request(tmp_path):
    # before: accepted; the flush then failed and the run was stuck
    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        with pytest.raises(ValueError, match=r"prompt_tokens must lie in \[0, 2147483647\]"):
            rec.begin_request("q", category="math", prompt_tokens=2**40)
        rec.begin_request("q", category="math", prompt_tokens=7)
        rec.log_round("q", **_round())
        rec.end_request("q", new_tokens=2, stop_reason="eos")
    assert load_traces(tmp_path / "run").requests["prompt_tokens"].tolist() == [7]


# -- the property: any sequence of calls leaves exactly the valid requests on disk -----------------------------
POOL = ("a", "b", "c", "d")
ROUND_FAULTS = ("misspelt policy key", "policy value of another type", "float token ids", "token id beyond int32",
                "negative token id", "too many token ids", "stats of another length", "NaN entropy",
                "round index not increasing", "overlapping start", "block size beyond int16", "time beyond float32",
                "non-integral round index", "unknown request")
BEGIN_FAULTS = ("empty category", "negative prompt length", "prompt length beyond int32")
END_FAULTS = ("unknown stop reason", "fewer tokens than logged", "new_tokens beyond int32", "NaN decode time")


def _valid_round(data, state: dict) -> dict:
    block = data.draw(st.integers(1, 6), label="block_size")
    depth = data.draw(st.integers(0, block - 1), label="tree_depth")
    accepted = data.draw(st.integers(0, depth), label="accepted")
    committed = accepted + 1 if accepted == 0 or data.draw(st.booleans(), label="bonus") else accepted
    leaf = True if committed == accepted + 1 and accepted == depth else data.draw(st.booleans(), label="leaf")
    policy = data.draw(st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "policy_entropy_nats": st.floats(0, 10), "policy_budget": st.integers(0, 64),
        "policy_drafted": st.booleans(), "policy_route": st.sampled_from(["ngram", "block"]),
        "policy_context_match": st.one_of(st.none(), st.integers(0, 100))})), label="policy")
    return dict(round_index=state["last_round"] + 1 + data.draw(st.integers(0, 1), label="round gap"),
                start_position=state["next_position"] + data.draw(st.integers(0, 1), label="position gap"),
                context_len=10, block_size=block, tree_nodes=depth + data.draw(st.integers(0, 3)), tree_depth=depth,
                accepted=accepted, ends_at_leaf=leaf, target_stats=_stats(committed),
                token_ids=data.draw(st.lists(st.integers(0, 50_000), min_size=committed, max_size=committed)),
                draft_ms=data.draw(st.floats(0, 5)), verify_ms=1.0, overhead_ms=0.5, policy=policy)


def _faulty_round(fault: str, good: dict, state: dict) -> dict:
    bad = dict(good)
    ids = list(good["token_ids"])
    if fault == "misspelt policy key":
        bad["policy"] = {"policy_budgett": 2}
    elif fault == "policy value of another type":
        bad["policy"] = {"policy_drafted": 0.5}
    elif fault == "float token ids":
        bad["token_ids"] = [float(t) + 0.25 for t in ids]
    elif fault == "token id beyond int32":
        bad["token_ids"] = ids[:-1] + [INT32_MAX + 1]
    elif fault == "negative token id":
        bad["token_ids"] = ids[:-1] + [-1]
    elif fault == "too many token ids":
        bad["token_ids"] = ids + [1, 2]
        bad["target_stats"] = _stats(len(ids) + 2)
    elif fault == "stats of another length":
        bad["target_stats"] = _stats(len(ids) + 1)
    elif fault == "NaN entropy":
        bad["target_stats"] = {**_stats(len(ids)), "entropy_nats": np.full(len(ids), np.nan, np.float32)}
    elif fault == "round index not increasing":
        bad["round_index"] = state["last_round"]
    elif fault == "overlapping start":
        bad["start_position"] = state["next_position"] - 1
    elif fault == "block size beyond int16":
        bad["block_size"] = 2**15
    elif fault == "time beyond float32":
        bad["verify_ms"] = 1e39
    elif fault == "non-integral round index":
        bad["round_index"] = good["round_index"] + 0.5
    return bad


@settings(max_examples=N_SEQUENCES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_sequence_of_valid_and_invalid_calls_leaves_exactly_the_valid_requests_on_disk(data):
    flush_every = data.draw(st.sampled_from([1, 2, None]), label="flush_every_requests")
    begun, ended = {}, {}  # request id -> its model state: what the valid calls logged
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        with TraceRecorder(run, model_id="m", flush_every_requests=flush_every, flush_every_rounds=4) as rec:
            for _ in range(data.draw(st.integers(1, 30), label="calls")):
                call = data.draw(st.sampled_from(["begin", "round", "round", "round", "end"]), label="call")
                rid = data.draw(st.sampled_from(POOL), label="request")
                state = begun.get(rid)
                is_open = state is not None and rid not in ended
                if call == "begin":
                    fault = data.draw(st.sampled_from((None,) + BEGIN_FAULTS), label="begin fault")
                    kwargs = {"category": "math", "prompt_tokens": 3}
                    if fault == "empty category":
                        kwargs["category"] = ""
                    elif fault == "negative prompt length":
                        kwargs["prompt_tokens"] = -1
                    elif fault == "prompt length beyond int32":
                        kwargs["prompt_tokens"] = INT32_MAX + 1
                    if fault is None and state is None:
                        rec.begin_request(rid, **kwargs)
                        begun[rid] = {"last_round": -1, "next_position": 0, "rounds": [], "tokens": []}
                    else:  # a fault, or an id already begun
                        with pytest.raises((ValueError, TypeError)):
                            rec.begin_request(rid, **kwargs)
                elif call == "round":
                    model = state if is_open else {"last_round": -1, "next_position": 0}
                    good = _valid_round(data, model)
                    fault = data.draw(st.sampled_from((None,) + ROUND_FAULTS), label="round fault")
                    if fault is None and is_open:
                        rec.log_round(rid, **good)
                        state["last_round"] = good["round_index"]
                        state["next_position"] = good["start_position"] + len(good["token_ids"])
                        state["rounds"].append(good["round_index"])
                        state["tokens"].extend(good["token_ids"])
                    else:  # a fault, or a request that is not open
                        target = "never-begun" if fault == "unknown request" else rid
                        with pytest.raises((ValueError, TypeError)):
                            rec.log_round(target, **_faulty_round(fault, good, model))
                else:
                    fault = data.draw(st.sampled_from((None,) + END_FAULTS), label="end fault")
                    position = state["next_position"] if is_open else 0
                    kwargs = {"new_tokens": position + data.draw(st.integers(0, 1)), "stop_reason": "eos"}
                    if fault == "unknown stop reason":
                        kwargs["stop_reason"] = "tired"
                    elif fault == "fewer tokens than logged":
                        kwargs["new_tokens"] = position - 1
                    elif fault == "new_tokens beyond int32":
                        kwargs["new_tokens"] = INT32_MAX + 1
                    elif fault == "NaN decode time":
                        kwargs["decode_ms"] = math.nan
                    if fault is None and is_open:
                        rec.end_request(rid, **kwargs)
                        ended[rid] = {**state, "new_tokens": kwargs["new_tokens"]}
                    else:
                        with pytest.raises((ValueError, TypeError)):
                            rec.end_request(rid, **kwargs)
            for rid, state in begun.items():  # the requests still open are ended, validly
                if rid not in ended:
                    rec.end_request(rid, new_tokens=state["next_position"], stop_reason="max_new_tokens")
                    ended[rid] = {**state, "new_tokens": state["next_position"]}
        traces = load_traces(run)
        requests = traces.requests.set_index("request_id")
        assert sorted(requests.index) == sorted(ended)
        for rid, state in ended.items():
            assert requests.loc[rid, "new_tokens"] == state["new_tokens"]
            assert requests.loc[rid, "rounds"] == len(state["rounds"])
            rounds = traces.rounds[traces.rounds["request_id"] == rid]
            assert rounds["round_index"].tolist() == state["rounds"]
            tokens = traces.tokens[traces.tokens["request_id"] == rid].sort_values("position")
            assert tokens["token_id"].tolist() == state["tokens"]


# -- the command line ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trace_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("traces") / "run"
    with TraceRecorder(run, model_id="m", drafter_id="ngram") as rec:
        log_requests(rec, synthetic_requests(seed=2, n_requests=6))
    return run


def _one_line(capsys, command: str) -> str:
    """The one line a command wrote to standard error (no traceback)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("entropy-law")]
    assert len(lines) == 1 and lines[0].startswith(f"entropy-law {command}: "), lines
    return lines[0]


def _file(path: Path, text: str = "my tasks\n") -> Path:
    path.write_text(text)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


# (name, arguments after the run, the setup of the output, the one line's words, what must stay as it was)
CLI_CASES = [
    # before: replaced the file without asking
    ("export over an existing file", lambda d: ["export", "--format", "glance", "{run}", "--out", str(_file(d / "t"))],
     r"--out .*t exists; pass --overwrite to replace it"),
    # before: IsADirectoryError traceback
    ("export into a folder", lambda d: ["export", "--format", "glance", "{run}", "--out", str(_folder(d / "f"))],
     r"--out .*f is a folder; give a file path"),
    # before: FileExistsError traceback
    ("export below a file", lambda d: ["export", "--format", "glance", "{run}", "--out", str(_file(d / "t") / "x")],
     r"--out .*t/x: .*t is a file, not a folder"),
    # before: NotADirectoryError traceback (after the whole fit)
    ("report into a file", lambda d: ["report", "{run}", "--out", str(_file(d / "t")), "--n-boot", "2"],
     r"--out .*t is a file; give a folder"),
    ("report below a file", lambda d: ["report", "{run}", "--out", str(_file(d / "t") / "r"), "--n-boot", "2"],
     r"--out .*t/r: .*t is a file, not a folder"),
    # before: replaced the report (and its figures) without asking
    ("report over a report",
     lambda d: ["report", "{run}", "--out", str(_file(_folder(d / "r") / "report.html").parent)],
     r"--out .*r already holds report.html; pass --overwrite"),
    ("report's results section over a file",
     lambda d: ["report", "{run}", "--out", str(d / "r"), "--results-md", str(_file(d / "README.md"))],
     r"--results-md .*README.md exists; pass --overwrite"),
    ("out-of-core report over a report",
     lambda d: ["report", "{run}", "--out-of-core", "--out", str(_file(_folder(d / "r") / "report.md").parent)],
     r"--out .*r already holds report.md; pass --overwrite"),
    # before: OSError traceback (any OSError: here a name longer than the file system allows)
    ("export to a name too long", lambda d: ["export", "--format", "glance", "{run}", "--out", str(d / ("x" * 300))],
     r"x{300}: file name too long"),
]


@pytest.mark.parametrize("name, make_args, message", CLI_CASES, ids=[case[0] for case in CLI_CASES])
def test_a_command_line_mistake_is_one_line_and_changes_nothing(trace_run, tmp_path, capsys, name, make_args,
                                                              message):
    args = [str(trace_run) if a == "{run}" else a for a in make_args(tmp_path)]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(args + (["--no-progress"] if args[0] == "report" else [])) == 2
    line = _one_line(capsys, args[0])
    assert re.search(message, line), line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing replaced


def test_export_replaces_a_file_with_overwrite(trace_run, tmp_path, capsys):
    out = _file(tmp_path / "rounds.jsonl")
    assert main(["export", "--format", "glance", str(trace_run), "--out", str(out), "--overwrite"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and set(rows[0]) >= {"round", "entropy", "accepted"}
    assert [p.name for p in tmp_path.iterdir()] == ["rounds.jsonl"]  # no temporary file left


@pytest.mark.parametrize("error, words", [
    (PermissionError(13, "Permission denied", "/data/out.jsonl"), "/data/out.jsonl: permission denied"),
    (IsADirectoryError(21, "Is a directory", "out"), "out: is a directory"),
    (OSError(28, "No space left on device", "run/shards/.tmp-3"), "run/shards/.tmp-3: no space left on device"),
    (FileExistsError(17, "File exists", "a", None, "b"), "a -> b: file exists"),
])
def test_every_os_error_is_one_line_that_names_the_path(monkeypatch, capsys, error, words):
    import entropy_law.commands.export as export

    def fails(args):
        raise error

    monkeypatch.setattr(export, "run", fails)
    assert main(["export", "--format", "glance", "run"]) == 2  # before: the OSError's traceback
    assert _one_line(capsys, "export") == f"entropy-law export: error: {words}"


def test_ctrl_c_is_one_line(monkeypatch, capsys):
    import entropy_law.commands.export as export

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "run", interrupted)
    assert main(["export", "--format", "glance", "run"]) == 130  # before: KeyboardInterrupt's traceback
    assert _one_line(capsys, "export") == "entropy-law export: interrupted"


# -- record: Ctrl-C and a lock removed by hand, on a tiny model --------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.test_cli_record import make_tiny_model_folder

    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def five_prompts(tmp_path):
    words = ["the cat sat on the mat", "one two three four five", "red blue green red", "the sun was happy",
             "the dog ran to the house"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": "alpha", "turns": [text]}) + "\n"
                            for i, text in enumerate(words, 1)))
    return path


def _record(model, tasks, out, *extra):
    return main(["record", "--model", str(model), "--tasks", str(tasks), "--out", str(out), "--drafter", "ngram",
                 "--max-new-tokens", "8", "--block-size", "4", "--no-progress", *extra])


def _decoding(monkeypatch, at_call: int, action):
    """Count ``SpeculativeDecoder.generate`` calls; at call ``at_call`` run ``action()`` first."""
    from entropy_law.decoding import decoder as decoder_module

    original, calls = decoder_module.SpeculativeDecoder.generate, []

    def generate(self, prompt, **kwargs):
        calls.append(kwargs["request_id"])
        if len(calls) == at_call:
            action()
        return original(self, prompt, **kwargs)

    monkeypatch.setattr(decoder_module.SpeculativeDecoder, "generate", generate)
    return calls


def _recorded(out: Path) -> list[str]:
    with warnings.catch_warnings():  # an interrupted run is incomplete, and says so: known here
        warnings.simplefilter("ignore", UserWarning)
        return sorted(load_traces(out, validate=False).requests["request_id"])


def test_ctrl_c_in_record_says_what_was_kept_and_how_to_resume(tiny_model, five_prompts, tmp_path, monkeypatch,
                                                              capsys):
    out = tmp_path / "run"

    def ctrl_c():
        raise KeyboardInterrupt

    calls = _decoding(monkeypatch, 4, ctrl_c)
    capsys.readouterr()
    assert _record(tiny_model, five_prompts, out) == 130  # before: KeyboardInterrupt's traceback
    assert _one_line(capsys, "record") == (
        f"entropy-law record: interrupted; {out} keeps 3 finished prompt(s), the prompt being decoded was not "
        "recorded; to go on, run the same command with --resume (it skips the prompts already recorded)")
    assert _recorded(out) == sorted(calls[:3])
    monkeypatch.undo()
    assert _record(tiny_model, five_prompts, out, "--resume") == 0
    assert len(_recorded(out)) == 5


def test_a_writer_whose_lock_file_is_removed_stops_at_once_in_one_line(tiny_model, five_prompts, tmp_path,
                                                                      monkeypatch, capsys):
    out = tmp_path / "run"
    calls = _decoding(monkeypatch, 3, lambda: (out / "writer.lock").unlink())  # removed by hand while paused
    capsys.readouterr()
    assert _record(tiny_model, five_prompts, out) == 2  # before: went on decoding, then a RuntimeError traceback
    line = _one_line(capsys, "record")
    assert line.startswith(f"entropy-law record: error: trace run {out}: its lock file {out / 'writer.lock'} was "
                           "removed while this writer held the run")
    assert "the 2 request(s) already written are kept" in line and line.endswith("then resume the run (--resume)")
    assert len(calls) == 3  # stopped at the prompt it was about to decode: none decoded for nothing
    assert _recorded(out) == sorted(calls[:2])
    assert not (out / "writer.lock").exists()
    monkeypatch.undo()
    assert _record(tiny_model, five_prompts, out, "--resume") == 0
    assert len(_recorded(out)) == 5


def test_a_lock_removed_mid_request_stops_the_writer_at_its_next_round(tmp_path, monkeypatch):
    import entropy_law.traces.recorder as recorder

    monkeypatch.setattr(recorder, "_LOCK_CHECK_EVERY_S", 0.0)  # a writer paused for longer than the check interval
    run = tmp_path / "run"
    with pytest.raises(recorder.RunLockLostError) as stopped:
        with TraceRecorder(run, model_id="m", flush_every_requests=1) as rec:
            log_requests(rec, synthetic_requests(seed=6, n_requests=1))
            rec.begin_request("q", category="math")
            rec.log_round("q", **_round())
            (run / "writer.lock").unlink()  # removed by hand
            rec.log_round("q", **_round(round_index=1, start_position=2))  # before: logged, lost at the flush
    message = str(stopped.value)
    assert "was removed while this writer held the run" in message and "stopped at round 1 of request 'q'" in message
    assert "the 1 request(s) already written are kept; not written: 1 request(s) ['q']" in message
    with pytest.raises(recorder.RunLockLostError):  # and stays stopped
        rec.begin_request("r", category="math")
    assert _recorded(run) == ["req-6-0"] and not (run / "writer.lock").exists()


# -- every reader applies one shard check (case 3), a resume repeats it (case 4) ----------------------------------
def _run_of(path: Path, n_requests: int = 6, seed: int = 3, **metadata) -> Path:
    with TraceRecorder(path, flush_every_requests=2, **{"model_id": "m", "drafter_id": "ngram", **metadata}) as rec:
        log_requests(rec, synthetic_requests(seed=seed, n_requests=n_requests))
    return path


def _out_of_core(name: str):
    from entropy_law import outofcore

    return {"aggregate_at_risk_sql": lambda run: outofcore.aggregate_at_risk_sql(run, "law_exp"),
            "fit_law_out_of_core": lambda run: outofcore.fit_law_out_of_core(run, "law_exp"),
            "report_summaries_sql": lambda run: outofcore.report_summaries_sql(run)}[name]


READERS = {
    "load_traces": lambda run: load_traces(run),
    "load_traces(validate=False)": lambda run: load_traces(run, validate=False),
    **{name: (lambda run, name=name: _out_of_core(name)(run))
       for name in ("aggregate_at_risk_sql", "fit_law_out_of_core", "report_summaries_sql")},
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_run_with_a_copied_shard(tmp_path, reader):
    import shutil

    from entropy_law.traces.validation import TraceValidationError

    run = _run_of(tmp_path / "run")
    shutil.copytree(run / "shards" / "000000", run / "shards" / "000007")  # the same request ids in two shards
    with pytest.raises(TraceValidationError, match=r"appears in more than one shard \(000000 and 000007\)"):
        READERS[reader](run)  # before: the out-of-core readers counted its requests twice, silently


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_shard_whose_tokens_file_lost_rows(tmp_path, reader):
    import pyarrow.parquet as pq

    from entropy_law.traces.validation import TraceValidationError

    run = _run_of(tmp_path / "run")
    file = run / "shards" / "000001" / "tokens.parquet"
    pq.write_table(pq.read_table(file).slice(0, 3), file)  # a valid Parquet file, rows missing
    with pytest.raises(TraceValidationError, match="number of token rows differs from rounds.committed"):
        READERS[reader](run)


def test_the_law_command_out_of_core_refuses_a_copied_shard_in_one_line(tmp_path, capsys):
    import shutil

    run = _run_of(tmp_path / "run")
    shutil.copytree(run / "shards" / "000000", run / "shards" / "000007")
    capsys.readouterr()
    assert main(["law", str(run), "--out-of-core"]) == 2  # before: 0, the copied requests fitted twice
    assert "appears in more than one shard (000000 and 000007)" in _one_line(capsys, "law")


def test_a_resume_moves_a_damaged_shard_aside_and_its_requests_are_recorded_again(tmp_path):
    import pyarrow.parquet as pq

    run = _run_of(tmp_path / "run")
    damaged = run / "shards" / "000001"
    lost = sorted(pq.read_table(damaged / "requests.parquet").column("request_id").to_pylist())
    file = damaged / "tokens.parquet"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # cut off
    with pytest.warns(UserWarning, match=r"1 finished shard\(s\) are damaged.*records them again"):
        rec = TraceRecorder(run, resume=True, model_id="m", drafter_id="ngram")
    with rec:
        assert not set(lost) & rec.completed_requests and len(rec.completed_requests) == 4
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["quarantined"][0]["from"] == "shards/000001"
    assert "cannot read as Parquet" in meta["quarantined"][0]["reason"]
    assert (run / "quarantine" / "000001" / "tokens.parquet").exists()  # nothing deleted


def test_record_resume_records_again_the_prompt_of_a_truncated_shard(tiny_model, five_prompts, tmp_path, capsys):
    out = tmp_path / "run"
    assert _record(tiny_model, five_prompts, out) == 0
    file = out / "shards" / "000001" / "tokens.parquet"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.warns(UserWarning, match="damaged"):
        assert _record(tiny_model, five_prompts, out, "--resume") == 0  # before: 0, with the prompt lost
    assert "recorded 1, already recorded 4" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the quarantine folder is said
        assert len(load_traces(out).requests) == 5  # before: load_traces refused the run


# -- arms are told apart by the drafter's settings (case 5) -----------------------------------------------------
def test_two_ngram_settings_in_one_folder_are_two_arms(tmp_path, capsys):
    from entropy_law.law.arms import run_arms
    from entropy_law.law.fit import fit_law
    from entropy_law.outofcore import aggregate_at_risk_sql

    for name, config in (("small", {"max_ngram": 1, "block_size": 3}), ("large", {"max_ngram": 4, "block_size": 11})):
        _run_of(tmp_path / name, n_requests=8, seed=len(name), tree_policy="chain", drafter_config=config)
    traces = load_traces(tmp_path)
    assert sorted(run_arms(traces.runs)["arm"]) == ["ngram chain block_size=11 max_ngram=4",
                                                   "ngram chain block_size=3 max_ngram=1"]  # before: one arm
    with pytest.raises(ValueError, match="mix arms"):
        fit_law(traces, "law_exp")
    with pytest.raises(ValueError, match="mix arms"):
        aggregate_at_risk_sql(tmp_path, "law_exp")
    with pytest.raises(ValueError, match="mix arms"):
        aggregate_at_risk_sql(traces, "law_exp")


def test_a_checkpoint_path_is_not_a_setting(tmp_path):
    from entropy_law.law.arms import run_arms

    for name in ("here", "there"):  # one checkpoint file, found at two paths
        _run_of(tmp_path / name, seed=len(name), tree_policy="chain", drafter_id="block",
                drafter_config={"checkpoint": f"/{name}/b.pt", "checkpoint_sha256": "ab" * 32, "block_size": 8})
    assert run_arms(load_traces(tmp_path).runs)["arm"].nunique() == 1


# -- the task file is known by its content (case 11) ------------------------------------------------------------
def _no_model(monkeypatch):
    from entropy_law.decoding import loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_target", refuse)


def test_resume_takes_the_same_task_file_by_another_path_and_refuses_another_file(tiny_model, five_prompts,
                                                                                   tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert _record(tiny_model, "tasks.jsonl", out, "--limit", "1") == 0
    (tmp_path / "sub").mkdir()
    assert _record(tiny_model, "./sub/../tasks.jsonl", out, "--limit", "2", "--resume") == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["tasks"] == "tasks.jsonl" and len(meta["tasks_sha256"]) == 64
    assert len(_recorded(out)) == 2  # before: refused, the path compared as text (after the model loaded)
    five_prompts.write_text(five_prompts.read_text().replace("the cat sat", "a dog sat"))  # another file, one path
    _no_model(monkeypatch)
    capsys.readouterr()
    assert _record(tiny_model, "tasks.jsonl", out, "--limit", "3", "--resume") == 2  # before: accepted
    line = _one_line(capsys, "record")
    assert "--tasks tasks.jsonl is not the task file" in line and "record into a new --out" in line


# -- smaller (case 12) ------------------------------------------------------------------------------------------
def test_record_that_records_nothing_fails_and_says_why(tiny_model, tmp_path, capsys):
    tasks = tmp_path / "long.jsonl"
    tasks.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["word " * 20_000]}) + "\n")
    capsys.readouterr()
    assert _record(tiny_model, tasks, tmp_path / "run") == 2  # before: 0, an empty run marked complete
    assert "nothing was recorded: all 1 prompt(s) were skipped" in _one_line(capsys, "record")


def test_record_resume_of_a_missing_run_is_refused(tiny_model, five_prompts, tmp_path, monkeypatch, capsys):
    _no_model(monkeypatch)
    capsys.readouterr()
    assert _record(tiny_model, five_prompts, tmp_path / "typo", "--resume") == 2  # before: a new run was started
    assert "no run to resume there" in _one_line(capsys, "record")
    assert not (tmp_path / "typo").exists()


def test_record_threads(tiny_model, five_prompts, tmp_path, monkeypatch, capsys):
    import torch

    _no_model(monkeypatch)
    capsys.readouterr()
    assert _record(tiny_model, five_prompts, tmp_path / "run", "--threads", "0") == 2  # before: no such option
    assert _one_line(capsys, "record") == "entropy-law record: error: --threads must be >= 1, got 0"
    threads = torch.get_num_threads()
    monkeypatch.undo()
    try:
        assert _record(tiny_model, five_prompts, tmp_path / "run", "--threads", "1", "--limit", "1") == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_info_of_a_model_that_does_not_resolve_fails(capsys):
    assert main(["info", "--model", "no-such-model"]) == 2  # before: 0
    assert "--model no-such-model does not exist" in _one_line(capsys, "info")


def test_a_task_line_with_a_null_category_is_refused(tmp_path):
    from entropy_law.prompts.text import load_tasks

    path = tmp_path / "t.jsonl"
    path.write_text('{"question_id": 1, "category": "a", "turns": ["x"]}\n'
                    '{"question_id": 2, "category": null, "turns": ["y"]}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: 'category' is null"):  # before: the category "None"
        load_tasks(path)


def test_non_utf8_bytes_in_a_task_file_name_the_line(tmp_path):
    from entropy_law.prompts.text import load_tasks

    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"question_id": 1, "category": "a", "turns": ["x"]}\n'
                     b'{"question_id": 2, "category": "a", "turns": ["\xff"]}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: not UTF-8 text \(byte 0xff at column 48\)"):
        load_tasks(path)  # before: UnicodeDecodeError without the line


def _vllm_line(request_id: str) -> bytes:
    engines = Path(__file__).parent / "data" / "engines"
    line = (engines / "vllm_metrics_summary.jsonl").read_text().splitlines()[0]
    return (json.dumps({**json.loads(line), "request_id": request_id}) + "\n").encode()


def test_non_utf8_bytes_in_an_import_file_name_the_line_and_skip_bad_skips_it(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_bytes(_vllm_line("a") + b'{"bad": "\xff"}\n' + _vllm_line("b"))
    assert main(["import", "vllm", str(path), "--out", str(tmp_path / "run")]) == 2
    assert f"{path}:2: (line): not UTF-8 text (byte 0xff" in _one_line(capsys, "import")
    assert main(["import", "vllm", str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 0  # before: refused
    assert sorted(load_traces(tmp_path / "run").requests["request_id"]) == ["a", "b"]


def test_non_utf8_bytes_in_a_glance_log_are_skipped_with_skip_bad(tmp_path, capsys):
    good = {"round": 0, "entropy": 0.5, "accepted": 2, "tau": 3, "tree_size": 64, "extended": False, "task": "docvqa",
            "prompt": 0}
    path = tmp_path / "rounds.jsonl"
    path.write_bytes((json.dumps(good) + "\n").encode() + b'{"round": "\xff"}\n'
                     + (json.dumps({**good, "round": 1}) + "\n").encode())
    assert main(["import", "glance", str(path), "--out", str(tmp_path / "run")]) == 2
    assert f"{path}:2: (line): not UTF-8 text" in _one_line(capsys, "import")
    assert main(["import", "glance", str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 0


@pytest.mark.parametrize("engine, line", [("vllm", b'{"no": "fields"}\n'), ("glance", b'{"round": "x"}\n'),
                                          ("specbench", b'{"question_id": 1}\n')])
def test_an_import_whose_every_line_is_bad_fails(tmp_path, capsys, engine, line):
    path = tmp_path / "all-bad.jsonl"
    path.write_bytes(line * 2)
    capsys.readouterr()
    assert main(["import", engine, str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 2  # before: 0
    assert "all 2 line(s) are bad and were skipped" in _one_line(capsys, "import")
    assert not (tmp_path / "run").exists()
