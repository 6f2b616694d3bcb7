"""Evaluation prompts: Spec-Bench and our open-ended set (shipped under ``data/``, names ``"spec_bench"`` and
``"open_ended"``) or any JSONL file of the same shape: one object per line with ``question_id``, ``category``
and ``turns`` (strings; only the first is used, decoding is single-turn). Request ids are
``"<dataset>:<question_id>"``, stable so that runs resume. No torch.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from entropy_law.prompts.paths import data_dir, read_json_lines

logger = logging.getLogger(__name__)

SPEC_BENCH = "spec_bench"
OPEN_ENDED = "open_ended"  # our own CC0 prompts outside Spec-Bench's categories (data/open_ended/)
BUILTIN_TASKS = {  # name -> path inside data_dir()
    SPEC_BENCH: ("spec_bench", "question.jsonl"),
    OPEN_ENDED: ("open_ended", "open_ended.jsonl"),
}


@dataclass(frozen=True)
class Task:
    dataset: str
    question_id: str
    category: str
    turns: tuple[str, ...]

    @property
    def prompt(self) -> str:  # the first turn, given to the model
        return self.turns[0]

    @property
    def request_id(self) -> str:  # stable in traces
        return f"{self.dataset}:{self.question_id}"

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


def task_file(source: str | Path, builtin: dict = BUILTIN_TASKS, what: str = "task file",
              fields: str = "question_id, category and turns") -> tuple[str, Path]:
    """(dataset name, JSONL path) for a name of ``builtin`` or a path to a JSONL file of ``what``."""
    text = str(source)
    if text in builtin:
        folder, name = builtin[text]
        return text, data_dir() / folder / name
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (give {' or '.join(repr(b) for b in sorted(builtin))} "
                                f"or the path of a JSONL file with {fields} on every line)")
    return path.stem, path


def _read_records(path: Path) -> Iterable[tuple[int, dict]]:
    for line_no, record in read_json_lines(path):
        missing = [key for key in ("question_id", "category", "turns") if key not in record]
        if missing:
            raise ValueError(f"{path}:{line_no}: missing field(s) {', '.join(missing)} "
                             "(every line needs question_id, category and turns)")
        check_task_fields(record, f"{path}:{line_no}")
        yield line_no, record


def check_task_fields(record: dict, where: str) -> None:
    """A task line's ``category`` is a non-empty name and its ``turns`` (where given) a list of strings."""
    category, turns = record["category"], record.get("turns", [])
    if not isinstance(category, (str, int)) or isinstance(category, bool) or not str(category).strip():
        raise ValueError(f"{where}: 'category' is {json.dumps(category)}; give every line a category name (a "
                         "non-empty string)")
    if isinstance(turns, str) or not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: 'turns' must be a list of strings")


def known_categories(source: str | Path = SPEC_BENCH) -> list[str]:
    """Categories present in a task file, in order of first appearance."""
    _, path = task_file(source)
    seen: dict[str, None] = {}
    for _, record in _read_records(path):
        seen.setdefault(str(record["category"]), None)
    return list(seen)


def wanted_categories(categories: Iterable[str] | None, present: list[str], dataset: str) -> list[str] | None:
    """``categories`` as a list (None: all), each one present in the file (else ValueError naming the known)."""
    if categories is None:
        return None
    wanted = list(dict.fromkeys(str(c) for c in categories))
    unknown = [c for c in wanted if c not in present]
    if unknown:
        raise ValueError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} "
                         f"in {dataset}; known: {', '.join(present)}")
    return wanted


def load_tasks(source: str | Path = SPEC_BENCH, *, categories: Iterable[str] | None = None,
               limit: int | None = None) -> list[Task]:
    """Prompts of a task file, in file order: only ``categories`` (None: all; an unknown one is an error), at most
    ``limit`` per category. A prompt with an empty first turn is skipped with a warning; duplicate ids: an error."""
    dataset, path = task_file(source)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 prompts per category (or None for all), got {limit}")
    records = list(_read_records(path))
    wanted = wanted_categories(categories, list(dict.fromkeys(str(r["category"]) for _, r in records)), dataset)
    tasks: list[Task] = []
    per_category: dict[str, int] = {}
    seen_ids: dict[str, int] = {}
    for line_no, record in records:
        question_id, category = str(record["question_id"]), str(record["category"])
        if question_id in seen_ids:
            raise ValueError(f"{path}:{line_no}: duplicate question_id {question_id!r} "
                             f"(first on line {seen_ids[question_id]})")
        seen_ids[question_id] = line_no
        if wanted is not None and category not in wanted:
            continue
        if limit is not None and per_category.get(category, 0) >= limit:
            continue
        turns = tuple(record["turns"])
        if not turns or not turns[0].strip():
            logger.warning("skipping %s:%s (category %s, line %d): empty prompt", dataset, question_id,
                           category, line_no)
            continue
        tasks.append(Task(dataset=dataset, question_id=question_id, category=category, turns=turns))
        per_category[category] = per_category.get(category, 0) + 1
    return tasks


def sample_per_category(tasks: Sequence[Task], per_category: int, *, seed: int = 0) -> list[Task]:
    """``per_category`` prompts of each category drawn at random (seeded) from the whole set, kept in file order;
    a category with fewer prompts keeps all of them."""
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    rng = random.Random(seed)
    by_category: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        by_category.setdefault(task.category, []).append(index)
    chosen = {i for indices in by_category.values() for i in rng.sample(indices, min(per_category, len(indices)))}
    return [task for index, task in enumerate(tasks) if index in chosen]
