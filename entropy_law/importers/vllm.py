"""vLLM responses with per-request speculative-decoding statistics -> ``ImportedRequest``.

Where vLLM puts them (``docs/importers.md`` has the mapping): ``metrics.speculative_decoding`` (dense
``acceptance_histogram``), per choice ``choices[i].speculative_decoding_stats`` (sparse histogram), or offline
``outputs[0].spec_decode_metrics``; ``detailed`` mode adds ``per_step_accepted`` / ``per_step_drafted`` (bonus
excluded, steps without a draft omitted). Token ids come with ``return_token_ids: true``; top-k log-probabilities
from the chat, completions or offline shape. Aggregates that disagree with each other or the per-step lists make
the line malformed. ``fast_decode`` reads a chat line with top-k as ``parse`` needs it, its top-k one array.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from entropy_law.importers.logprobs import as_list, checked_rows, entry_value
from entropy_law.importers.records import (MISSING, FieldError, ImportedRequest, as_histogram, as_int,
                                           as_int_list, common_fields, lookup, prompt_fields, require)

ENGINE = "vllm"

# vLLM finish_reason -> trace stop reason ("stop" covers EOS, stop tokens and stop strings; kept verbatim too)
FINISH_REASONS = {"stop": "eos", "tool_calls": "eos", "length": "max_new_tokens", "abort": "error",
                  "error": "error"}

# (where the statistics block is, the shape's name) in the order they are looked for
STATS_LOCATIONS = (
    ("metrics.speculative_decoding", "metrics.speculative_decoding"),
    ("choices.0.speculative_decoding_stats", "choices[].speculative_decoding_stats"),
    ("outputs.0.spec_decode_metrics", "outputs[].spec_decode_metrics (offline)"),
)


def _struct(name: str, typed: list, untyped: tuple = ()) -> type:  # untyped fields: UNSET where absent
    return msgspec.defstruct(name, [*typed, *((field, Any, msgspec.UNSET) for field in untyped)], gc=False)


_POSITION = _struct("Position", [("top_logprobs", list[_struct("TopEntry", [("logprob", float)])])])
_CHOICE = _struct("Choice", [("logprobs", _struct("ChatLogprobs", [("content", list[_POSITION])]))],
                  ("token_ids", "finish_reason", "speculative_decoding_stats", "prompt_token_ids"))
_CHAT_DECODER = msgspec.json.Decoder(_struct("ChatResponse", [("choices", list[_CHOICE])], (  # what parse reads
    "outputs", "metrics", "usage", "model", "id", "request_id", "category", "dataset", "question_id", "prompt",
    "prompt_token_ids")))
_CHAT_TOPK = "choices[0].logprobs.content[].top_logprobs"


def fast_decode(raw: bytes) -> dict | None:
    """A chat completion line (n = 1, k >= 1 log-probabilities at every position) as the fields ``parse`` reads, its
    ``choices[0].logprobs`` one ``[positions, k]`` array; None for any other line (read whole)."""
    try:
        response = _CHAT_DECODER.decode(raw)
    except msgspec.MsgspecError:  # another shape (or not JSON: the generic reader says where)
        return None
    positions = response.choices[0].logprobs.content if len(response.choices) == 1 else []
    k = len(positions[0].top_logprobs) if positions else 0
    if not k or any(len(p.top_logprobs) != k for p in positions):
        return None
    topk = np.array([e.logprob for p in positions for e in p.top_logprobs]).reshape(len(positions), k)
    head, choice = ({name: value for name in s.__struct_fields__ if (value := getattr(s, name)) is not msgspec.UNSET}
                    for s in (response, response.choices[0]))  # the fields the line holds
    return {**head, "choices": [{**choice, "logprobs": topk}]}


def parse(obj, *, line: int, category: str) -> ImportedRequest:
    """One vLLM response (a chat or text completion, or an offline ``RequestOutput``) -> ``ImportedRequest``."""
    key, choice = _only_choice(obj)
    where, shape, stats = _stats_block(obj)
    output_ids = as_int_list(require(obj, f"{key}.0.token_ids", "request with \"return_token_ids\": true"),
                             f"{key}[0].token_ids")
    completion = lookup(obj, "usage.completion_tokens")
    if completion not in (MISSING, None) and as_int(completion, "usage.completion_tokens") != len(output_ids):
        raise FieldError("usage.completion_tokens", f"is {completion} but {key}[0].token_ids holds "
                                                    f"{len(output_ids)} ids")
    finish = choice.get("finish_reason")
    if finish is None:
        raise FieldError(f"{key}[0].finish_reason", "null: the response is not final (a streaming chunk?); "
                                                    "import the assembled response")
    if finish not in FINISH_REASONS:
        raise FieldError(f"{key}[0].finish_reason", f"unknown value {finish!r} (known: {sorted(FINISH_REASONS)})")
    model = obj.get("model")
    steps, accepted, drafted, k, histogram = _aggregates(stats, where)
    per_accepted, per_drafted = _per_step(stats, where, steps, accepted, drafted)
    topk, topk_field = topk_logprobs(choice, key, len(output_ids))
    common = common_fields(obj, default_request_id=obj.get("id") or obj.get("request_id") or f"line-{line}",
                           default_category=category)
    prompt = prompt_fields(obj, ("prompt_token_ids", f"{key}.0.prompt_token_ids"),
                           ("usage.prompt_tokens", lookup(obj, "usage.prompt_tokens")))
    try:
        return ImportedRequest(
            engine=ENGINE, shape=f"vllm {shape}", line=line, **common, **prompt, output_token_ids=output_ids,
            stop_reason=FINISH_REASONS[finish], finish_reason=finish, model=model if isinstance(model, str) else None,
            num_spec_tokens=k, steps_accepted=per_accepted, steps_drafted=per_drafted, histogram=histogram,
            histogram_field=f"{where}.acceptance_histogram", aggregates={where: stats}, topk_logprobs=topk,
            topk_field=topk_field)
    except FieldError as err:  # the per-step checks of ImportedRequest, named under the block they came from
        name = err.field if err.field.startswith(where) else f"{where}.{err.field}"
        raise FieldError(name, err.problem) from None


def _only_choice(obj) -> tuple[str, dict]:
    """``("choices" or "outputs", the one sequence)`` of a response generated with n = 1."""
    if not isinstance(obj, dict):
        raise FieldError("(line)", f"expected a JSON object (one vLLM response), got {type(obj).__name__}")
    key = "choices" if "choices" in obj else "outputs" if "outputs" in obj else None
    if key is None:
        raise FieldError("choices", "missing: not a vLLM response (expected choices[], or outputs[] for an offline "
                                    "RequestOutput)")
    choices = obj[key]
    if not isinstance(choices, list) or not choices:
        raise FieldError(key, "expected a non-empty list")
    if len(choices) > 1:
        raise FieldError(key, f"{len(choices)} sequences: per-request speculation statistics describe one sequence; "
                              "import responses generated with n = 1")
    if not isinstance(choices[0], dict):
        raise FieldError(f"{key}[0]", "expected an object")
    return key, choices[0]


def _stats_block(obj: dict) -> tuple[str, str, dict]:
    """``(where, shape, block)`` of the one statistics block of the response."""
    found = [(path, shape) for path, shape in STATS_LOCATIONS if lookup(obj, path) not in (MISSING, None)]
    if not found:
        raise FieldError("metrics.speculative_decoding",
                         "missing or null: start vLLM with --per-request-spec-decode-metrics summary (or detailed, "
                         "for per-step data); vLLM leaves it null when n > 1 or when the request was not speculated")
    if len(found) > 1:
        raise FieldError(found[1][0], f"a second statistics block beside {found[0][0]}; which one describes the "
                                      "request is not known")
    where, shape = found[0]
    stats = lookup(obj, where)
    if not isinstance(stats, dict):
        raise FieldError(where, f"expected an object, got {type(stats).__name__}")
    return where, shape, stats


def checked_stats(stats: dict, where: str) -> tuple[int | None, list[int], list[int] | None, list[int] | None]:
    """vLLM's statistics block at ``where`` (AIPerf's record shares it), checked: ``(num_spec_tokens or None, dense
    histogram, per_step_accepted, per_step_drafted)``, the per-step lists None where the block has none."""
    steps, accepted, drafted, k, histogram = _aggregates(stats, where)
    return (k, histogram, *_per_step(stats, where, steps, accepted, drafted))


def _aggregates(stats: dict, where: str) -> tuple[int, int, int, int | None, list[int]]:
    """``(steps, accepted, drafted, K or None, histogram)`` of the block, checked against each other."""
    steps, accepted, drafted = (as_int(require(stats, name), f"{where}.{name}")
                                for name in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"))
    k = stats.get("num_spec_tokens")
    k = None if k is None else as_int(k, f"{where}.num_spec_tokens", minimum=1)
    histogram = as_histogram(require(stats, "acceptance_histogram"), f"{where}.acceptance_histogram")
    if sum(histogram) != steps:
        raise FieldError(f"{where}.acceptance_histogram", f"counts {sum(histogram)} steps, num_spec_steps = {steps}")
    if sum(j * c for j, c in enumerate(histogram)) != accepted:
        raise FieldError(f"{where}.acceptance_histogram", f"accounts for {sum(j * c for j, c in enumerate(histogram))} "
                                                         f"accepted drafts, num_accepted_draft_tokens = {accepted}")
    if accepted > drafted:
        raise FieldError(f"{where}.num_accepted_draft_tokens", f"{accepted} > num_draft_tokens = {drafted}")
    if k is not None and len(histogram) > k + 1:
        raise FieldError(f"{where}.acceptance_histogram", f"has a step accepting {len(histogram) - 1} drafts, more "
                                                         f"than num_spec_tokens = {k}")
    return steps, accepted, drafted, k, histogram


def _per_step(stats: dict, where: str, steps: int, accepted: int, drafted: int):
    """The ``detailed`` per-step lists (accepted, drafted), checked against the aggregates, or (None, None)."""
    per_accepted, per_drafted = stats.get("per_step_accepted"), stats.get("per_step_drafted")
    if (per_accepted is None) != (per_drafted is None):
        missing = "per_step_drafted" if per_drafted is None else "per_step_accepted"
        raise FieldError(f"{where}.{missing}", "missing while its partner is given (detailed mode gives both)")
    if per_accepted is None:
        return None, None
    per_accepted = as_int_list(per_accepted, f"{where}.per_step_accepted")
    per_drafted = as_int_list(per_drafted, f"{where}.per_step_drafted")
    for name, values, total in (("per_step_accepted", per_accepted, accepted),
                                ("per_step_drafted", per_drafted, drafted)):
        if len(values) != steps:
            raise FieldError(f"{where}.{name}", f"has {len(values)} entries, num_spec_steps = {steps}")
        if sum(values) != total:
            raise FieldError(f"{where}.{name}", f"sums to {sum(values)}, the aggregate says {total}")
    return per_accepted, per_drafted


def topk_logprobs(choice: dict, key: str, n_output: int) -> tuple[list[list[float]] | None, str | None]:
    """The top-k log-probabilities of each output token of ``choice`` (chat, completions or offline shape), or
    (None, None) where the response has none."""
    block = choice.get("logprobs")
    if block is None:
        return None, None
    if isinstance(block, np.ndarray):  # fast_decode's chat top-k
        return checked_rows(block, _CHAT_TOPK, n_output), _CHAT_TOPK
    if key == "outputs":  # offline RequestOutput: [{token_id: {"logprob": x, ...} or x}, ...]
        field = "outputs[0].logprobs"
        rows = []
        for j, position in enumerate(as_list(block, field)):
            if not isinstance(position, dict):
                raise FieldError(f"{field}[{j}]", f"expected a map token id -> log-probability, got {position!r}")
            rows.append([entry_value(v.get("logprob") if isinstance(v, dict) else v, f"{field}[{j}][{t!r}]")
                         for t, v in position.items()])
        return checked_rows(rows, field, n_output), field
    if not isinstance(block, dict):
        raise FieldError("choices[0].logprobs", f"expected an object, got {type(block).__name__}")
    if block.get("content") is not None:  # chat completions
        field = "choices[0].logprobs.content"
        rows = []
        for j, item in enumerate(as_list(block["content"], field)):
            top = item.get("top_logprobs") if isinstance(item, dict) else None
            if not top:
                raise FieldError(f"{field}[{j}].top_logprobs", "missing or empty: request top_logprobs >= 1 (with "
                                                               "logprobs: true) so each token's top-k comes back")
            rows.append([entry_value(e.get("logprob") if isinstance(e, dict) else e,
                                     f"{field}[{j}].top_logprobs[{i}].logprob") for i, e in enumerate(top)])
        return checked_rows(rows, _CHAT_TOPK, n_output), _CHAT_TOPK
    if block.get("top_logprobs") is not None:  # completions: one map token string -> logprob per position
        field = "choices[0].logprobs.top_logprobs"
        rows = []
        for j, position in enumerate(as_list(block["top_logprobs"], field)):
            if not isinstance(position, dict) or not position:
                raise FieldError(f"{field}[{j}]", "expected a non-empty map token -> log-probability: request "
                                                  "logprobs >= 1")
            rows.append([entry_value(v, f"{field}[{j}][{t!r}]") for t, v in position.items()])
        return checked_rows(rows, field, n_output), field
    return None, None


__all__ = ["ENGINE", "FINISH_REASONS", "STATS_LOCATIONS", "checked_stats", "fast_decode", "parse", "topk_logprobs"]
