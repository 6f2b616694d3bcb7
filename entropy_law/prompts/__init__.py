"""Evaluation prompts (no torch): text tasks (``text``: Spec-Bench or any JSONL of the same shape), image
tasks (``image``) and where the shipped data live (``paths``)."""

from entropy_law.prompts.image import ImageTask, load_image_tasks
from entropy_law.prompts.text import Task, load_tasks, sample_per_category

__all__ = ["ImageTask", "Task", "load_image_tasks", "load_tasks", "sample_per_category"]
