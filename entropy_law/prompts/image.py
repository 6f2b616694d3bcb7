"""Image task files: prompts that pair one image with a question (or several user turns).

One JSON object per line with ``question_id``, ``category``, ``image`` (relative to the file's folder) and
``turns`` or ``question``; optional ``kind`` (``"grounded"`` or ``"descriptive"``) and ``reference`` (a short
answer). The shipped set is ``"vlm_tasks"``. Never imports torch or Pillow (``decoding.vlm`` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from entropy_law.prompts.paths import read_json_lines
from entropy_law.prompts.text import Task, check_task_fields, task_file, wanted_categories

VLM_TASKS = "vlm_tasks"
BUILTIN_IMAGE_TASKS = {VLM_TASKS: ("vlm_tasks", "tasks.jsonl")}
KINDS = ("grounded", "descriptive")


@dataclass(frozen=True)
class ImageTask(Task):
    """One image prompt: a ``Task`` (same ``prompt`` and ``request_id``) with its image."""

    image: Path  # absolute path of the image file
    kind: str = ""  # "grounded", "descriptive" or "" (not stated)
    reference: str = ""  # a short expected answer for grounded questions ("" if none)

    def messages(self) -> list[dict]:
        """The first turn as chat messages in the multimodal content format (image first, then text)."""
        return [{"role": "user", "content": [{"type": "image", "path": str(self.image)},
                                             {"type": "text", "text": self.prompt}]}]


def image_task_file(source: str | Path) -> tuple[str, Path]:
    """(dataset name, JSONL path) for ``"vlm_tasks"`` or a path to an image task file."""
    return task_file(source, BUILTIN_IMAGE_TASKS, "image task file",
                     "question_id, category, image and turns or question")


def is_image_task_file(source: str | Path) -> bool:
    """True for ``"vlm_tasks"`` and for a JSONL file whose first record has an ``image`` field."""
    if str(source) in BUILTIN_IMAGE_TASKS:
        return True
    path = Path(str(source)).expanduser()
    if not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as handle:  # a sniff: the loader names a bad byte's line
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(record, dict) and "image" in record
    return False


def _parse(record: dict, where: str, folder: Path) -> tuple[str, str, tuple[str, ...], Path, str, str]:
    missing = [key for key in ("question_id", "category", "image") if key not in record]
    if "turns" not in record and "question" not in record:
        missing.append("turns (or question)")
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)} (every line needs question_id, "
                         "category, image, and turns or question)")
    check_task_fields(record, where)
    if "turns" in record:
        turns = record["turns"]
    else:
        if not isinstance(record["question"], str):
            raise ValueError(f"{where}: 'question' must be a string")
        turns = [record["question"]]
    if not turns or not turns[0].strip():
        raise ValueError(f"{where}: the first turn is empty")
    kind = str(record.get("kind", ""))
    if kind and kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)} (or absent), got {kind!r}")
    image = Path(str(record["image"])).expanduser()
    image = image if image.is_absolute() else folder / image
    if not image.is_file():
        raise FileNotFoundError(f"{where}: image not found: {image} (image paths are relative to the task file's "
                                "folder; the shipped images are made by data/vlm_tasks/make_images.py)")
    return str(record["question_id"]), str(record["category"]), tuple(turns), image.resolve(), kind, \
        str(record.get("reference", ""))


def load_image_tasks(source: str | Path = VLM_TASKS, *, categories: Iterable[str] | None = None,
                     kinds: Iterable[str] | None = None, limit: int | None = None) -> list[ImageTask]:
    """Image prompts of a task file, in file order: only ``categories`` and ``kinds`` (None: all), at most ``limit``
    per category. Duplicate question ids, missing fields and missing images are errors naming the line."""
    dataset, path = image_task_file(source)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 prompts per category (or None for all), got {limit}")
    wanted_kinds = None if kinds is None else set(kinds)
    if wanted_kinds is not None and not wanted_kinds <= set(KINDS):
        raise ValueError(f"unknown kind(s) {sorted(wanted_kinds - set(KINDS))}; known: {', '.join(KINDS)}")
    parsed = []
    seen: dict[str, int] = {}
    for line_no, record in read_json_lines(path):
        where = f"{path}:{line_no}"
        fields = _parse(record, where, path.parent)
        if fields[0] in seen:
            raise ValueError(f"{where}: duplicate question_id {fields[0]!r} (first on line {seen[fields[0]]})")
        seen[fields[0]] = line_no
        parsed.append(fields)
    wanted = wanted_categories(categories, list(dict.fromkeys(fields[1] for fields in parsed)), dataset)
    tasks: list[ImageTask] = []
    per_category: dict[str, int] = {}
    for question_id, category, turns, image, kind, reference in parsed:
        if wanted is not None and category not in wanted:
            continue
        if wanted_kinds is not None and kind not in wanted_kinds:
            continue
        if limit is not None and per_category.get(category, 0) >= limit:
            continue
        tasks.append(ImageTask(dataset=dataset, question_id=question_id, category=category, turns=turns,
                               image=image, kind=kind, reference=reference))
        per_category[category] = per_category.get(category, 0) + 1
    return tasks
