"""Image task files: the shipped set, the format's errors, and regeneration (no model needed)."""

from __future__ import annotations

import json
import sys

import pytest

from entropy_law.prompts.paths import data_dir
from entropy_law.prompts.image import ImageTask, is_image_task_file, load_image_tasks


def test_shipped_tasks_cover_four_categories_with_grounded_and_descriptive_questions():
    tasks = load_image_tasks("vlm_tasks")
    raw = [json.loads(line) for line in (data_dir() / "vlm_tasks" / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == len(raw) == 102
    by_category: dict[str, set] = {}
    for task in tasks:
        by_category.setdefault(task.category, set()).add(task.image)
        assert task.image.is_file() and task.image.suffix == ".png"
        assert task.kind in ("grounded", "descriptive")
        assert (task.kind == "grounded") == bool(task.reference)
        assert task.request_id == f"vlm_tasks:{task.question_id}"
    assert {c: len(images) for c, images in by_category.items()} == {
        "document": 6, "table": 6, "chart": 6, "scene": 6}
    # every image has exactly one descriptive question
    descriptive = [t.image for t in tasks if t.kind == "descriptive"]
    assert len(descriptive) == len(set(descriptive)) == 24


def test_shipped_images_are_small_rgb_pictures():
    from PIL import Image

    images = sorted((data_dir() / "vlm_tasks" / "images").glob("*.png"))
    assert len(images) == 24
    for path in images:
        with Image.open(path) as image:
            assert image.size == (320, 240)
        assert path.stat().st_size < 20_000


def test_filters_and_limit():
    charts = load_image_tasks("vlm_tasks", categories=["chart"], kinds=["grounded"], limit=2)
    assert [t.category for t in charts] == ["chart", "chart"] and all(t.kind == "grounded" for t in charts)
    with pytest.raises(ValueError, match="unknown category poster.*known: document, table, chart, scene"):
        load_image_tasks("vlm_tasks", categories=["poster"])
    with pytest.raises(ValueError, match="unknown kind"):
        load_image_tasks("vlm_tasks", kinds=["funny"])


def _write(tmp_path, records, image=True):
    if image:
        from PIL import Image

        Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_user_file_with_question_field_and_relative_image(tmp_path):
    path = _write(tmp_path, [{"question_id": 1, "category": "x", "image": "a.png", "question": "What colour?"}])
    assert is_image_task_file(path) and is_image_task_file("vlm_tasks")
    (task,) = load_image_tasks(path)
    assert task == ImageTask(dataset="mine", question_id="1", category="x", turns=("What colour?",),
                             image=(tmp_path / "a.png").resolve())
    assert task.messages()[0]["content"][1] == {"type": "text", "text": "What colour?"}


def test_text_task_files_are_not_image_task_files(tmp_path):
    assert not is_image_task_file(data_dir() / "spec_bench" / "question.jsonl")
    assert not is_image_task_file(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("record, message", [
    ({"question_id": "1", "category": "x", "turns": ["q"]}, "missing field.*image"),
    ({"question_id": "1", "category": "x", "image": "a.png"}, "missing field.*turns \\(or question\\)"),
    ({"question_id": "1", "category": "x", "image": "a.png", "turns": "q"}, "'turns' must be a list"),
    ({"question_id": "1", "category": "x", "image": "a.png", "turns": ["  "]}, "first turn is empty"),
    ({"question_id": "1", "category": "x", "image": "a.png", "turns": ["q"], "kind": "odd"}, "kind must be"),
    ({"question_id": "1", "category": "x", "image": "b.png", "turns": ["q"]}, "image not found: .*b.png"),
])
def test_bad_records_name_the_line(tmp_path, record, message):
    path = _write(tmp_path, [record])
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_image_tasks(path)


def test_duplicate_ids_and_missing_file(tmp_path):
    rec = {"question_id": "1", "category": "x", "image": "a.png", "turns": ["q"]}
    with pytest.raises(ValueError, match="mine.jsonl:2: duplicate question_id '1'"):
        load_image_tasks(_write(tmp_path, [rec, rec]))
    with pytest.raises(FileNotFoundError, match="image task file not found"):
        load_image_tasks(tmp_path / "nope.jsonl")


def test_regeneration_reproduces_the_shipped_task_file(tmp_path, monkeypatch):
    folder = data_dir() / "vlm_tasks"
    monkeypatch.syspath_prepend(str(folder))
    import make_images

    records = make_images.make(tmp_path, seed=2026)
    assert (tmp_path / "tasks.jsonl").read_text() == (folder / "tasks.jsonl").read_text()
    assert len(records) == 102 and len(list((tmp_path / "images").glob("*.png"))) == 24
    sys.modules.pop("make_images", None)


def test_the_task_module_never_imports_torch():
    import subprocess

    code = ("import sys; from entropy_law.prompts.image import load_image_tasks; load_image_tasks('vlm_tasks'); "
            "assert 'torch' not in sys.modules and 'PIL' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(data_dir().parent))
