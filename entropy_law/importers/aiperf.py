"""NVIDIA AIPerf's per-request records (``profile_export.jsonl``) with speculative-decoding acceptance ->
``ImportedRequest``.

Known here: the line AIPerf writes per request (``metadata``, ``metrics`` ``{name: {"value", "unit"}}``,
``error``) and its ``spec_decode_acceptance`` record (fields mapped in ``docs/importers.md``). It shares vLLM's
field names, so it is checked as vLLM's block is (``vllm.checked_stats``), and its two derived numbers
(``mean_acceptance_length``, ``draft_acceptance_rate``) against the counts. No token ids, prompt text or
log-probabilities: request rows, histograms and aligned steps, never a law. Stop reason filled: ``eos``
(``error`` for a cancelled request).
"""

from __future__ import annotations

import math

from entropy_law.importers.records import (FieldError, ImportedRequest, as_int, as_number, common_fields, lookup,
                                           MISSING)
from entropy_law.importers.vllm import checked_stats

ENGINE = "aiperf"
RECORD = "spec_decode_acceptance"
DERIVED_TOLERANCE = 1e-6  # mean_acceptance_length and draft_acceptance_rate against the counts (JSON floats)


def _metric(obj: dict, name: str):
    value = lookup(obj, f"metrics.{name}.value")
    return None if value is MISSING else value


def parse(obj, *, line: int, category: str) -> ImportedRequest:
    """One line of AIPerf's ``profile_export.jsonl`` -> ``ImportedRequest`` (the acceptance record required)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise FieldError("metadata", "missing: not an AIPerf per-request record (profile_export.jsonl lines have "
                                     "metadata, metrics and error)")
    if obj.get("error") is not None:
        raise FieldError("error", f"the request failed ({obj['error']!r}): it holds no acceptance to import")
    stats = obj.get(RECORD)
    if stats is None:
        raise FieldError(RECORD, "missing or null: AIPerf writes it when the server returns per-request "
                                 "speculative-decoding stats (vLLM: --per-request-spec-decode-metrics)")
    if not isinstance(stats, dict):
        raise FieldError(RECORD, f"expected an object, got {type(stats).__name__}")
    k, histogram, per_accepted, per_drafted = checked_stats(stats, RECORD)
    steps, accepted = sum(histogram), sum(j * c for j, c in enumerate(histogram))
    drafted = as_int(stats["num_draft_tokens"], f"{RECORD}.num_draft_tokens")
    for name, expected in (("mean_acceptance_length", 1 + accepted / steps if steps else None),
                           ("draft_acceptance_rate", accepted / drafted if drafted else None)):
        value = stats.get(name)
        if value is not None and expected is not None and \
                not math.isclose(as_number(value, f"{RECORD}.{name}"), expected, abs_tol=DERIVED_TOLERANCE):
            raise FieldError(f"{RECORD}.{name}", f"is {value} but the counts give {expected:.6g}")
    engine = stats.get("engine")
    completion = {name: as_int(v, name) for name, v in (
        (f"{RECORD}.completion_tokens", stats.get("completion_tokens")),
        ("metrics.output_sequence_length.value", _metric(obj, "output_sequence_length"))) if v is not None}
    if not completion:
        raise FieldError(f"{RECORD}.completion_tokens", "missing, and metrics.output_sequence_length too: the "
                                                        "output's length is needed (run AIPerf with a tokenizer)")
    if len(set(completion.values())) > 1:
        raise FieldError(f"{RECORD}.completion_tokens", f"disagree: {completion}")
    prompt_tokens = _metric(obj, "input_sequence_length")
    if prompt_tokens is None:
        raise FieldError("metrics.input_sequence_length.value", "missing: the prompt length is needed (run AIPerf "
                                                                "with a tokenizer)")
    metadata = obj["metadata"]
    default_id = metadata.get("x_request_id") or (
        f"{metadata['conversation_id']}#{metadata.get('turn_index', 0)}" if metadata.get("conversation_id")
        else f"line-{line}")
    cancelled = metadata.get("was_cancelled") is True
    try:
        return ImportedRequest(
            engine=ENGINE, shape=f"aiperf {RECORD} ({engine or 'engine not named'}; stop reason not logged)",
            line=line, **common_fields(obj, default_request_id=default_id, default_category=category),
            prompt=None, prompt_token_ids=None,
            prompt_tokens=as_int(prompt_tokens, "metrics.input_sequence_length.value"), output_token_ids=None,
            completion_tokens=next(iter(completion.values())), stop_reason="error" if cancelled else "eos",
            finish_reason=None, model=None, num_spec_tokens=k, steps_accepted=per_accepted,
            steps_drafted=per_drafted, histogram=histogram, histogram_field=f"{RECORD}.acceptance_histogram",
            aggregates={RECORD: stats, "metrics": obj.get("metrics"), "metadata": metadata})
    except FieldError as err:
        raise FieldError(err.field if err.field.startswith(RECORD) else f"{RECORD}.{err.field}", err.problem) from None


__all__ = ["ENGINE", "RECORD", "parse"]
