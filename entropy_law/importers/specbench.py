"""Spec-Bench's answer files, both ways: ``entropy-law import specbench`` and ``export --format specbench``.

Import: a turn is a request (``<id>#<turn>`` after the first), its ``accept_lengths`` steps rounds in order
(``committed`` = accept length), split by ``new_tokens`` (or one fewer per turn where the prefill made the first
token); a question whose steps fit neither is flagged and keeps its request rows only. What the file lacks is
filled and said so in ``run.json``; the lines are kept verbatim in ``specbench_answers.jsonl``. Export: one line
per question, ``wall_time`` = prefill + decode time, ``accept_lengths`` = every round's ``committed``. No torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from entropy_law.importers.records import FieldError
from entropy_law.importers.writer import (METADATA_KEY, SkippedLine, append_row, nothing_kept, read_jsonl,
                                          with_null_columns, write_jsonl_atomic)
from entropy_law.traces.layout import file_sha256
from entropy_law.traces.recorder import TraceRecorder

ENGINE = "specbench"
DATASET = "spec_bench"
RECORD_FILE = "specbench_answers.jsonl"
TARGET_STATS = ("missing: Spec-Bench answer files hold no token ids, prompts or log-probabilities, so no target "
                "entropy (the law needs one per position): record the method with entropy-law record, or import "
                "the serving engine's responses with top-k log-probabilities (--vocab-size)")


@dataclass
class Answer:
    """One question of an answer file, checked; ``steps_per_turn`` is None where its steps do not split."""

    line: int
    raw: dict
    question_id: object
    category: str
    turns: list
    new_tokens: list[int]
    wall_time: list[float]
    accept_lengths: list[int]
    split: str = ""  # "steps" | "prefill" | the reason it does not split
    steps_per_turn: list[list[int]] | None = None


@dataclass
class SpecBenchImportSummary:
    run_dir: Path
    run_id: str
    lines: int
    questions: int
    requests: int
    flagged: list[dict]
    skipped: list[SkippedLine] = field(default_factory=list)

    def lines_to_print(self) -> list[str]:
        out = [f"imported {self.questions} of {self.lines} Spec-Bench answer line(s) ({self.requests} turn(s)) into "
               f"{self.run_dir} (run {self.run_id})",
               f"  questions whose steps do not split by turn: {len(self.flagged)}",
               f"  malformed lines skipped:                    {len(self.skipped)}"]
        out += [f"  flagged line {f['line']} (question {f['question_id']}): {f['reason']}" for f in self.flagged[:10]]
        out.append("target statistics: none (a Spec-Bench answer file holds no entropy; no law can be fitted)")
        return out


def _int_list(value, name, minimum):
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
        raise FieldError(name, f"expected a list of integers >= {minimum}, got {value!r}")
    return list(value)


def parse_answer(obj, line: int) -> Answer:
    if not isinstance(obj, dict):
        raise FieldError("(line)", f"expected a JSON object (one Spec-Bench answer), got {type(obj).__name__}")
    for name in ("question_id", "category", "choices"):
        if obj.get(name) is None:
            raise FieldError(name, "missing: not a Spec-Bench answer line (evaluation/eval.py writes question_id, "
                                   "category, choices)")
    if not isinstance(obj["category"], str) or not obj["category"]:
        raise FieldError("category", f"expected a non-empty string, got {obj['category']!r}")
    choices = obj["choices"]
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise FieldError("choices", f"expected one choice (num_choices = 1; speed.py reads choices[0] only), got "
                                    f"{len(choices) if isinstance(choices, list) else type(choices).__name__}")
    choice = choices[0]
    for name in ("turns", "new_tokens", "wall_time", "accept_lengths"):
        if not isinstance(choice.get(name), list):
            raise FieldError(f"choices[0].{name}", "missing or not a list")
    turns = choice["turns"]
    new_tokens = _int_list(choice["new_tokens"], "choices[0].new_tokens", 0)
    wall = choice["wall_time"]
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) or not (w >= 0) or w == float("inf") for w in wall):
        raise FieldError("choices[0].wall_time", f"expected seconds >= 0, got {wall!r}")
    accept = _int_list(choice["accept_lengths"], "choices[0].accept_lengths", 1)
    if not (len(turns) == len(new_tokens) == len(wall)) or not turns:
        raise FieldError("choices[0].new_tokens", f"{len(turns)} turns, {len(new_tokens)} new_tokens and {len(wall)} "
                                                  "wall_time values: one of each per turn")
    answer = Answer(line=line, raw=obj, question_id=obj["question_id"], category=obj["category"], turns=turns,
                    new_tokens=new_tokens, wall_time=[float(w) for w in wall], accept_lengths=accept)
    answer.split, answer.steps_per_turn = split_turns(accept, new_tokens)
    return answer


def split_turns(accept: list[int], new_tokens: list[int]) -> tuple[str, list[list[int]] | None]:
    """The steps of each turn: each turn's steps commit its ``new_tokens`` (``"steps"``) or, for every turn, one
    fewer (``"prefill"``: a first token outside the steps); else (reason, None)."""
    for name, offset in (("steps", 0), ("prefill", 1)):
        out, i, ok = [], 0, True
        for n in new_tokens:
            target, total, start = n - offset, 0, i
            while i < len(accept) and total < target:
                total += accept[i]
                i += 1
            if total != target:
                ok = False
                break
            out.append(accept[start:i])
        if ok and i == len(accept):
            return name, out
    return (f"the {len(accept)} accept lengths (sum {sum(accept)}) do not split into the turns' new_tokens "
            f"{new_tokens} (nor one fewer per turn, a prefill token outside the steps)"), None


def read_answers(path, *, skip_bad: bool = False) -> tuple[list[Answer], list[SkippedLine], int]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a Spec-Bench answer file, one JSON line per question)")

    def repeated(answer, first_line):
        return FieldError("question_id", f"{answer.question_id!r} repeats line {first_line} (Spec-Bench's "
                                         "reorg_answer_file keeps one answer per question)")

    answers, skipped, lines = read_jsonl(path, parse_answer, lambda answer: str(answer.question_id), repeated,
                                         skip_bad=skip_bad)
    if not answers:
        raise ValueError(f"{path}: no answer to import" + (
            f": all {lines} line(s) are bad and were skipped (first: {nothing_kept(skipped)})" if skipped else ""))
    return answers, skipped, lines


def request_id(question_id, turn: int) -> str:
    return str(question_id) if turn == 0 else f"{question_id}#{turn}"


def _tables(answers: list[Answer], block_size: int) -> dict:
    tok = {k: [] for k in ("request_id", "category", "round_index", "position", "depth", "role")}
    rnd = {k: [] for k in ("request_id", "round_index", "start_position", "context_len", "block_size", "tree_nodes",
                           "tree_depth", "accepted", "committed")}
    req = {}
    for a in answers:
        for turn, n in enumerate(a.new_tokens):
            rid = request_id(a.question_id, turn)
            steps = a.steps_per_turn[turn] if a.steps_per_turn is not None else []
            position = 1 if (a.split == "prefill" and steps) else 0
            for index, committed in enumerate(steps):
                append_row(rnd, request_id=rid, round_index=index, start_position=position, context_len=position,
                           block_size=block_size, tree_nodes=block_size - 1, tree_depth=block_size - 1,
                           accepted=committed - 1, committed=committed)
                for depth in range(1, committed + 1):
                    role = ("accepted" if depth < committed else "bonus" if committed - 1 == block_size - 1
                            else "correction")
                    append_row(tok, request_id=rid, category=a.category, round_index=index,
                               position=position + depth - 1, depth=depth, role=role)
                position += committed
            append_row(req, request_id=rid, category=a.category, dataset=DATASET, question_id=str(a.question_id),
                       prompt_tokens=0, image_tokens=0, new_tokens=n, rounds=len(steps), stop_reason="eos",
                       prefill_ms=0.0, decode_ms=a.wall_time[turn] * 1000.0)
    tokens, rounds = with_null_columns(tok, "tokens", len(tok["request_id"])), rnd
    zeros = np.zeros(len(rounds["request_id"]), np.float32)
    rounds.update({"draft_ms": zeros, "verify_ms": zeros, "overhead_ms": zeros})  # log_columns casts to the schema
    return {"tokens": tokens, "rounds": rounds, "requests": req}


def import_specbench(path, out, *, skip_bad: bool = False, model_id: str | None = None,
                     drafter_id: str | None = None, overwrite: bool = False) -> SpecBenchImportSummary:
    """Write the Spec-Bench answer file ``path`` as a trace run in ``out`` (module docstring)."""
    path = Path(path)
    answers, skipped, n_lines = read_answers(path, skip_bad=skip_bad)
    block_size = max((L for a in answers if a.steps_per_turn is not None for L in a.accept_lengths), default=1)
    flagged = [{"question_id": a.question_id, "line": a.line, "reason": a.split}
               for a in answers if a.steps_per_turn is None]
    models = {a.raw.get("model_id") for a in answers if isinstance(a.raw.get("model_id"), str)}
    meta = {
        "model_id": model_id if model_id is not None else (next(iter(models)) if len(models) == 1 else None),
        "drafter_id": drafter_id if drafter_id is not None else f"{ENGINE}:{path.stem}",
        "tree_policy": "unknown",
        METADATA_KEY: {
            "engine": ENGINE, "source": str(path), "source_sha256": file_sha256(path), "lines_read": n_lines,
            "imported": len(answers), "skipped_bad": len(skipped), "skipped_lines": [vars(s) for s in skipped],
            "flagged": flagged, "record_file": RECORD_FILE, "target_stats": TARGET_STATS,
            "split": {str(a.question_id): a.split for a in answers if a.steps_per_turn is not None},
            "filled": {
                "block_size": f"{block_size}: the file's longest accept length (a lower bound on the method's block)",
                "tree_depth": "block_size - 1 (not logged: an upper bound on a step's drafted depth)",
                "role": ("depths 1..accept_length - 1 'accepted'; the last token 'bonus' when the step committed a "
                         "whole block, else 'correction'"),
                "prompt_tokens": "0 (not logged)", "stop_reason": "eos (not logged)",
                "decode_ms": "wall_time * 1000 (the turn's time as Spec-Bench measured it); prefill_ms 0",
            },
        },
    }
    with TraceRecorder(out, overwrite=overwrite, **meta) as recorder:
        recorder.log_columns(**_tables(answers, block_size))
        run_id = recorder.run_id
        write_jsonl_atomic(Path(out) / RECORD_FILE, (a.raw for a in answers))
    return SpecBenchImportSummary(run_dir=Path(out), run_id=run_id, lines=n_lines, questions=len(answers),
                                  requests=sum(len(a.new_tokens) for a in answers), flagged=flagged, skipped=skipped)


def specbench_answers(traces) -> list[dict]:
    """The answer lines of ``traces`` (one method's runs); an imported answer file gets its own text and ids back."""
    requests, rounds = traces.requests, traces.rounds
    if requests.empty:
        raise ValueError("these traces hold no request: nothing to export")
    originals = {}
    for run_id, meta in traces.metadata.items():
        path = Path(traces.runs.set_index("run_id").loc[run_id, "path"]) / RECORD_FILE
        if path.is_file():
            for text in path.read_text(encoding="utf-8").splitlines():
                raw = json.loads(text)
                originals[(run_id, str(raw["question_id"]))] = raw
    committed = {key: group["committed"].astype(int).tolist()
                 for key, group in rounds.sort_values(["run_id", "request_id", "round_index"])
                 .groupby(["run_id", "request_id"], sort=False, observed=True)}
    lines, order = {}, []
    for row in requests.itertuples(index=False):
        run_id, rid = str(row.run_id), str(row.request_id)
        question = str(row.question_id) or rid
        key = (run_id, question)
        if key not in lines:
            raw = originals.get(key, {})
            qid = raw.get("question_id", int(question) if question.isdigit() else question)
            lines[key] = {"question_id": qid, "category": str(row.category),
                          "answer_id": raw.get("answer_id", f"{run_id}:{question}"),
                          "model_id": raw.get("model_id", traces.metadata[run_id].get("model_id")),
                          "choices": [{"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [],
                                       "wall_time": [], "accept_lengths": []}],
                          "tstamp": raw.get("tstamp")}
            order.append(key)
        choice = lines[key]["choices"][0]
        turn = len(choice["turns"])
        raw_choice = originals.get(key, {}).get("choices", [{}])[0]
        raw_turns, steps = raw_choice.get("turns", []), committed.get((run_id, rid), [])
        choice["turns"].append(raw_turns[turn] if turn < len(raw_turns) else "")
        raw_steps = raw_choice.get("decoding_steps", [])
        choice.setdefault("decoding_steps", []).append(raw_steps[turn] if turn < len(raw_steps) else len(steps))
        choice["new_tokens"].append(int(row.new_tokens))
        wall = (float(row.prefill_ms) + float(row.decode_ms)) / 1000.0
        raw_wall = raw_choice.get("wall_time", [])
        if turn < len(raw_wall) and np.float32(raw_wall[turn] * 1000.0) == np.float32(row.decode_ms) \
                and float(row.prefill_ms) == 0:
            wall = raw_wall[turn]  # the file's own value, which the float32 column holds to its precision
        choice["wall_time"].append(wall)
        choice["accept_lengths"].extend(steps)
    return [lines[k] for k in order]


def export_specbench(traces, out) -> int:
    """Write ``specbench_answers(traces)`` to ``out`` (a path or an open text file); returns the lines written."""
    answers = specbench_answers(traces)
    text = "".join(json.dumps(a) + "\n" for a in answers)
    if hasattr(out, "write"):
        out.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")
    return len(answers)


__all__ = ["ENGINE", "RECORD_FILE", "Answer", "SpecBenchImportSummary", "export_specbench", "import_specbench",
           "parse_answer", "read_answers", "specbench_answers", "split_turns"]
