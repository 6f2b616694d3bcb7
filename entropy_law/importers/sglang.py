"""SGLang native ``/generate`` responses with speculative-decoding statistics -> ``ImportedRequest``.

Read from ``meta_info``: the aggregates SGLang fills whenever speculation ran (``spec_verify_ct``,
``spec_num_correct_drafts``, the histogram ``spec_correct_drafts_histogram`` indexed by correct drafts, and their
deprecated aliases), and the per-step ``accept_lengths`` / ``verify_lengths`` of ``--speculative-decoding-stats
detailed`` (both count the root token; read as a chain, EAGLE ``topk = 1``). Top-k log-probabilities:
``meta_info.output_top_logprobs``, ``[logprob, token_id, text]`` entries per output token.
"""

from __future__ import annotations

from entropy_law.importers.logprobs import as_list, checked_rows, entry_value, fast_values
from entropy_law.importers.records import (MISSING, FieldError, ImportedRequest, as_histogram, as_int,
                                           as_int_list, common_fields, lookup, prompt_fields, require)

ENGINE = "sglang"

FINISH_TYPES = {"stop": "eos", "length": "max_new_tokens", "abort": "error"}
HISTOGRAM_FIELDS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # current name, deprecated alias
CORRECT_FIELDS = ("spec_num_correct_drafts", "spec_accepted_drafts")


def parse(obj, *, line: int, category: str) -> ImportedRequest:
    """One SGLang ``/generate`` response (``output_ids`` + ``meta_info``) -> ``ImportedRequest``."""
    if not isinstance(obj, dict):
        raise FieldError("(line)", f"expected a JSON object (one /generate response), got {type(obj).__name__}; "
                                   "a batch answer is a list: write one response per line")
    if "meta_info" not in obj and ("choices" in obj or "sglext" in obj):
        raise FieldError("meta_info", "missing: this is an OpenAI-endpoint response; the sglang importer reads "
                                      "native /generate responses (output_ids + meta_info)")
    meta = require(obj, "meta_info")
    if not isinstance(meta, dict):
        raise FieldError("meta_info", f"expected an object, got {type(meta).__name__}")
    output_ids = as_int_list(require(obj, "output_ids"), "output_ids")
    completion = meta.get("completion_tokens")
    if completion is not None and as_int(completion, "meta_info.completion_tokens") != len(output_ids):
        raise FieldError("meta_info.completion_tokens", f"is {completion} but output_ids holds {len(output_ids)} ids")
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or finish.get("type") is None:
        raise FieldError("meta_info.finish_reason", f"expected {{\"type\": ...}}, got {finish!r} (null: the "
                                                    "request is not finished; import final responses)")
    if finish["type"] not in FINISH_TYPES:
        raise FieldError("meta_info.finish_reason.type", f"unknown value {finish['type']!r} "
                                                         f"(known: {sorted(FINISH_TYPES)})")

    spec = {k: v for k, v in meta.items() if k.startswith("spec_") or k in ("speculative_decoding_stats",
                                                                            "accept_lengths", "verify_lengths")}
    if not spec:
        raise FieldError("meta_info.spec_verify_ct", "missing: the response holds no speculative-decoding "
                                                     "statistics (did the server run with --speculative-algorithm?)")
    histogram, histogram_field = None, None
    for name in HISTOGRAM_FIELDS:
        if meta.get(name) is not None:
            value = as_histogram(meta[name], f"meta_info.{name}")
            if histogram is not None and value != histogram:
                raise FieldError(f"meta_info.{name}", f"{value} differs from meta_info.{histogram_field} {histogram}")
            if histogram is None:
                histogram, histogram_field = value, f"meta_info.{name}"
    for name in ("spec_verify_ct", *CORRECT_FIELDS, "spec_num_proposed_drafts", "spec_proposed_drafts"):
        if meta.get(name) is not None:
            as_int(meta[name], f"meta_info.{name}")
    correct_name = next((n for n in CORRECT_FIELDS if meta.get(n) is not None), None)
    if histogram is not None and correct_name is not None:
        weighted = sum(j * c for j, c in enumerate(histogram))
        if weighted != meta[correct_name]:
            raise FieldError(histogram_field, f"accounts for {weighted} correct drafts, meta_info.{correct_name} = "
                                              f"{meta[correct_name]}")

    accepted, drafted = _detailed_steps(meta)
    topk, topk_field = topk_logprobs(meta, len(output_ids))
    common = common_fields(obj, default_request_id=meta.get("id") or f"line-{line}", default_category=category)
    prompt = prompt_fields(obj, ("prompt_token_ids", "input_ids"),
                           ("meta_info.prompt_tokens", lookup(obj, "meta_info.prompt_tokens")))
    model = obj.get("model")
    shape = "sglang meta_info" + (" + detailed accept_lengths/verify_lengths" if accepted is not None else "")
    return ImportedRequest(
        engine=ENGINE, shape=shape, line=line, **common, **prompt, output_token_ids=output_ids,
        stop_reason=FINISH_TYPES[finish["type"]], finish_reason=finish, model=model if isinstance(model, str) else None,
        num_spec_tokens=None, steps_accepted=accepted, steps_drafted=drafted, histogram=histogram,
        histogram_field=histogram_field, aggregates={"meta_info": spec}, topk_logprobs=topk, topk_field=topk_field)


def topk_logprobs(meta: dict, n_output: int) -> tuple[list[list[float]] | None, str | None]:
    """``meta_info.output_top_logprobs`` as one list of log-probabilities per output token, or (None, None)."""
    block = meta.get("output_top_logprobs")
    if block is None:
        return None, None
    field = "meta_info.output_top_logprobs"
    rows = []
    for j, position in enumerate(as_list(block, field)):
        if not position:
            raise FieldError(f"{field}[{j}]", "missing or empty: request top_logprobs_num >= 1")
        values = fast_values(as_list(position, f"{field}[{j}]"), 0)
        rows.append(values if values is not None else
                    [entry_value(e[0] if isinstance(e, (list, tuple)) and e else e, f"{field}[{j}][{i}][0]")
                     for i, e in enumerate(position)])
    return checked_rows(rows, field, n_output), field


def _detailed_steps(meta: dict) -> tuple[list[int] | None, list[int] | None]:
    """(accepted drafts per step, verified drafts per step) from the detailed lists, or (None, None)."""
    block = meta.get("speculative_decoding_stats")
    where = "meta_info.speculative_decoding_stats"
    if block is None or (isinstance(block, dict) and "accept_lengths" not in block):
        if meta.get("accept_lengths") is None and meta.get("verify_lengths") is None:
            return None, None
        block, where = meta, "meta_info"
    if not isinstance(block, dict):
        raise FieldError(where, f"expected an object, got {type(block).__name__}")
    accept, verify = lookup(block, "accept_lengths"), lookup(block, "verify_lengths")
    if accept in (MISSING, None) or verify in (MISSING, None):
        missing = "accept_lengths" if accept in (MISSING, None) else "verify_lengths"
        raise FieldError(f"{where}.{missing}", "missing while its partner is given (detailed mode gives both)")
    accept = as_int_list(accept, f"{where}.accept_lengths", minimum=1)
    verify = as_int_list(verify, f"{where}.verify_lengths", minimum=1)
    if len(accept) != len(verify):
        raise FieldError(f"{where}.accept_lengths", f"{len(accept)} steps but verify_lengths has {len(verify)}")
    for i, (a, v) in enumerate(zip(accept, verify)):
        if a > v:
            raise FieldError(f"{where}.accept_lengths", f"step {i} accepted {a} tokens of {v} verified")
    for name, values in (("num_accepted_draft_tokens", accept), ("num_verified_draft_tokens", verify)):
        if block.get(name) is not None and as_int(block[name], f"{where}.{name}") != sum(values) - len(values):
            raise FieldError(f"{where}.{name}", f"is {block[name]} but the per-step list gives "
                                                f"{sum(values) - len(values)} (each length counts the bonus/root)")
    return [a - 1 for a in accept], [v - 1 for v in verify]


__all__ = ["ENGINE", "FINISH_TYPES", "HISTOGRAM_FIELDS", "parse"]
