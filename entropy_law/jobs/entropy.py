"""Target statistics for an imported engine run (``entropy-law entropy RUN --model M``), teacher-forced.

Packed forwards of at most ``batch_tokens`` tokens over prompt + output; rounds from the engine's per-step
counts. A request whose ids do not fit the target keeps its request row only (``entropy.unscored``). Resumable;
in place (no ``out``) the run is written to a hidden folder and swapped in by two renames, keeping its ``run_id``.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from entropy_law.decoding.adapter import left_padded
from entropy_law.decoding.loading import model_of
from entropy_law.decoding.observers import distribution_stats
from entropy_law.decoding.replay import teacher_forced_logits
from entropy_law.importers.records import ImportedRequest
from entropy_law.importers.writer import (METADATA_KEY, RECORD_FILE, log_request, read_import, run_block_size,
                                          write_record)
from entropy_law.jobs.plan import check_int
from entropy_law.traces.layout import (LOCK_FILE, RUN_FILE, create_lock, describe_holder, fsync_path, read_lock,
                                      read_run_json, remove_lock)
from entropy_law.traces.recorder import TraceRecorder
from entropy_law.traces.stats import TARGET_STAT_KEYS

DEFAULT_BATCH_TOKENS = 0  # one forward per request (on a CPU padded batches cost more than they save)
DEFAULT_FLUSH_EVERY = 16
DEFAULT_FLUSH_SECONDS = 60.0
STATS_ROWS = 32  # logit rows per statistics call: [32, V] fp32 stays in cache, where a few hundred rows do not
MAX_LOGIT_BYTES = 512 << 20  # most bytes of logits one batched forward may return
METADATA_KEY_ENTROPY = "entropy"
# run.json keys the recorder writes itself (or that describe the import's own writer): not carried over
_NOT_CARRIED = ("format", "format_version", "status", "package_version", "start_time", "end_time", "quarantined",
                "resumed_at", "git_revision")


@dataclass
class EntropyProgress:
    """Where a job stands, after each batch: requests and output tokens scored by this job so far."""

    requests_done: int
    requests_total: int
    tokens_done: int
    seconds: float


@dataclass
class EntropySummary:
    """What a job did: the run written, what was scored now or earlier, throughput, the unscored requests."""

    run_dir: Path
    run_id: str
    requests: int  # imported requests
    scorable: int  # aligned per-step requests whose ids fit the target
    scored_now: int
    scored_before: int  # by an earlier, interrupted job (resumed)
    tokens_now: int
    seconds: float  # forward passes and statistics of this job
    argmax_agree: int  # output tokens that are the target's argmax (greedy output of this target: all)
    unscored: list[dict] = field(default_factory=list)
    note: str = ""
    cpu_seconds: float = 0.0  # CPU time of the same work, every thread of the process (a shared machine's fair clock)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_now / self.seconds if self.seconds > 0 else float("nan")

    def lines_to_print(self) -> list[str]:
        out = [f"target statistics for {self.run_dir} (run {self.run_id})"]
        if self.note:
            out.append(f"  {self.note}")
        out += [f"  requests imported:               {self.requests}",
                f"  scored (aligned per-step):       {self.scorable} ({self.scored_now} now, "
                f"{self.scored_before} by an earlier job)",
                f"  not scored (ids do not fit):     {len(self.unscored)}"]
        for item in self.unscored[:10]:
            out.append(f"    {item['request_id']}: {item['reason']}")
        if self.tokens_now:
            agree = self.argmax_agree / self.tokens_now
            out.append(f"  output tokens scored now:        {self.tokens_now} in {self.seconds:.1f} s "
                       f"({self.tokens_per_s:,.0f} tokens/s; {self.cpu_seconds:.1f} CPU s over "
                       f"{torch.get_num_threads()} torch threads)")
            out.append(f"  target argmax = engine token:    {agree:.1%} of them")
            if agree < 0.9:
                out.append("  (a greedy output of this target agrees everywhere: the engine used another model or "
                           "tokenizer, or sampled; the statistics are this target's along the engine's output)")
        return out


@dataclass
class _Plan:
    run_dir: Path
    stage: Path  # where the new run is written (``out``, or the hidden folder beside the import)
    in_place: bool
    previous: Path  # in place: where the import goes during the swap


def _paths(run_dir: Path, out) -> _Plan:
    run_dir = Path(run_dir)
    if out is not None:
        out = Path(out)
        if out.resolve() == run_dir.resolve():
            raise ValueError(f"--out {out} is the imported run itself; omit --out to write the statistics in place")
        return _Plan(run_dir, out, False, run_dir)
    parent, name = run_dir.parent, run_dir.name
    return _Plan(run_dir, parent / f".{name}.entropy", True, parent / f".{name}.imported")


def _status(path: Path) -> str | None:
    try:
        return read_run_json(path / RUN_FILE).get("status")
    except (FileNotFoundError, ValueError):
        return None


def _finish_swap(plan: _Plan) -> bool:
    """Complete a swap a killed job left half done; True if the run is now the finished one."""
    if not plan.in_place:
        return False
    if not plan.run_dir.exists() and plan.previous.exists() and _status(plan.stage) == "complete":
        os.rename(plan.stage, plan.run_dir)
        fsync_path(plan.run_dir.parent)
    if plan.run_dir.exists() and plan.previous.exists() and _target_stats_of(plan.run_dir) is not None:
        shutil.rmtree(plan.previous)
        return True
    return False


def _target_stats_of(run_dir: Path) -> str | None:
    """The run's ``engine_import.target_stats``, None while they are missing."""
    meta = read_run_json(run_dir / RUN_FILE)
    if METADATA_KEY not in meta:
        raise ValueError(f"{run_dir} was not written by entropy-law import (run.json has no {METADATA_KEY!r}); "
                         "its target statistics were recorded with it")
    value = str(meta[METADATA_KEY].get("target_stats", ""))
    return None if value.startswith("missing") else value


def check_entropy_run(run_dir, *, out=None, break_lock: bool = False, flush_every: int = DEFAULT_FLUSH_EVERY) -> None:
    """Raise what ``compute_target_stats`` would refuse, before a model is loaded (no imported run, statistics
    already there, no aligned request, a foreign output folder, a writer's lock, ``flush_every < 1``)."""
    check_int(flush_every, name="flush_every", option="--flush-every", minimum=1, why="scored requests per shard")
    plan = _paths(run_dir, out)
    if _finish_swap(plan):
        return
    if not plan.run_dir.is_dir() or not (plan.run_dir / RECORD_FILE).is_file():
        raise FileNotFoundError(f"{plan.run_dir}: no imported run ({RECORD_FILE} missing); make one with "
                                "entropy-law import ENGINE FILE --out RUN")
    info = read_run_json(plan.run_dir / RUN_FILE).get(METADATA_KEY, {})
    if not info.get("per_step_aligned"):
        raise ValueError(f"{plan.run_dir}: no request has aligned per-step data (the engine reported aggregates "
                         "only, or every per-step request is flagged): there are no rounds to give statistics to")
    done = _target_stats_of(plan.run_dir)
    if done is not None and plan.in_place:
        raise ValueError(f"{plan.run_dir} already holds target statistics ({done}); nothing to do. Pass --out DIR "
                         "to compute them again with another target into a new run")
    try:
        if plan.in_place:
            TraceRecorder.check_path(plan.run_dir, resume=True, break_lock=break_lock)
        TraceRecorder.check_path(plan.stage, resume=True, break_lock=break_lock)
    except (FileExistsError, NotADirectoryError) as err:  # RunLockedError included
        raise ValueError(f"{err} (entropy-law entropy --break-lock takes over a stale lock)") from err
    if plan.stage.is_dir() and (plan.stage / RUN_FILE).is_file() and METADATA_KEY not in read_run_json(
            plan.stage / RUN_FILE):
        raise ValueError(f"{plan.stage} holds another trace run, not this import's statistics; pick another --out")


def prompt_ids_of(record: ImportedRequest, tokenizer) -> list[int]:
    """The prompt's token ids: the engine's, else the prompt text tokenized (special tokens added) or chat
    messages through the chat template; ``ValueError`` with the reason when none fits the engine's count."""
    if record.prompt_token_ids is not None:
        return [int(t) for t in record.prompt_token_ids]
    if record.prompt is None:
        raise ValueError("neither prompt ids nor prompt text")
    if tokenizer is None:
        raise ValueError("no prompt ids, and the target has no tokenizer to make them from the prompt text")
    if isinstance(record.prompt, str):
        ids = list(tokenizer(record.prompt)["input_ids"])
    else:
        text = tokenizer.apply_chat_template(list(record.prompt), add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) != record.prompt_tokens:
        raise ValueError(f"the target's tokenizer makes {len(ids)} prompt tokens of the prompt, the engine counted "
                         f"{record.prompt_tokens}: another tokenizer or chat template; send the engine's "
                         "prompt_token_ids with each line")
    return ids


def _check_fits(prompt: list[int], output: list[int], vocab: int, context: int | None) -> None:
    if not prompt:
        raise ValueError("empty prompt: the first output token needs at least one prompt token")
    top = max(max(prompt), max(output))
    if top >= vocab:
        raise ValueError(f"token id {top} is beyond the target's vocabulary ({vocab}): another model")
    if min(min(prompt), min(output)) < 0:
        raise ValueError("negative token id")
    length = len(prompt) + len(output) - 1
    if context is not None and length > context:
        raise ValueError(f"prompt + output is {length} tokens, longer than the target's context ({context})")


def plan_batches(lengths: Sequence[int], outputs: Sequence[int], batch_tokens: int, vocab: int) -> list[list[int]]:
    """Indices of requests per forward: sorted by length, packed while the padded batch holds at most
    ``batch_tokens`` tokens and its logits at most ``MAX_LOGIT_BYTES``; ``batch_tokens=0``: one per forward."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    if batch_tokens <= 0:
        return [[i] for i in order]
    batches, current, longest, widest = [], [], 0, 0
    for i in order:
        grow_len, grow_out = max(longest, lengths[i]), max(widest, outputs[i])
        n = len(current) + 1
        if current and (n * grow_len > batch_tokens or n * grow_out * vocab * 4 > MAX_LOGIT_BYTES):
            batches.append(current)
            current, grow_len, grow_out = [], lengths[i], outputs[i]
        current.append(i)
        longest, widest = grow_len, grow_out
    if current:
        batches.append(current)
    return batches


@torch.inference_mode()
def batch_logits(model, batch: Sequence[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """The teacher-forced logit rows of each ``(prompt_ids, output_ids)`` of ``batch``, from one left-padded forward."""
    device = next(model.parameters()).device
    if len(batch) == 1:
        prompt, output = batch[0]
        if device.type == "cpu":
            return [teacher_forced_logits(model, prompt, output)]
        ids = torch.tensor([prompt + output[:-1]], dtype=torch.long, device=device)
        return [model(input_ids=ids, use_cache=False, logits_to_keep=len(output)).logits[0].float()]
    keep = max(len(output) for _, output in batch)
    ids, mask, positions = left_padded([prompt + output[:-1] for prompt, output in batch], 0, device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                   logits_to_keep=keep).logits
    return [logits[row, keep - len(output):].float() for row, (_, output) in enumerate(batch)]


def logit_stats(logits: torch.Tensor) -> dict[str, np.ndarray]:
    """The five target statistics (keys of ``TARGET_STAT_KEYS``) of every row, ``STATS_ROWS`` rows at a time."""
    parts = [distribution_stats(logits[start:start + STATS_ROWS]) for start in range(0, logits.shape[0], STATS_ROWS)]
    return {key: torch.cat([p[key] for p in parts]).float().cpu().numpy() for key in TARGET_STAT_KEYS}


def compute_target_stats(run_dir, target, *, out=None, model_id: str | None = None,
                         batch_tokens: int = DEFAULT_BATCH_TOKENS, flush_every: int = DEFAULT_FLUSH_EVERY,
                         flush_seconds: float = DEFAULT_FLUSH_SECONDS, break_lock: bool = False,
                         on_batch: Callable[[EntropyProgress], None] | None = None) -> EntropySummary:
    """Write the imported run ``run_dir`` with its rounds, tokens and target statistics (in place, or into ``out``),
    a shard every ``flush_every`` scored requests or ``flush_seconds``; ``on_batch`` gets an ``EntropyProgress``."""
    plan = _paths(run_dir, out)
    if _finish_swap(plan):
        meta = read_run_json(plan.run_dir / RUN_FILE)
        imported = meta[METADATA_KEY]
        return EntropySummary(plan.run_dir, meta["run_id"], imported.get("imported", 0),
                              imported.get("rounds_in_tables", 0), 0, imported.get("rounds_in_tables", 0), 0, 0.0, 0,
                              list(meta.get(METADATA_KEY_ENTROPY, {}).get("unscored", [])),
                              note="finished the swap of an earlier job that was stopped during it")
    check_entropy_run(plan.run_dir, out=out, break_lock=break_lock, flush_every=flush_every)
    scorer = _Scorer.of(target, model_id)

    source_lock = None
    if plan.in_place:  # the import is held while its replacement is written: one writer per run
        holder = read_lock(plan.run_dir)
        if holder is not None:  # stale or of another host; check_entropy_run refused it without break_lock
            (plan.run_dir / LOCK_FILE).unlink(missing_ok=True)
            warnings.warn(f"{plan.run_dir}: broke the writer lock of {describe_holder(holder)} (break_lock=True)",
                          UserWarning, stacklevel=2)
        source_lock = create_lock(plan.run_dir)
    try:
        summary = _write_stage(plan, scorer, batch_tokens=batch_tokens, flush_every=flush_every,
                               flush_seconds=flush_seconds, break_lock=break_lock, on_batch=on_batch)
        if plan.in_place:
            os.rename(plan.run_dir, plan.previous)  # the import, with this job's lock, out of the way
            source_lock = None
            os.rename(plan.stage, plan.run_dir)
            fsync_path(plan.run_dir.parent)
            shutil.rmtree(plan.previous)
            summary.run_dir = plan.run_dir
    finally:
        if source_lock is not None:
            remove_lock(plan.run_dir, source_lock)
    return summary


@dataclass(frozen=True)
class _Scorer:
    """The model that scores the tokens, and how the run names it."""

    model: object
    tokenizer: object
    model_id: str
    source: str
    dtype: object
    device: object

    @classmethod
    def of(cls, target, model_id: str | None) -> _Scorer:
        model = model_of(target)
        return cls(model, getattr(target, "tokenizer", None),
                   model_id or getattr(target, "model_id", None) or type(model).__name__,
                   str(getattr(target, "source", "a model given in Python")),
                   next(model.parameters()).dtype, next(model.parameters()).device)


def _write_stage(plan: _Plan, scorer: _Scorer, *, batch_tokens, flush_every, flush_seconds, break_lock,
                 on_batch) -> EntropySummary:
    model = scorer.model
    imported = read_import(plan.run_dir)
    records = imported.requests
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
    context = getattr(getattr(model.config, "get_text_config", lambda: model.config)(), "max_position_embeddings", None)
    aligned, unscored, inputs = _scorable_requests(records, scorer.tokenizer, vocab, int(context) if context else None)
    scorable = {r.request_id for r in aligned}
    meta = _stage_metadata(plan, imported.metadata, scorer, len(scorable), unscored)
    block_size = run_block_size(records)
    flagged = list(meta[METADATA_KEY].get("flagged", []))

    resume = (plan.stage / RUN_FILE).is_file()
    scored_now = tokens_now = agree = 0
    seconds = cpu_seconds = 0.0
    with TraceRecorder(plan.stage, resume=resume, break_lock=break_lock, flush_every_rounds=1 << 30,
                       **meta) as recorder:
        write_record(plan.stage, records, scorable, flagged)  # the record as it stands once the run is complete
        done = recorder.completed_requests
        scored_before = len(scorable & done)
        for record in records:  # request rows only: flagged, aggregate-only, unscored
            if record.request_id not in scorable and record.request_id not in done:
                log_request(recorder, record, stats=None, block_size=block_size)
        recorder.flush()
        todo = [r for r in aligned if r.request_id not in done]
        lengths = [len(inputs[r.request_id][0]) + len(inputs[r.request_id][1]) - 1 for r in todo]
        outputs = [len(inputs[r.request_id][1]) for r in todo]
        pending, last_flush = 0, time.monotonic()
        for batch in plan_batches(lengths, outputs, batch_tokens, vocab):
            requests = [todo[i] for i in batch]
            start, cpu_start = time.perf_counter(), time.process_time()
            with torch.inference_mode():  # no autograd bookkeeping on the forward or the statistics
                logits = batch_logits(model, [inputs[r.request_id] for r in requests])
                stats = []
                for record, rows in zip(requests, logits):
                    stats.append(logit_stats(rows))
                    output = torch.as_tensor(inputs[record.request_id][1], device=rows.device)
                    agree += int((rows.argmax(dim=-1) == output).sum())
            seconds += time.perf_counter() - start
            cpu_seconds += time.process_time() - cpu_start
            for record, values in zip(requests, stats):
                log_request(recorder, record, stats=values, block_size=block_size)
                tokens_now += record.new_tokens
            scored_now += len(requests)
            pending += len(requests)
            if pending >= flush_every or time.monotonic() - last_flush >= flush_seconds:
                recorder.flush()
                pending, last_flush = 0, time.monotonic()
            if on_batch is not None:
                on_batch(EntropyProgress(scored_now, len(todo), tokens_now, seconds))
        run_id = recorder.run_id
    return EntropySummary(plan.stage, run_id, len(records), len(scorable), scored_now, scored_before, tokens_now,
                          seconds, agree, unscored, cpu_seconds=cpu_seconds)


def _scorable_requests(records, tokenizer, vocab: int, context: int | None):
    """(aligned requests whose ids fit the target, the others with the reason, request id -> (prompt, output))."""
    aligned, unscored, inputs = [], [], {}
    for record in records:
        check = record.alignment()
        if check is None or not check.ok:
            continue
        try:
            prompt = prompt_ids_of(record, tokenizer)
            _check_fits(prompt, record.output_token_ids, vocab, context)
        except ValueError as err:
            unscored.append({"request_id": record.request_id, "reason": str(err)})
            continue
        aligned.append(record)
        inputs[record.request_id] = (prompt, [int(t) for t in record.output_token_ids])
    return aligned, unscored, inputs


def _stage_metadata(plan: _Plan, imported: dict, scorer: _Scorer, scorable: int, unscored: list) -> dict:
    """The new run's metadata: the import's, with how the statistics were computed and the unscored requests."""
    meta = {k: v for k, v in imported.items() if k not in _NOT_CARRIED}
    if not plan.in_place:
        meta.pop("run_id", None)
    dtype = str(scorer.dtype).replace("torch.", "")
    stats_source = (f"teacher-forced by entropy-law entropy: target {scorer.model_id} ({scorer.source}), {dtype}, "
                    "one forward pass over prompt + output, statistics in fp32 over the full vocabulary")
    meta[METADATA_KEY] = {**meta[METADATA_KEY], "target_stats": stats_source, "rounds_in_tables": scorable}
    meta[METADATA_KEY_ENTROPY] = {"model_id": scorer.model_id, "source": scorer.source, "dtype": dtype,
                                  "device": scorer.device.type, "unscored": unscored}
    return meta


__all__ = ["DEFAULT_BATCH_TOKENS", "EntropyProgress", "EntropySummary", "batch_logits", "check_entropy_run",
           "compute_target_stats", "logit_stats", "plan_batches", "prompt_ids_of"]
