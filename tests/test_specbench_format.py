"""Spec-Bench's answer format both ways: import, export, and the evaluation script's numbers on our runs.

``speed_py_numbers`` reimplements what Spec-Bench's ``evaluation/speed.py`` computes from an answer file (read
from its definition, not copied): per question ``sum(new_tokens) / sum(wall_time)`` of ``choices[0]``, averaged
over questions, and "#Mean accepted tokens", the mean of every ``choices[0].accept_lengths`` entry pooled over
the file."""

import json
from pathlib import Path

import numpy as np
import pytest

from entropy_law import TraceRecorder, load_traces
from entropy_law.cli import main
from entropy_law.importers.records import MalformedResponseError
from entropy_law.importers.specbench import export_specbench, import_specbench, specbench_answers, split_turns
from tests.traces_helpers import log_requests, synthetic_requests

FIXTURE = Path(__file__).parent / "data" / "specbench" / "answers.jsonl"
READ_BY_SPEED_PY = ("new_tokens", "wall_time", "accept_lengths")


def speed_py_numbers(lines: list[dict]) -> tuple[float, float]:
    speeds, accept = [], []
    for line in lines:
        choice = line["choices"][0]
        speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
        accept.extend(choice["accept_lengths"])
    return float(np.mean(speeds)), float(np.mean(accept))


def read(path: Path) -> list[dict]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def test_round_trip_import_export_is_equal(tmp_path):
    assert main(["import", "specbench", str(FIXTURE), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", "--format", "specbench", str(tmp_path / "run"), "--out", str(tmp_path / "out.jsonl")]) == 0
    original, exported = read(FIXTURE), read(tmp_path / "out.jsonl")
    assert exported == original
    assert speed_py_numbers(exported) == speed_py_numbers(original)


def test_imported_rounds_follow_accept_lengths_in_order(tmp_path):
    import_specbench(FIXTURE, tmp_path / "run")
    traces = load_traces(tmp_path / "run")
    rounds = traces.rounds
    per_request = {str(r): g.sort_values("round_index")["committed"].tolist()
                   for r, g in rounds.groupby("request_id", observed=True)}
    assert per_request == {"81": [3, 4, 1, 4], "81#1": [5, 2, 2], "82": [2, 5, 1, 3, 2], "83": [5, 1]}
    requests = traces.requests.set_index("request_id")
    assert requests.loc["81#1", "new_tokens"] == 9 and requests.loc["82", "new_tokens"] == 14
    assert requests.loc["82", "decode_ms"] == pytest.approx(511.7)
    # question 82's steps commit 13 of its 14 tokens: its first token came from the prefill, so rounds start at 1
    assert rounds.loc[rounds["request_id"] == "82", "start_position"].min() == 1
    split = next(iter(traces.metadata.values()))["engine_import"]["split"]
    assert split == {"81": "steps", "82": "prefill", "83": "prefill"}
    _, mean_accepted = speed_py_numbers(read(FIXTURE))
    assert mean_accepted == pytest.approx(rounds["committed"].mean())


def test_the_evaluation_scripts_mean_accepted_tokens_is_our_committed_tokens_per_round(tmp_path):
    with TraceRecorder(tmp_path / "run", model_id="m", drafter_id="d") as rec:
        log_requests(rec, synthetic_requests(seed=3, n_requests=6))
    traces = load_traces(tmp_path / "run")
    lines = specbench_answers(traces)
    tokens_per_second, mean_accepted = speed_py_numbers(lines)
    assert mean_accepted == pytest.approx(traces.rounds["committed"].mean(), rel=1e-12)
    assert mean_accepted == pytest.approx(traces.summary["mean_committed"].iloc[0], rel=1e-12)
    req = traces.requests
    ours = (req["new_tokens"] / ((req["prefill_ms"] + req["decode_ms"]) / 1000)).mean()
    assert tokens_per_second == pytest.approx(ours, rel=1e-6)
    for line in lines:  # a request's rounds commit at most its new tokens (a prefill or stop token may be unlogged)
        choice = line["choices"][0]
        assert sum(choice["accept_lengths"]) <= sum(choice["new_tokens"])
    # and the export reads back as the same rounds, question by question
    export_specbench(traces, tmp_path / "answers.jsonl")
    import_specbench(tmp_path / "answers.jsonl", tmp_path / "back")
    back = load_traces(tmp_path / "back")

    def committed_by_question(t):
        ids = t.requests.set_index("request_id")["question_id"].astype(str)
        rounds = t.rounds.sort_values("round_index")
        return {ids[r]: g["committed"].tolist() for r, g in rounds.groupby("request_id", observed=True)}

    flagged = {str(f["question_id"]) for f in next(iter(back.metadata.values()))["engine_import"]["flagged"]}
    ours = committed_by_question(traces)
    assert committed_by_question(back) == {q: c for q, c in ours.items() if q not in flagged}
    assert len(flagged) < len(ours)
    for line in read(tmp_path / "answers.jsonl"):  # flagged: exactly the questions whose steps miss new_tokens by > 1
        choice = line["choices"][0]
        gap = sum(choice["new_tokens"]) - sum(choice["accept_lengths"])
        assert (str(line["question_id"]) in flagged) == (gap not in (0, 1))
    assert speed_py_numbers(specbench_answers(back))[1] == pytest.approx(back.rounds["committed"].mean(), rel=1e-12)


def test_no_law_without_entropies(tmp_path):
    from entropy_law.law.fit import fit_law

    import_specbench(FIXTURE, tmp_path / "run")
    with pytest.raises(ValueError, match="hold no target entropies.*Spec-Bench answer files hold no token ids"):
        fit_law(load_traces(tmp_path / "run"))


def test_split_turns():
    assert split_turns([3, 4, 1, 4, 5, 2, 2], [12, 9]) == ("steps", [[3, 4, 1, 4], [5, 2, 2]])
    assert split_turns([2, 5, 1, 3, 2], [14]) == ("prefill", [[2, 5, 1, 3, 2]])
    reason, steps = split_turns([2, 5], [3])
    assert steps is None and "do not split" in reason


def _write(tmp_path, edit):
    lines = read(FIXTURE)
    edit(lines)
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("edit, field", [
    (lambda ls: ls[1]["choices"][0].pop("accept_lengths"), "choices[0].accept_lengths"),
    (lambda ls: ls[1]["choices"][0].update(accept_lengths=[2, 0, 3]), "choices[0].accept_lengths"),
    (lambda ls: ls[1]["choices"][0].update(wall_time=[-1.0]), "choices[0].wall_time"),
    (lambda ls: ls[1]["choices"][0].update(new_tokens=[14, 3]), "choices[0].new_tokens"),
    (lambda ls: ls[1].update(question_id=81), "question_id"),
])
def test_bad_lines_name_file_line_and_field_or_are_skipped(tmp_path, edit, field):
    path = _write(tmp_path, edit)
    with pytest.raises(MalformedResponseError, match=rf"answers.jsonl:2: {field.replace('[', '.').replace(']', '.')}"):
        import_specbench(path, tmp_path / "run")
    summary = import_specbench(path, tmp_path / "skipped", skip_bad=True)
    meta = next(iter(load_traces(tmp_path / "skipped").metadata.values()))["engine_import"]
    assert summary.questions == 2 and meta["skipped_bad"] == 1 and meta["skipped_lines"][0]["line"] == 2


def test_a_question_whose_steps_do_not_split_is_flagged_and_keeps_its_request_rows(tmp_path):
    path = _write(tmp_path, lambda ls: ls[2]["choices"][0].update(accept_lengths=[5, 5]))
    summary = import_specbench(path, tmp_path / "run")
    assert [f["question_id"] for f in summary.flagged] == [83]
    traces = load_traces(tmp_path / "run")
    assert "83" in set(traces.requests["request_id"].astype(str))
    assert "83" not in set(traces.rounds["request_id"].astype(str))
