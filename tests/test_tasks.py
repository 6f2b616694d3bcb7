"""Task loading: Spec-Bench shipped copy, JSONL of the same shape, filters, limits, clear errors."""

import json
import logging
import sys
from pathlib import Path

import pytest

from entropy_law.prompts.paths import data_dir
from entropy_law.prompts.text import known_categories, load_tasks


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_spec_bench_counts_match_the_file():
    raw = [json.loads(line) for line in (data_dir() / "spec_bench" / "question.jsonl").read_text().splitlines()]
    tasks = load_tasks("spec_bench")
    assert len(tasks) == len(raw) == 400
    assert [t.question_id for t in tasks] == [str(r["question_id"]) for r in raw]
    assert tasks[0].prompt == raw[0]["turns"][0]
    assert tasks[0].request_id == f"spec_bench:{raw[0]['question_id']}"
    assert tasks[0].messages() == [{"role": "user", "content": raw[0]["turns"][0]}]
    assert set(known_categories()) == {"translation", "summarization", "qa", "math_reasoning", "rag"}


def test_filter_and_limit_per_category():
    tasks = load_tasks("spec_bench", categories=["rag", "qa"], limit=3)
    assert [t.category for t in tasks].count("rag") == 3
    assert [t.category for t in tasks].count("qa") == 3
    assert len(tasks) == 6
    raw = [json.loads(line) for line in (data_dir() / "spec_bench" / "question.jsonl").read_text().splitlines()]
    first_rag = [str(r["question_id"]) for r in raw if r["category"] == "rag"][:3]
    assert [t.question_id for t in tasks if t.category == "rag"] == first_rag


def test_unknown_category_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown category poetry in spec_bench; known: translation, "
                                         r"summarization, qa, math_reasoning, rag"):
        load_tasks("spec_bench", categories=["qa", "poetry"])


def test_custom_jsonl_skips_empty_prompts_with_a_log(tmp_path, caplog):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"question_id": "a", "category": "x", "turns": ["hello"]},
        {"question_id": "b", "category": "x", "turns": ["   "]},
        {"question_id": "c", "category": "y", "turns": []},
        {"question_id": "d", "category": "y", "turns": ["second", "ignored turn"], "extra": 1},
    ])
    with caplog.at_level(logging.WARNING, logger="entropy_law.prompts.text"):
        tasks = load_tasks(path)
    assert [(t.dataset, t.question_id, t.prompt) for t in tasks] == [("mine", "a", "hello"), ("mine", "d", "second")]
    assert "mine:b" in caplog.text and "mine:c" in caplog.text and "empty prompt" in caplog.text


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file not found"):
        load_tasks(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_tasks(bad)
    write_jsonl(bad, [{"question_id": 1, "turns": ["a"]}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) category"):
        load_tasks(bad)
    write_jsonl(bad, [{"question_id": 1, "category": "x", "turns": "a"}])
    with pytest.raises(ValueError, match="must be a list of strings"):
        load_tasks(bad)
    write_jsonl(bad, [{"question_id": 1, "category": "x", "turns": ["a"]},
                      {"question_id": 1, "category": "y", "turns": ["b"]}])
    with pytest.raises(ValueError, match="duplicate question_id '1'"):
        load_tasks(bad)
    with pytest.raises(ValueError, match="limit"):
        load_tasks("spec_bench", limit=0)


def test_tasks_module_does_not_import_torch():
    import subprocess

    code = "import sys, entropy_law.prompts.text as t; t.load_tasks(); print('torch' in sys.modules)"
    repo_root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo_root)
    assert out.stdout.strip() == "False"
