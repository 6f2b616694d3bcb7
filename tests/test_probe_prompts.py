"""The probe set (data/probe/): six categories that no trace set, law or policy here holds (its reason to exist,
README "Six more categories"), unique ids, no prompt that repeats a Spec-Bench or open-ended one, CC0."""

import re
from collections import Counter

from entropy_law.prompts.paths import data_dir
from entropy_law.prompts.text import load_tasks
from tests.test_open_ended_prompts import _key

FOLDER = data_dir() / "probe"
CATEGORIES = {"editing", "extraction", "sql", "classification", "howto", "dialogue"}


def test_size_categories_and_ids():
    tasks = load_tasks(FOLDER / "probe.jsonl")
    assert len(tasks) == 24 and {t.dataset for t in tasks} == {"probe"}
    assert tasks[0].request_id == f"probe:{tasks[0].question_id}"
    counts = Counter(t.category for t in tasks)
    assert set(counts) == CATEGORIES and set(counts.values()) == {4}
    ids = [t.question_id for t in tasks]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(rf"probe-{t.category}-\d\d", t.question_id) for t in tasks)
    assert len({_key(t.prompt) for t in tasks}) == len(tasks)


def test_categories_and_prompts_are_new():
    """No category of Spec-Bench or the open-ended set (the traces the laws and costs were fitted on, and the set the
    policy was checked on), and no prompt that nearly repeats one of theirs."""
    others = load_tasks("spec_bench") + load_tasks("open_ended")
    assert not CATEGORIES & {t.category for t in others}
    keys = {_key(t.prompt) for t in others}
    assert not [t.question_id for t in load_tasks(FOLDER / "probe.jsonl") if _key(t.prompt) in keys]


def test_folder_says_cc0():
    assert "CC0-1.0" in (FOLDER / "LICENSE").read_text(encoding="utf-8")
    assert "CC0-1.0" in (FOLDER / "README.md").read_text(encoding="utf-8")
