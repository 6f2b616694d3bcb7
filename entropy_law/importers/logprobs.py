"""Top-k log-probabilities per output position, read from an engine response and checked.

Known here: the engine-neutral shape of what an engine returns for each output token when asked for its top
log-probabilities (one list of log-probabilities per output position, best first or in any order, the
engine's own field named for messages), how an entry's value is read (a log-probability, or a probability that
llama.cpp's ``post_sampling_probs`` and older servers give), and the checks that need no vocabulary size
(``traces.topk.topk_problems``: NaN, above 0, probabilities summing above 1 + 1e-3, an empty list), each
raised as a ``FieldError`` naming the position, so the import reports ``file:line`` or, with ``--skip-bad``,
skips the line and counts it. The engines' field names live in ``vllm``, ``sglang`` and ``llamacpp``; the
entropy bounds in ``traces.topk``. Not known here: files or trace tables. No torch.
"""

from __future__ import annotations

import math

from entropy_law.importers.records import FieldError
from entropy_law.traces.topk import pad_topk, topk_problems


def entry_value(value, where: str, *, probability: bool = False) -> float:
    """One entry's log-probability (``probability``: the entry is a probability and its log is taken).
    NaN passes through (``checked_rows`` names it); a non-number is refused here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(where, f"expected a number, got {value!r}")
    value = float(value)
    if not probability:
        return value
    if value != value:
        return value
    if value < 0:
        raise FieldError(where, f"a probability below 0 ({value})")
    return math.log(value) if value > 0 else -math.inf


def fast_values(entries, key: str) -> list[float] | None:
    """``[e[key] for e in entries]`` when every entry is an object with a number there (the common case, read
    without per-entry calls); None otherwise, and the caller reads the entries one by one for its message."""
    try:
        values = [e[key] for e in entries]
    except (KeyError, TypeError, IndexError):
        return None
    return values if all(type(v) is float or type(v) is int for v in values) else None


def checked_rows(rows: list[list[float]], field: str, n_output: int) -> list[list[float]]:
    """``rows`` (one list of log-probabilities per output position) after the checks that need no vocabulary
    size; one row per output token."""
    if len(rows) != n_output:
        raise FieldError(field, f"has {len(rows)} positions but the output has {n_output} tokens; the top-k lists "
                                "must cover every output token (one per token, in order)")
    if rows:
        problems = topk_problems(pad_topk(rows), None)
        if problems:
            row, problem = problems[0]
            raise FieldError(f"{field}[{row}]", f"{problem}: not log-probabilities of one distribution (fix the "
                                                "log, or drop these lines)")
    return rows


def as_list(value, where: str) -> list:
    if not isinstance(value, list):
        raise FieldError(where, f"expected a list, got {type(value).__name__}")
    return value


__all__ = ["as_list", "checked_rows", "entry_value", "fast_values"]
