"""One imported request, engine-neutral (``ImportedRequest``), the ``FieldError`` a parser raises for a bad field,
the typed field readers the parsers share, and the alignment rule for per-step data: the prefill commits the
first output token (round 0), then step ``i`` commits ``a_i + 1`` tokens, so ``1 + sum(a_i + 1)`` must equal the
output's length. A request that breaks it is flagged with the reason; its steps are never adjusted. Knows no
engine's field names. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from entropy_law.traces.schema import STOP_REASONS

DEFAULT_CATEGORY = "unspecified"


class FieldError(ValueError):
    """A field of one engine response is missing, of the wrong type, or contradicts another field."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field, self.problem = field_name, problem


def decoded_line(raw: bytes) -> str:
    """One line of an imported file as UTF-8 text; else ``FieldError("(line)", ...)`` naming the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FieldError("(line)", f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None


class MalformedResponseError(ValueError):
    """A line of an engine JSONL that cannot be imported; the message names ``file:line``, the field and what to do."""

    def __init__(self, path, line: int, field_name: str, problem: str):
        super().__init__(f"{path}:{line}: {field_name}: {problem}")
        self.path, self.line, self.field, self.problem = str(path), int(line), field_name, problem


# -- typed field readers -------------------------------------------------------------------------------
MISSING = object()


def lookup(obj: Any, dotted: str):
    """``obj["a"]["b"][0]`` for ``"a.b.0"``; ``MISSING`` if any step is absent (a null value is returned as None)."""
    node = obj
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def display(dotted: str) -> str:
    """A field path as a reader writes it: ``choices.0.token_ids`` -> ``choices[0].token_ids``."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", dotted)


def as_int(value, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                         and not value.is_integer()):
        raise FieldError(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise FieldError(name, f"must be >= {minimum}, got {value!r}")
    return int(value)


def as_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise FieldError(name, f"expected a number, got {value!r}")
    return float(value)


def as_int_list(value, name: str, *, minimum: int = 0) -> list[int]:
    if not isinstance(value, list):
        raise FieldError(name, f"expected a list of integers, got {type(value).__name__}")
    if all(type(item) is int for item in value) and min(value, default=minimum) >= minimum:
        return value
    return [as_int(item, f"{name}[{i}]", minimum=minimum) for i, item in enumerate(value)]


def as_histogram(value, name: str) -> list[int]:
    """A dense list of step counts (index ``j``: steps that accepted exactly ``j`` drafts) from a dense list
    or a sparse map ``{"j": count}`` (keys omitted where the count is 0)."""
    if isinstance(value, list):
        return as_int_list(value, name)
    if isinstance(value, dict):
        counts = {}
        for key, count in value.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise FieldError(name, f"sparse histogram keys must be accepted-draft counts (\"0\", \"1\", ...); "
                                       f"got key {key!r}")
            counts[int(key)] = as_int(count, f"{name}[{key!r}]")
        return [counts.get(j, 0) for j in range(max(counts) + 1 if counts else 0)]
    raise FieldError(name, f"expected a list or a map of step counts, got {type(value).__name__}")


def require(obj, dotted: str, hint: str = ""):
    value = lookup(obj, dotted)
    if value is MISSING or value is None:
        raise FieldError(display(dotted), "missing" + (f"; {hint}" if hint else ""))
    return value


def optional(obj, dotted: str):
    value = lookup(obj, dotted)
    return None if value is MISSING else value


# -- the engine-neutral request -------------------------------------------------------------------------
@dataclass
class Alignment:
    """Whether per-step counts account for the output: ``1 + sum(a_i + 1) == completion tokens``."""

    ok: bool
    from_steps: int  # 1 (the prefill token) + sum over listed steps of (accepted + 1)
    completion_tokens: int
    reason: str = ""


@dataclass
class ImportedRequest:
    """One engine response, engine-neutral; draft counts exclude the bonus token. ``steps_accepted`` /
    ``steps_drafted``: per verify step, in order (None: aggregates only). ``histogram``: step counts by accepted
    drafts, as reported or counted from the steps (``histogram_field`` says which). ``aggregates``: the engine's
    speculation fields verbatim. Timings are None where the engine gives none."""

    engine: str
    shape: str  # which documented response shape the line had (e.g. "vllm metrics.speculative_decoding")
    line: int
    request_id: str
    category: str
    dataset: str
    question_id: str
    prompt: Any  # prompt text or chat messages as given (None: only ids)
    prompt_token_ids: list[int] | None
    prompt_tokens: int
    output_token_ids: list[int] | None  # None: the engine logs only their number (``completion_tokens``)
    stop_reason: str
    finish_reason: Any
    model: str | None
    num_spec_tokens: int | None  # K: the most drafts one step may verify, where the engine says
    steps_accepted: list[int] | None = None
    steps_drafted: list[int] | None = None
    histogram: list[int] | None = None
    histogram_field: str | None = None
    aggregates: dict = field(default_factory=dict)
    prefill_ms: float | None = None
    decode_ms: float | None = None
    # the engine's top-k log-probabilities, one list per output token (None: none), and their field
    topk_logprobs: list[list[float]] | np.ndarray | None = None
    topk_field: str | None = None
    completion_tokens: int | None = None  # the output's length where its ids are not logged (AIPerf)

    def __post_init__(self):
        if self.output_token_ids is None and self.completion_tokens is None:
            raise FieldError("completion_tokens", "the output's token ids or at least their number is needed")
        if self.stop_reason not in STOP_REASONS:
            raise FieldError("finish_reason", f"maps to {self.stop_reason!r}, not a trace stop reason {STOP_REASONS}")
        if (self.steps_accepted is None) != (self.steps_drafted is None):
            raise FieldError("steps", "per-step accepted and drafted counts come together")
        if self.steps_accepted is not None:
            if len(self.steps_accepted) != len(self.steps_drafted):
                raise FieldError("steps", f"{len(self.steps_accepted)} accepted counts but "
                                          f"{len(self.steps_drafted)} drafted counts")
            for i, (a, k) in enumerate(zip(self.steps_accepted, self.steps_drafted)):
                if a > k:
                    raise FieldError("steps", f"step {i} accepted {a} drafts of {k} proposed")
                if self.num_spec_tokens is not None and k > self.num_spec_tokens:
                    raise FieldError("steps", f"step {i} proposed {k} drafts, more than num_spec_tokens = "
                                              f"{self.num_spec_tokens}")
            counted = np.bincount(np.asarray(self.steps_accepted, dtype=np.int64)).tolist()  # by accepted drafts
            if self.histogram is None:
                self.histogram, self.histogram_field = counted, "counted from the per-step list"
            elif np.trim_zeros(list(self.histogram), "b") != np.trim_zeros(counted, "b"):
                raise FieldError(self.histogram_field or "histogram",
                                 f"{self.histogram} disagrees with the per-step accepted counts {counted}")

    @property
    def per_step(self) -> bool:
        return self.steps_accepted is not None

    @property
    def new_tokens(self) -> int:
        return len(self.output_token_ids) if self.output_token_ids is not None else self.completion_tokens

    def alignment(self) -> Alignment | None:
        """The check of per-step data against the output (None for aggregate-only requests)."""
        if not self.per_step:
            return None
        n = self.new_tokens
        from_steps = 1 + sum(a + 1 for a in self.steps_accepted)
        if from_steps == n:
            return Alignment(True, from_steps, n)
        if n == 0:
            reason = "the output is empty, yet the prefill commits one token"
        elif from_steps < n:
            reason = (f"the prefill and the {len(self.steps_accepted)} listed steps account for {from_steps} of "
                      f"{n} output tokens; {n - from_steps} come from steps the engine did not list (vLLM omits "
                      "steps with no drafts), whose positions are unknown")
        else:
            reason = (f"the prefill and the {len(self.steps_accepted)} listed steps account for {from_steps} "
                      f"tokens but the output has {n}: a step was cut after verification (stop string, EOS or "
                      "max tokens), or the engine counts the prefill as a step")
        return Alignment(False, from_steps, n, reason)

    def rounds(self, block_size: int | None = None) -> list[dict]:
        """The rounds of an aligned per-step request (ValueError otherwise): round 0 is the prefill, round ``i`` step
        ``i`` as a chain. ``block_size``: default ``num_spec_tokens + 1``, else the largest drafted count + 1."""
        columns = self.round_columns(block_size)
        return [dict(zip(columns, row)) for row in zip(*(c.tolist() for c in columns.values()))]

    def round_columns(self, block_size: int | None = None) -> dict[str, np.ndarray]:
        """``rounds`` as one array per key."""
        check = self.alignment()
        if check is None or not check.ok:
            raise ValueError(f"request {self.request_id!r} (line {self.line}) has no aligned per-step data: "
                             f"{check.reason if check else 'the engine reported aggregates only'}")
        if block_size is None:
            block_size = (self.num_spec_tokens + 1 if self.num_spec_tokens is not None
                          else max(self.steps_drafted, default=0) + 1)
        if block_size < max(self.steps_drafted, default=0) + 1:
            raise ValueError(f"block_size {block_size} is smaller than a step of request {self.request_id!r} "
                             f"({max(self.steps_drafted)} drafts + 1)")
        accepted, drafted = (np.asarray([0, *steps], dtype=np.int64) for steps in (self.steps_accepted,
                                                                                    self.steps_drafted))
        committed = accepted + 1
        start = np.cumsum(committed) - committed
        context = self.prompt_tokens + start - 1
        context[0] = max(self.prompt_tokens - 1, 0)
        return dict(round_index=np.arange(len(start)), start_position=start, context_len=context,
                    block_size=np.where(start > 0, block_size, 1), tree_nodes=drafted, tree_depth=drafted,
                    accepted=accepted, committed=committed, ends_at_leaf=accepted == drafted)

    def to_json(self) -> dict:
        # a shallow dict: the values are JSON already, and asdict's deep copy of the top-k lists dominated an import
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, payload: dict) -> "ImportedRequest":
        return cls(**payload)


def common_fields(obj: dict, *, default_request_id: str | None, default_category: str) -> dict:
    """The keys a user adds beside an engine's response on its line: ``request_id``, ``category``, ``dataset``,
    ``question_id``."""
    request_id = optional(obj, "request_id")
    request_id = default_request_id if request_id is None else request_id
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool) or request_id == "":
        raise FieldError("request_id", f"expected a non-empty string, got {request_id!r}")
    category = optional(obj, "category")
    category = default_category if category is None else category
    if not isinstance(category, str) or not category:
        raise FieldError("category", f"expected a non-empty string, got {category!r}")
    out = {"request_id": str(request_id), "category": category}
    for name in ("dataset", "question_id"):
        value = optional(obj, name)
        if value is not None and not isinstance(value, (str, int)):
            raise FieldError(name, f"expected a string, got {value!r}")
        out[name] = "" if value is None else str(value)
    return out


def prompt_fields(obj: dict, ids_fields: tuple[str, ...], count: tuple[str, Any] | None) -> dict:
    """``prompt`` (text or chat messages), ``prompt_token_ids`` (the first of ``ids_fields`` present) and
    ``prompt_tokens`` (checked against the engine's count ``(field, value)``); text or ids is required."""
    prompt = optional(obj, "prompt")
    if prompt is not None and not isinstance(prompt, (str, list)):
        raise FieldError("prompt", f"expected text or a list of chat messages, got {type(prompt).__name__}")
    ids, ids_name = None, None
    for name in ids_fields:
        value = optional(obj, name)
        if value is not None:
            ids, ids_name = as_int_list(value, display(name)), display(name)
            break
    engine_count = (as_int(count[1], count[0]) if count is not None and count[1] is not MISSING
                    and count[1] is not None else None)
    if ids is not None and engine_count is not None and len(ids) != engine_count:
        raise FieldError(ids_name, f"holds {len(ids)} ids but {count[0]} = {engine_count}")
    if prompt is None and ids is None:
        raise FieldError(" / ".join(("prompt",) + tuple(display(f) for f in ids_fields)),
                         "the line needs the prompt text or its token ids (the target entropies are computed "
                         "from them later); add a \"prompt\" key beside the response, or ask the engine for ids")
    n = len(ids) if ids is not None else engine_count
    if n is None:
        raise FieldError(count[0] if count else "prompt_token_ids",
                         "the prompt length is unknown: give prompt_token_ids or the engine's prompt token count")
    return {"prompt": prompt, "prompt_token_ids": ids, "prompt_tokens": n}
