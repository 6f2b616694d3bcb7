"""From an engine JSONL to a trace run: read and check every line, then write through ``TraceRecorder``.

A bad line stops the import with ``file:line``, the field and what to do (``skip_bad``: skipped and counted); a
file that mixes configurations (two models or draft lengths) is refused. The run gets ``run.json`` with an
``engine_import`` entry, ``engine_import.jsonl`` beside it (every request as the engine reported it;
``read_import`` reads it back), a ``requests`` row per request, and ``rounds``/``tokens`` rows for aligned
per-step requests once target statistics exist (``target_stats``, or top-k log-probabilities with
``vocab_size``). Knows no engine's fields. No torch.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from entropy_law.importers import aiperf, llamacpp, sglang, vllm
from entropy_law.importers.records import (DEFAULT_CATEGORY, FieldError, ImportedRequest,
                                           MalformedResponseError, decoded_line)
from entropy_law.traces.recorder import TraceRecorder
from entropy_law.traces.schema import SCHEMAS
from entropy_law.traces.stats import TARGET_STAT_KEYS, context_matches_of_output
from entropy_law.traces.topk import RENORMALISED_TAIL, TopkInputError, pad_topk, topk_entropy
from entropy_law.traces.layout import file_sha256

PARSERS = {vllm.ENGINE: vllm.parse, sglang.ENGINE: sglang.parse, llamacpp.ENGINE: llamacpp.parse,
           aiperf.ENGINE: aiperf.parse}
FAST_DECODERS = {vllm.ENGINE: vllm.fast_decode}  # bytes -> what the parser reads, or None: the line is read whole
RECORD_FILE = "engine_import.jsonl"
METADATA_KEY = "engine_import"
TARGET_STATS_MISSING = ("missing: no engine records target entropies; token and round rows are written once they "
                        "are computed from engine_import.jsonl (entropy-law entropy RUN --model M; in "
                        "Python: write_run(..., target_stats=...)), or from the engine's top-k log-probabilities: "
                        "ask for them (vLLM / OpenAI-compatible logprobs: true with top_logprobs: 20; SGLang "
                        "return_logprob with top_logprobs_num; llama.cpp n_probs) and import again with "
                        "--vocab-size V")

TOPK_NEEDS_VOCAB = ("the responses carry top-k log-probabilities: give the target's vocabulary size (entropy-law "
                    "import --vocab-size V; vocab_size in the model's config.json) to turn them into entropy bounds")
TOPK_ROWS_PER_SHARD = 50_000  # token rows of top-k requests written together (one log_columns call)

TargetStatsFn = Callable[[ImportedRequest], Mapping[str, object]]
_MSGSPEC = msgspec.json.Encoder(enc_hook=lambda value: value.tolist())  # arrays as lists


@dataclass
class SkippedLine:
    line: int
    field: str
    problem: str


@dataclass
class ParsedFile:
    """The requests of one engine JSONL, and the lines skipped with ``skip_bad``."""

    path: Path
    engine: str
    records: list[ImportedRequest]
    skipped: list[SkippedLine] = field(default_factory=list)
    lines: int = 0  # non-blank lines read


def parse_jsonl(path, engine: str, *, category: str = DEFAULT_CATEGORY, skip_bad: bool = False) -> ParsedFile:
    """Every non-blank line of ``path`` read and checked as a response of ``engine``. A bad line raises
    ``MalformedResponseError`` (``file:line: field: problem``), or with ``skip_bad`` is listed in ``skipped``.
    ``category``: for lines without one. Two models or draft lengths in one file: ValueError."""
    if engine not in PARSERS:
        raise ValueError(f"unknown engine {engine!r}; importers exist for {sorted(PARSERS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a JSONL of {engine} responses, one per line)")
    parse = PARSERS[engine]

    def repeated(record, first_line):
        return FieldError("request_id", f"{record.request_id!r} repeats line {first_line}; request ids must be "
                                        "unique in a run (add a \"request_id\" key)")

    records, skipped, lines = read_jsonl(path, lambda obj, number: parse(obj, line=number, category=category),
                                         lambda record: record.request_id, repeated, skip_bad=skip_bad,
                                         fast_decode=FAST_DECODERS.get(engine))
    parsed = ParsedFile(path=path, engine=engine, records=records, skipped=skipped, lines=lines)
    if not parsed.records:  # a run of nothing is no import
        raise ValueError(f"{path}: no request to import: " + (
            f"all {parsed.lines} line(s) are bad and were skipped (first: {nothing_kept(parsed.skipped)})"
            if parsed.skipped else "the file holds no line"))
    _check_one_configuration(parsed)
    return parsed


def read_jsonl(path: Path, parse_line, key_of, repeated, *, skip_bad: bool,
               fast_decode=None) -> tuple[list, list[SkippedLine], int]:
    """``(items, skipped lines, non-blank lines)``: ``parse_line(obj, line)`` per line (``obj``: ``fast_decode(raw)``,
    else the JSON); a repeated ``key_of`` raises ``repeated(item, first line)``; a bad line ``MalformedResponseError``,
    or with ``skip_bad`` is skipped."""
    items, skipped, lines, seen = [], [], 0, {}
    with open(path, "rb", buffering=1 << 20) as fh:  # 1 MiB: engine lines with top-k run to megabytes
        for number, raw in enumerate(fh, start=1):
            if raw.isspace():
                continue
            lines += 1
            try:
                try:
                    obj = (fast_decode and fast_decode(raw)) or json.loads(decoded_line(raw))
                except json.JSONDecodeError as err:
                    raise FieldError("(line)", f"not JSON ({err.msg} at column {err.colno})") from None
                item = parse_line(obj, number)
                key = key_of(item)
                if key in seen:
                    raise repeated(item, seen[key])
            except FieldError as err:
                if not skip_bad:
                    raise MalformedResponseError(path, number, err.field, f"{err.problem} (entropy-law import "
                                                 "--skip-bad skips such lines and counts them in run.json)") from None
                skipped.append(SkippedLine(number, err.field, err.problem))
                continue
            seen[key] = number
            items.append(item)
    return items, skipped, lines


def write_jsonl_atomic(final: Path, rows) -> None:
    """Write ``rows`` (dicts; with an array, ``vllm.fast_decode``'s finite top-k: by msgspec) as JSON lines to a
    temporary name beside ``final``, synced, then renamed."""
    tmp = final.with_name(f".tmp-{final.name}")
    with open(tmp, "wb") as fh:
        for row in rows:
            fh.write(_MSGSPEC.encode(row) + b"\n" if any(isinstance(v, np.ndarray) for v in row.values())
                     else json.dumps(row, separators=(",", ":")).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def nothing_kept(skipped: list[SkippedLine]) -> str:
    """The first skipped line, for the error of an import whose every line was bad."""
    first = skipped[0]
    return f"line {first.line}: {first.field}: {first.problem}"


def _check_one_configuration(parsed: ParsedFile) -> None:
    for name in ("model", "num_spec_tokens"):
        values: dict = {}
        for record in parsed.records:
            value = getattr(record, name)
            if value is not None:
                values.setdefault(value, []).append(record.line)
        if len(values) > 1:
            parts = [f"{v!r} (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines[:5]))}"
                     f"{', ...' if len(lines) > 5 else ''})" for v, lines in values.items()]
            raise ValueError(f"{parsed.path}: the lines hold more than one {name}: {'; '.join(parts)}. A run holds one "
                             "configuration: split the file and import each part into its own run")


@dataclass
class ImportSummary:
    """What an import wrote: counts, the flagged requests, where the run is."""

    run_dir: Path
    run_id: str
    engine: str
    lines: int
    imported: int
    per_step: int  # aligned per-step requests
    flagged: list[dict]
    aggregate_only: int
    skipped: list[SkippedLine]
    rounds_in_tables: int
    target_stats: str

    def lines_to_print(self) -> list[str]:
        out = [f"imported {self.imported} of {self.lines} {self.engine} response(s) into {self.run_dir} "
               f"(run {self.run_id})",
               f"  per-step data, aligned:          {self.per_step}",
               f"  per-step data, flagged:          {len(self.flagged)}",
               f"  aggregates only:                 {self.aggregate_only}",
               f"  malformed lines skipped:         {len(self.skipped)}"]
        out += [f"  flagged line {flag['line']} ({flag['request_id']}): {flag['reason']}" for flag in self.flagged[:10]]
        if len(self.flagged) > 10:
            out.append(f"  ... {len(self.flagged) - 10} more flagged (run.json: {METADATA_KEY}.flagged)")
        written = ("" if self.target_stats.startswith("missing")
                   else f"; rounds of {self.rounds_in_tables} request(s) written")
        return [*out, f"target statistics: {self.target_stats}{written}"]


def write_run(parsed: ParsedFile, out, *, model_id: str | None = None, drafter_id: str | None = None,
              overwrite: bool = False, target_stats: TargetStatsFn | None = None,
              target_stats_source: str | None = None, vocab_size: int | None = None,
              topk_point: str = "geometric") -> ImportSummary:
    """Write ``parsed`` as a trace run in ``out`` (refused if a run is there, unless ``overwrite``).
    ``target_stats``: a function of an ``ImportedRequest`` returning ``{key: array of len(output ids)}`` for the
    ``TARGET_STAT_KEYS``; with it aligned per-step requests get rounds and tokens, and ``target_stats_source`` (for
    ``run.json``) says what computed them. Without it, aligned requests with top-k log-probabilities get rows with
    the entropy's bounds and ``topk_point`` estimate, which needs ``vocab_size`` (V of the target)."""
    if (target_stats is None) != (target_stats_source is None):
        raise ValueError("give target_stats together with target_stats_source (what computed them), or neither")
    with_topk = [r for r in parsed.records if r.topk_logprobs is not None]
    if with_topk and target_stats is None and vocab_size is None:
        raise ValueError(f"{parsed.path}: {TOPK_NEEDS_VOCAB}")
    flagged, aligned, aggregate_only = [], [], 0
    for record in parsed.records:
        check = record.alignment()
        if check is None:
            aggregate_only += 1
        elif check.ok:
            aligned.append(record.request_id)
        else:
            flagged.append({"request_id": record.request_id, "line": record.line, "reason": check.reason,
                            "from_steps": check.from_steps, "completion_tokens": check.completion_tokens})
    written = set(aligned) if target_stats is not None else set()
    topk = None
    if target_stats is None and with_topk:
        topk = _topk_estimates(parsed, with_topk, set(aligned), vocab_size, topk_point)
        written = set(topk["written"])
    block_size = run_block_size(parsed.records)
    source = target_stats_source if target_stats is not None else topk["source"] if topk else TARGET_STATS_MISSING
    meta = _run_metadata(parsed, model_id, drafter_id, block_size, dict(
        per_step_aligned=len(aligned), aggregate_only=aggregate_only, flagged=flagged, target_stats=source,
        rounds_in_tables=len(written)))
    if topk:
        meta[METADATA_KEY]["topk"] = topk["metadata"]
    with TraceRecorder(out, overwrite=overwrite, **meta) as recorder:
        _log_records(recorder, parsed.records, written, target_stats, topk, block_size)
        write_record(Path(out), parsed.records, written, flagged)
        run_id = recorder.run_id
    return ImportSummary(run_dir=Path(out), run_id=run_id, engine=parsed.engine, lines=parsed.lines,
                         imported=len(parsed.records), per_step=len(aligned), flagged=flagged,
                         aggregate_only=aggregate_only, skipped=parsed.skipped, rounds_in_tables=len(written),
                         target_stats=source)


def _run_metadata(parsed: ParsedFile, model_id, drafter_id, block_size: int, outcome: dict) -> dict:
    """The run's metadata, ``outcome`` (what was aligned, flagged and written) in its ``engine_import`` entry."""
    models = {r.model for r in parsed.records if r.model is not None}
    ks = {r.num_spec_tokens for r in parsed.records if r.num_spec_tokens is not None}
    return {
        "model_id": model_id if model_id is not None else (next(iter(models)) if models else None),
        "drafter_id": drafter_id if drafter_id is not None else f"{parsed.engine}:{parsed.path.stem}",
        "drafter_config": {"num_spec_tokens": next(iter(ks))} if ks else {},
        "tree_policy": "chain",
        METADATA_KEY: {
            "engine": parsed.engine, "source": str(parsed.path), "source_sha256": file_sha256(parsed.path),
            "shapes": dict(Counter(r.shape for r in parsed.records)), "lines_read": parsed.lines,
            "imported": len(parsed.records), "per_step_aligned": outcome["per_step_aligned"],
            "aggregate_only": outcome["aggregate_only"], "flagged": outcome["flagged"],
            "skipped_bad": len(parsed.skipped), "skipped_lines": [vars(s) for s in parsed.skipped],
            "record_file": RECORD_FILE,
            "histograms": (f"{RECORD_FILE}: 'histogram' per request (dense step counts, index = drafts accepted "
                           "in a step, bonus excluded; 'histogram_field' says where it came from)"),
            "target_stats": outcome["target_stats"],
            "rounds_in_tables": outcome["rounds_in_tables"],
            "block_size": (f"{block_size}: " + ("num_spec_tokens + 1" if ks else "the largest drafted count in "
                                                "the file + 1 (the engine does not state its draft length)")),
            "timings": ("prefill_ms/decode_ms from the engine where it times them (llama.cpp), else 0; "
                        "round times 0 (not reported)"),
        },
    }


def _log_records(recorder: TraceRecorder, records, written: set, target_stats, topk, block_size: int) -> None:
    """Every record into ``recorder``: top-k requests in batches of columns, the others one by one."""
    batch = []
    for record in records:
        if topk and record.request_id in written:
            batch.append(record)
            if sum(r.new_tokens for r in batch) >= TOPK_ROWS_PER_SHARD:
                recorder.log_columns(**topk_tables(batch, topk["estimates"], block_size))
                batch = []
            continue
        stats = target_stats(record) if record.request_id in written else None
        log_request(recorder, record, stats=stats, block_size=block_size)
    if batch:
        recorder.log_columns(**topk_tables(batch, topk["estimates"], block_size))


def _topk_estimates(parsed: ParsedFile, records: list[ImportedRequest], aligned: set[str], vocab_size: int,
                    point: str) -> dict:
    """Entropy bounds of each top-k request, the aligned ones whose rows are written, and their ``run.json`` entry."""
    estimates, renormalised, fewer, positions, max_k = {}, [], 0, 0, 0
    for record in records:
        padded = pad_topk(record.topk_logprobs)
        max_k = max(max_k, padded.shape[1] if len(padded) else 0)
        try:
            est = topk_entropy(padded, vocab_size, point=point)
        except TopkInputError as err:
            raise ValueError(f"{parsed.path}:{record.line}: {record.topk_field}[{err.row}]: {err.problem} (is "
                             f"--vocab-size {vocab_size} the target's vocabulary size?)") from None
        partial = est.k < vocab_size
        if partial.any() and (est.tail_mass[partial] <= RENORMALISED_TAIL).all():
            renormalised.append({"request_id": record.request_id, "line": record.line,
                                 "positions": int(partial.sum())})
            est.lower_nats[:] = est.upper_nats[:] = np.nan
        fewer += int((est.k < est.k.max()).sum())
        positions += len(est.k)
        estimates[record.request_id] = est
    written = [r.request_id for r in records if r.request_id in aligned]
    fields = sorted({r.topk_field for r in records})
    source = (f"top-k log-probabilities ({', '.join(fields)}; V = {vocab_size}): target_entropy_nats null, its "
              f"bounds and {point} estimate in target_entropy_lower/upper/estimate_nats (traces.topk); "
              "target_top1_prob, target_top2_prob, target_logit_gap exact from the list; target_renyi2_nats null")
    metadata = {
        "vocab_size": int(vocab_size), "estimator": point, "fields": fields,
        "requests": len(records), "positions": positions, "requests_in_tables": len(written),
        "not_in_tables": ("requests without aligned per-step data keep their top-k in engine_import.jsonl only"
                          if len(written) < len(records) else None),
        "max_k": int(max_k),
        "positions_fewer_entries": fewer,
        "fewer_entries": ("positions holding fewer entries than the request's most (an engine merged duplicates, "
                          "e.g. vLLM's completions endpoint keys them by token string): read with the k they hold"),
        "renormalised": renormalised,
        "renormalised_rule": (f"a request whose tail mass is at most {RENORMALISED_TAIL:g} at every position with "
                              "k < V reads as a top-k the engine renormalised: its bounds do not hold and are "
                              "written null; its estimate is the list's own entropy"),
    }
    return {"estimates": estimates, "written": written, "source": source, "metadata": metadata}


def topk_tables(records: list[ImportedRequest], estimates: dict, block_size: int) -> dict:
    """The tokens, rounds and requests columns (for ``TraceRecorder.log_columns``) of aligned requests whose entropy
    comes from their top-k."""
    req, parts, rnd = {}, [], []
    for record in records:
        est = estimates[record.request_id]
        columns = record.round_columns(block_size)
        leaf, start, committed, accepted = (columns.pop("ends_at_leaf"), columns["start_position"],
                                            columns["committed"], columns["accepted"])
        rnd.append({"request_id": np.full(len(start), record.request_id, dtype=object), **columns})
        which = np.repeat(np.arange(len(start)), committed)  # the round of each committed token, in order
        depth = np.arange(which.size) - np.repeat(np.cumsum(committed) - committed, committed) + 1
        position = start[which] + depth - 1
        context = (context_matches_of_output(record.prompt_token_ids, record.output_token_ids)
                   if record.prompt_token_ids is not None else None)
        parts.append({
            "request_id": np.full(which.size, record.request_id, dtype=object),
            "category": np.full(which.size, record.category, dtype=object),
            "round_index": which.astype(np.int32),
            "position": position.astype(np.int32), "depth": depth.astype(np.int16),
            "token_id": np.asarray(record.output_token_ids, dtype=np.int64)[position],
            "role": np.where(depth <= accepted[which], "accepted",
                             np.where(leaf[which], "bonus", "correction")).astype(object),
            "target_top1_prob": est.top1_prob[position], "target_top2_prob": est.top2_prob[position],
            "target_logit_gap": est.logit_gap[position], "target_entropy_lower_nats": est.lower_nats[position],
            "target_entropy_upper_nats": est.upper_nats[position],
            "target_entropy_estimate_nats": est.estimate_nats[position], "target_topk": est.k[position],
            "context_match": (np.full(which.size, -1) if context is None else context[position].astype(np.int64)),
        })
        append_row(req, request_id=record.request_id, category=record.category, dataset=record.dataset,
                   question_id=record.question_id, prompt_tokens=record.prompt_tokens, image_tokens=0,
                   new_tokens=record.new_tokens, rounds=len(start), stop_reason=record.stop_reason,
                   prefill_ms=record.prefill_ms or 0.0, decode_ms=record.decode_ms or 0.0)
    tokens = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    n = len(tokens["position"])  # float NaN: null (log_columns)
    tokens.update({"token_id": pa.array(tokens["token_id"], type=pa.int32()),
                   "target_topk": pa.array(tokens["target_topk"], type=pa.int16()),
                   "context_match": pa.array(np.maximum(tokens["context_match"], 0), type=pa.int16(),
                                             mask=tokens["context_match"] < 0)})
    rnd = {key: np.concatenate([part[key] for part in rnd]) for key in rnd[0]}
    zeros = np.zeros(len(rnd["request_id"]), np.float32)
    rnd.update({"draft_ms": zeros, "verify_ms": zeros, "overhead_ms": zeros})
    return {"tokens": with_null_columns(tokens, "tokens", n), "rounds": rnd, "requests": req}


def with_null_columns(columns: dict, table: str, n: int) -> dict:
    """``columns`` with a null column of ``n`` rows for every nullable column of ``table`` it lacks."""
    for f in SCHEMAS[table]:
        if f.nullable and f.name not in columns:
            columns[f.name] = pa.nulls(n, type=f.type)
    return columns


def append_row(table: dict, **values) -> None:
    """Append one row to ``table``, a dict of column lists."""
    for key, value in values.items():
        table.setdefault(key, []).append(value)


def run_block_size(records) -> int:
    """B of a run's speculative rounds: K + 1 where the engine states K, else the deepest draft of the file + 1."""
    ks = {r.num_spec_tokens for r in records if r.num_spec_tokens is not None}
    if ks:
        return next(iter(ks)) + 1
    return max((max(r.steps_drafted, default=0) for r in records if r.per_step), default=0) + 1


def log_request(recorder: TraceRecorder, record: ImportedRequest, *, stats: Mapping[str, object] | None,
                block_size: int) -> None:
    """One imported request into ``recorder``: its ``requests`` row, and with ``stats`` (as ``write_run``'s
    ``target_stats`` returns; aligned per-step requests only) its rounds and token rows."""
    recorder.begin_request(record.request_id, category=record.category, dataset=record.dataset,
                           question_id=record.question_id, prompt_tokens=record.prompt_tokens,
                           prompt_ids=record.prompt_token_ids)
    if stats is not None:
        _log_rounds(recorder, record, stats, block_size)
    recorder.end_request(record.request_id, new_tokens=record.new_tokens, stop_reason=record.stop_reason,
                         prefill_ms=record.prefill_ms or 0.0, decode_ms=record.decode_ms or 0.0)


def _log_rounds(recorder: TraceRecorder, record: ImportedRequest, stats: Mapping[str, object],
                block_size: int) -> None:
    where = f"target_stats({record.request_id!r})"
    if not isinstance(stats, Mapping) or set(stats) != set(TARGET_STAT_KEYS):
        raise ValueError(f"{where} must return a mapping with the keys {list(TARGET_STAT_KEYS)}")
    arrays = {k: np.asarray(stats[k], dtype=np.float32).reshape(-1) for k in TARGET_STAT_KEYS}
    for key, values in arrays.items():
        if len(values) != record.new_tokens:
            raise ValueError(f"{where}[{key!r}] has {len(values)} values; the output has {record.new_tokens} tokens")
    for rnd in record.rounds(block_size):
        start, committed = rnd["start_position"], rnd["committed"]
        recorder.log_round(record.request_id, round_index=rnd["round_index"], start_position=start,
                           context_len=rnd["context_len"], block_size=rnd["block_size"],
                           tree_nodes=rnd["tree_nodes"], tree_depth=rnd["tree_depth"], accepted=rnd["accepted"],
                           token_ids=record.output_token_ids[start:start + committed],
                           ends_at_leaf=rnd["ends_at_leaf"],
                           target_stats={k: v[start:start + committed] for k, v in arrays.items()})


def write_record(run_dir: Path, records: list[ImportedRequest], written: set[str], flagged: list[dict]) -> None:
    """``engine_import.jsonl``: one line per imported request, written to a temporary name and renamed."""
    reasons = {f["request_id"]: f["reason"] for f in flagged}
    write_jsonl_atomic(run_dir / RECORD_FILE, ({**record.to_json(), "rounds_in_tables": record.request_id in written,
                                                "flagged": reasons.get(record.request_id)} for record in records))


def import_jsonl(path, engine: str, out, *, category: str = DEFAULT_CATEGORY, skip_bad: bool = False,
                 model_id: str | None = None, drafter_id: str | None = None, overwrite: bool = False,
                 target_stats: TargetStatsFn | None = None, target_stats_source: str | None = None,
                 vocab_size: int | None = None, topk_point: str = "geometric") -> ImportSummary:
    """``parse_jsonl`` then ``write_run``: the whole import of one engine JSONL into the run directory ``out``."""
    parsed = parse_jsonl(path, engine, category=category, skip_bad=skip_bad)
    return write_run(parsed, out, model_id=model_id, drafter_id=drafter_id, overwrite=overwrite,
                     target_stats=target_stats, target_stats_source=target_stats_source, vocab_size=vocab_size,
                     topk_point=topk_point)


@dataclass
class ImportedRun:
    """An imported run's record (``engine_import.jsonl``) and its ``run.json`` metadata."""

    run_dir: Path
    metadata: dict
    requests: list[ImportedRequest]
    rounds_in_tables: dict[str, bool]
    flagged: dict[str, str | None]

    @property
    def rounds(self) -> pd.DataFrame:
        """One row per round of the aligned per-step requests (round 0: the prefill), in the trace tables or not."""
        columns = ["request_id", "category", "round_index", "start_position", "tree_depth", "accepted", "committed"]
        frames = [pd.DataFrame({"request_id": r.request_id, "category": r.category, **r.round_columns()})[columns]
                  for r in self.requests if r.alignment() is not None and r.alignment().ok]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame([], columns=columns)

    @property
    def histograms(self) -> pd.DataFrame:
        """One row per request and histogram bucket (``accepted_drafts`` j, ``steps``, ``source`` field)."""
        rows = [{"request_id": r.request_id, "category": r.category, "accepted_drafts": j, "steps": count,
                 "source": r.histogram_field}
                for r in self.requests if r.histogram is not None for j, count in enumerate(r.histogram)]
        return pd.DataFrame(rows, columns=["request_id", "category", "accepted_drafts", "steps", "source"])


def read_import(run_dir) -> ImportedRun:
    """Read back what ``import`` kept beside a run: every request as the engine reported it."""
    run_dir = Path(run_dir)
    record_file = run_dir / RECORD_FILE
    if not record_file.is_file():
        raise FileNotFoundError(f"{run_dir}: no {RECORD_FILE}; this run was not written by entropy-law import")
    metadata = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    requests, in_tables, flagged = [], {}, {}
    with open(record_file, encoding="utf-8") as fh:
        for text in fh:
            row = json.loads(text)
            in_tables[row["request_id"]] = bool(row.pop("rounds_in_tables"))
            flagged[row["request_id"]] = row.pop("flagged")
            requests.append(ImportedRequest.from_json(row))
    return ImportedRun(run_dir=run_dir, metadata=metadata, requests=requests, rounds_in_tables=in_tables,
                       flagged=flagged)


__all__ = ["ImportSummary", "ImportedRun", "ParsedFile", "SkippedLine", "import_jsonl", "log_request", "parse_jsonl",
           "read_import", "run_block_size", "topk_tables", "write_record", "write_run"]
