"""Our own open-ended prompt set (data/open_ended/): loads by builtin name and by path, covers six categories
outside Spec-Bench's five, has unique ids and no prompt that repeats (or nearly repeats) a Spec-Bench one."""

import json
import re
from collections import Counter

from entropy_law.prompts.paths import data_dir
from entropy_law.prompts.text import BUILTIN_TASKS, OPEN_ENDED, known_categories, load_tasks

CATEGORIES = ["writing", "roleplay", "opinion", "brainstorming", "coding", "explanation"]
PATH = data_dir() / "open_ended" / "open_ended.jsonl"


def _key(text: str) -> str:
    """First 60 characters, case and runs of whitespace ignored: 'nearly the same prompt'."""
    return re.sub(r"\s+", " ", text.strip().lower())[:60]


def test_loads_by_builtin_name_and_by_path_alike():
    assert OPEN_ENDED == "open_ended" and OPEN_ENDED in BUILTIN_TASKS
    by_name = load_tasks("open_ended")
    by_path = load_tasks(PATH)
    assert by_name == by_path  # same dataset name too, so request ids agree however the set is given
    assert {t.dataset for t in by_name} == {"open_ended"}
    assert by_name[0].request_id == f"open_ended:{by_name[0].question_id}"


def test_size_categories_ids_and_prompts():
    raw = [json.loads(line) for line in PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    tasks = load_tasks("open_ended")
    assert len(tasks) == len(raw) >= 40  # nothing skipped as empty
    assert known_categories("open_ended") == CATEGORIES
    counts = Counter(t.category for t in tasks)
    assert set(counts) == set(CATEGORIES)
    assert min(counts.values()) >= 7, counts
    ids = [t.question_id for t in tasks]
    assert len(set(ids)) == len(ids)
    for task in tasks:
        assert re.fullmatch(rf"oe-{task.category}-\d\d", task.question_id), task.question_id
        assert task.prompt.strip() and task.prompt == task.prompt.strip()
    assert len({_key(t.prompt) for t in tasks}) == len(tasks)  # no two of ours nearly alike either
    assert not set(counts) & set(known_categories("spec_bench"))


def test_limit_and_category_filter_work_on_it():
    tasks = load_tasks("open_ended", categories=["coding", "roleplay"], limit=2)
    assert [t.category for t in tasks] == ["roleplay", "roleplay", "coding", "coding"]


def test_no_prompt_repeats_a_spec_bench_prompt():
    spec = load_tasks("spec_bench")
    spec_texts = {t.prompt.strip() for t in spec}
    spec_keys = {_key(t.prompt) for t in spec}
    for task in load_tasks("open_ended"):
        assert task.prompt.strip() not in spec_texts, task.question_id
        assert _key(task.prompt) not in spec_keys, task.question_id


def test_folder_says_cc0():
    folder = data_dir() / "open_ended"
    assert "CC0-1.0" in (folder / "LICENSE").read_text(encoding="utf-8")
    assert "CC0-1.0" in (folder / "README.md").read_text(encoding="utf-8")
