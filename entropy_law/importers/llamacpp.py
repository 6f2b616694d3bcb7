"""llama.cpp server ``/completion`` responses -> ``ImportedRequest`` (aggregates only).

llama.cpp reports speculation per request as two totals, ``timings.draft_n`` and ``timings.draft_n_accepted``
(omitted when nothing was drafted): no per-step list, so no rounds or token rows. Output ids come with
``"return_tokens": true``; ``stop_type`` (or the older ``stopped_*`` flags) says why it stopped; ``timings`` time
prefill and decode. Top-k: ``completion_probabilities`` (``top_logprobs``, or ``top_probs`` / ``probs``).
"""

from __future__ import annotations

from entropy_law.importers.logprobs import as_list, checked_rows, entry_value
from entropy_law.importers.records import (FieldError, ImportedRequest, as_int, as_int_list, as_number,
                                           common_fields, prompt_fields, require)

ENGINE = "llamacpp"

STOP_TYPES = {"eos": "eos", "word": "eos", "limit": "max_new_tokens"}
OLD_STOP_FLAGS = (("stopped_eos", "eos"), ("stopped_word", "word"), ("stopped_limit", "limit"))


def parse(obj, *, line: int, category: str) -> ImportedRequest:
    """One llama.cpp ``/completion`` response -> ``ImportedRequest`` (request-level aggregates)."""
    if not isinstance(obj, dict):
        raise FieldError("(line)", f"expected a JSON object (one /completion response), got {type(obj).__name__}")
    if "choices" in obj and "tokens" not in obj:
        raise FieldError("tokens", "missing: this is an OpenAI-endpoint response; the llamacpp importer reads "
                                   "/completion responses requested with \"return_tokens\": true")
    output_ids = as_int_list(require(obj, "tokens", "request /completion with \"return_tokens\": true"), "tokens")
    timings = require(obj, "timings")
    if not isinstance(timings, dict):
        raise FieldError("timings", f"expected an object, got {type(timings).__name__}")
    for name in ("tokens_predicted", "timings.predicted_n"):
        value = obj.get(name) if "." not in name else timings.get(name.split(".", 1)[1])
        if value is not None and as_int(value, name) != len(output_ids):
            raise FieldError(name, f"is {value} but tokens holds {len(output_ids)} ids")

    stop_type = obj.get("stop_type")
    if stop_type is None:
        flags = [name for key, name in OLD_STOP_FLAGS if obj.get(key) is True]
        stop_type = flags[0] if len(flags) == 1 else None
    if stop_type == "none" or (stop_type is None and obj.get("stop") is False):
        raise FieldError("stop_type", "the response is not final (a streaming chunk?); import the last chunk")
    if stop_type not in STOP_TYPES:
        raise FieldError("stop_type", f"expected one of {sorted(STOP_TYPES)} (or one true stopped_* flag), got "
                                      f"{stop_type!r}")

    draft_n, draft_accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if (draft_n is None) != (draft_accepted is None):
        missing = "timings.draft_n" if draft_n is None else "timings.draft_n_accepted"
        raise FieldError(missing, "missing while its partner is given")
    if draft_n is not None:
        draft_n, draft_accepted = as_int(draft_n, "timings.draft_n"), as_int(draft_accepted, "timings.draft_n_accepted")
        if draft_accepted > draft_n:
            raise FieldError("timings.draft_n_accepted", f"{draft_accepted} > timings.draft_n = {draft_n}")
    times = {}
    for name in ("prompt_ms", "predicted_ms"):
        value = timings.get(name)
        if value is not None:
            value = as_number(value, f"timings.{name}")
            if value < 0:
                raise FieldError(f"timings.{name}", f"must be >= 0, got {value}")
        times[name] = value

    common = common_fields(obj, default_request_id=f"line-{line}", default_category=category)
    prompt = prompt_fields(obj, ("prompt_token_ids",), ("tokens_evaluated", obj.get("tokens_evaluated")))
    model = obj.get("model")
    aggregates = {"timings": {"draft_n": draft_n, "draft_n_accepted": draft_accepted}}
    topk, topk_field = topk_logprobs(obj, len(output_ids))
    settings = obj.get("generation_settings")
    if isinstance(settings, dict):
        spec_settings = {k: v for k, v in settings.items() if k.startswith("speculative")}
        if spec_settings:
            aggregates["generation_settings"] = spec_settings
    return ImportedRequest(
        engine=ENGINE, shape="llamacpp /completion timings", line=line, **common, **prompt,
        output_token_ids=output_ids, stop_reason=STOP_TYPES[stop_type], finish_reason=stop_type,
        model=model if isinstance(model, str) else None, num_spec_tokens=None, aggregates=aggregates,
        prefill_ms=times["prompt_ms"], decode_ms=times["predicted_ms"], topk_logprobs=topk, topk_field=topk_field)


def topk_logprobs(obj: dict, n_output: int) -> tuple[list[list[float]] | None, str | None]:
    """``completion_probabilities`` as one list of log-probabilities per output token, or (None, None)."""
    block = obj.get("completion_probabilities")
    if block is None:
        return None, None
    field = "completion_probabilities"
    rows = []
    for j, item in enumerate(as_list(block, field)):
        if not isinstance(item, dict):
            raise FieldError(f"{field}[{j}]", f"expected an object, got {type(item).__name__}")
        for name, value_key, probability in (("top_logprobs", "logprob", False), ("top_probs", "prob", True),
                                             ("probs", "prob", True)):
            if item.get(name):
                rows.append([entry_value(e.get(value_key) if isinstance(e, dict) else e,
                                         f"{field}[{j}].{name}[{i}].{value_key}", probability=probability)
                             for i, e in enumerate(as_list(item[name], f"{field}[{j}].{name}"))])
                break
        else:
            raise FieldError(f"{field}[{j}]", "no top_logprobs / top_probs / probs: request n_probs >= 1")
    return checked_rows(rows, field, n_output), field


__all__ = ["ENGINE", "STOP_TYPES", "parse", "topk_logprobs"]
