"""Top-k log-probabilities per output position, read from an engine response and checked.

One list of log-probabilities per output position (any order); an entry may be a probability (llama.cpp's
``post_sampling_probs``). The checks that need no vocabulary size (``traces.topk.topk_problems``) raise a
``FieldError`` naming the position. The engines' field names live in their modules. No torch.
"""

from __future__ import annotations

import math

from entropy_law.importers.records import FieldError
from entropy_law.traces.topk import pad_topk, topk_problems


def entry_value(value, where: str, *, probability: bool = False) -> float:
    """One entry's log-probability (``probability``: its log is taken); NaN passes through, a non-number is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(where, f"expected a number, got {value!r}")
    value = float(value)
    if not probability or value != value:  # NaN passes through
        return value
    if value < 0:
        raise FieldError(where, f"a probability below 0 ({value})")
    return math.log(value) if value > 0 else -math.inf


def fast_values(entries, key: str) -> list[float] | None:
    """``[e[key] for e in entries]`` when every entry holds a number there (the fast path), else None."""
    try:
        values = [e[key] for e in entries]
    except (KeyError, TypeError, IndexError):
        return None
    return values if all(type(v) is float or type(v) is int for v in values) else None


def checked_rows(rows, field: str, n_output: int):
    """``rows`` (a list per output token, or a ``[positions, k]`` array) after the checks that need no vocabulary."""
    if len(rows) != n_output:
        raise FieldError(field, f"has {len(rows)} positions but the output has {n_output} tokens; the top-k lists "
                                "must cover every output token (one per token, in order)")
    if len(rows):
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
