"""Decode prompts with one or more arms and record one trace run per arm (``record_arms``): the loop the demo,
the reference traces and ``entropy-law record`` share.

Run folders are checked before any arm is set up; arms decode each prompt in an order that rotates with the
prompt, each call timed. Recorded, empty or too long prompts are skipped; a failing request raises (resumable),
or with ``keep_going`` is logged and counted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import CostGate, RatioGate, VerifyCost, measure_verify_cost
from entropy_law.decoding.interface import drafter_run_config
from entropy_law.decoding.loading import model_of
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.policy import check_policy, make_policy
from entropy_law.jobs.plan import Drafting, Limits, Output, RecordPlan
from entropy_law.jobs.arms import AR_DRAFTER_ID, AR_TREE_POLICY, ArmSpec, make_drafter
from entropy_law.jobs.speed import Timing, draft_calls, round_cost
from entropy_law.traces.layout import RUN_FILE, read_run_json
from entropy_law.traces.recorder import RunLockLostError, TraceRecorder

logger = logging.getLogger("entropy_law.record")


@dataclass
class ArmResult:
    """What one arm recorded in this call."""

    spec: ArmSpec
    run_dir: Path
    run_id: str
    metadata: dict
    counts: Counter = field(default_factory=Counter)  # recorded, already recorded, skipped, failed
    outputs: dict = field(default_factory=dict)  # request id -> new token ids
    new_tokens: int = 0
    decode_s: float = 0.0  # wall time of the generate calls
    committed_per_round: dict = field(default_factory=lambda: defaultdict(list))  # category -> each request's mean
    timings: list = field(default_factory=list)  # one jobs.speed.Timing per call


@dataclass
class RecordResult:
    """Per arm (in the order given) what it recorded; ``setup_s`` (drafters, decoders, recorders, warm-up) and
    ``decode_s`` (the prompt loop)."""

    arms: dict[str, ArmResult]
    setup_s: float
    decode_s: float

    def __getitem__(self, name: str) -> ArmResult:
        return self.arms[name]

    def timings(self, reference: str) -> pd.DataFrame:
        """Every timed ``generate`` call of every arm, with ``matches_reference`` (its output equals the
        ``reference`` arm's): the input of ``jobs.speed.paired_speedups``."""
        if reference not in self.arms:
            raise ValueError(f"no arm {reference!r} among {list(self.arms)}")
        expected = self.arms[reference].outputs
        rows = [replace(t, matches_reference=self.arms[name].outputs.get(t.request_id)
                                    == expected.get(t.request_id)).__dict__
                for name, arm in self.arms.items() for t in arm.timings]
        return pd.DataFrame(rows)


@dataclass
class _Arm:
    """One arm while it records: its recorder, its decoder and what it has done so far."""

    result: ArmResult
    recorder: TraceRecorder
    decoder: SpeculativeDecoder
    plain: SpeculativeDecoder  # the same decoder without observers (same adapter, drafter and gate)


def chat_prompt(task, decoder: SpeculativeDecoder) -> tuple[list[int], dict]:
    """The default ``encode``: the task's chat messages through the tokenizer's chat template."""
    return decoder.encode_prompt(task.messages()), {}


def prompt_encoder(target, *, chat_template: bool = True, model: str = "the target") -> Callable | None:
    """``None`` (``chat_prompt``) once the tokenizer has a chat template, or with ``chat_template=False``
    ``encode(task) -> ids`` of the prompt text tokenized as is."""
    tokenizer = getattr(target, "tokenizer", None)
    if not chat_template:
        return lambda task: list(tokenizer(task.prompt)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer of {model} has no chat template (a base model); pass --no-chat-template "
                         "to tokenize the prompt text as is")
    return None


def record_arms(plan: RecordPlan, *, progress: bool = True, desc: str = "decode",
                log: Callable[[str], None] = logger.info) -> RecordResult:
    """Decode the plan's tasks with every arm and record one trace run per arm, drafting as ``plan.drafting`` says
    (the cost gate's curve measured once per arm, or reused from the resumed run). ``log``: a line per resumed run."""
    tasks, output, max_new_tokens, keep_going = plan.tasks, plan.output, plan.limits.max_new_tokens, plan.keep_going
    warm_up_tokens = plan.limits.warm_up_tokens
    for spec in plan.arms:  # before any drafter, adapter or cost curve is set up
        check_run_dir(output.run_dir(spec.name), resume=output.resume, overwrite=output.overwrite,
                      break_lock=output.break_lock)
    encode = plan.encode or chat_prompt
    t_setup = time.perf_counter()
    with contextlib.ExitStack() as stack:  # each recorder: finished on success, left resumable on error
        live = [_open_arm(spec, plan, stack, log) for spec in plan.arms]
        todo = [task for task in tasks if any(task.request_id not in arm.recorder.completed_requests for arm in live)]
        for arm in live:
            done = sum(task.request_id in arm.recorder.completed_requests for task in tasks)
            arm.result.counts["already recorded"] = done
            if done:
                log(f"resuming {arm.result.run_dir}: {done} of {len(tasks)} prompts already recorded")
        if warm_up_tokens > 0 and tasks:
            with torch.inference_mode():
                warm_ids, warm_extra = encode(tasks[0], live[0].decoder)
                for arm in live:
                    arm.plain.generate(warm_ids, max_new_tokens=min(warm_up_tokens, max_new_tokens), **warm_extra)
        setup_s = time.perf_counter() - t_setup

        t_decode = time.perf_counter()
        with logging_redirect_tqdm(), torch.inference_mode():
            bar = tqdm(todo, desc=desc, unit="prompt", disable=not progress)
            for index, task in enumerate(bar):
                pending = [arm for arm in live if task.request_id not in arm.recorder.completed_requests]
                turn = index % max(len(pending), 1)  # a rotating order: machine drifts hit every arm alike
                pending = pending[turn:] + pending[:turn]
                prompt = _encoded(task, encode, live[0].decoder, keep_going)
                if prompt is None:
                    for arm in pending:
                        arm.result.counts["skipped"] += 1
                    continue
                prompt_ids, extra = prompt
                for arm in pending:
                    if len(live) > 1:
                        bar.set_postfix_str(f"{task.category} / {arm.result.spec.name}")
                    _decode(arm, task, prompt_ids, extra, max_new_tokens, keep_going)
    return RecordResult(arms={arm.result.spec.name: arm.result for arm in live}, setup_s=setup_s,
                        decode_s=time.perf_counter() - t_decode)


def check_run_dir(run_dir: str | Path, *, resume: bool, overwrite: bool, break_lock: bool = False) -> None:
    """Raise ValueError, saying what to do, if a run cannot be written at ``run_dir`` (cheap: before any model)."""
    try:
        TraceRecorder.check_path(run_dir, resume=resume, overwrite=overwrite, break_lock=break_lock)
    except (FileExistsError, NotADirectoryError) as err:  # RunLockedError included
        raise ValueError(str(err)) from err


def _open_arm(spec: ArmSpec, plan: RecordPlan, stack: contextlib.ExitStack, log: Callable[[str], None]) -> _Arm:
    """Drafter, adapter, verify cost, recorder, then the decoder with the recorder as its observer."""
    target, adapter, output, drafting = plan.target, plan.adapter, plan.output, plan.drafting
    run_dir, gate, policy = output.run_dir(spec.name), drafting.gate, drafting.policy_of(spec)
    run_file = Path(run_dir) / RUN_FILE
    stored = read_run_json(run_file) if output.resume and run_file.is_file() else None
    drafter = make_drafter(spec, target, ngram_options=drafting.ngram_options, checkpoint=drafting.checkpoint,
                           compute_dtype=drafting.drafter_dtype, hybrid_options=drafting.hybrid_options)
    if adapter is None:
        adapter = TargetAdapter(model_of(target), feature_layers=getattr(drafter, "feature_layers", ()))
    verify_cost = None
    if gate == "cost" and spec.drafts:
        if stored is None:
            verify_cost = measure_verify_cost(adapter)
        elif stored.get("verify_cost") is not None:  # the run's own curve: a new measurement would differ
            verify_cost = VerifyCost.from_config(stored["verify_cost"])
            log(f"resuming {run_dir} with the verify-cost curve it stored")
        elif stored.get("gate") == "cost":
            raise ValueError(f"cannot resume {run_dir}: its {RUN_FILE} says gate 'cost' but holds no verify_cost "
                             "curve; record into a new --out (or --overwrite)")
        # else a ratio-gate run: the recorder refuses it below, naming the gate

    if policy is not None and spec.drafts:  # the decoder runs on an adapter, which names no model: check here
        check_policy(policy, drafter, getattr(target, "model_id", None))
        # parameters without a curve are priced with this machine's
        needs_curve = isinstance(policy, dict) and verify_cost is None and policy.get("verify_cost") is None
        round_policy = make_policy(policy, measure_verify_cost(adapter) if needs_curve else verify_cost, drafter)
    else:
        round_policy = CostGate(verify_cost) if verify_cost is not None else RatioGate(drafting.verify_cost_ratio)

    def decoder(observers=()):
        return SpeculativeDecoder(adapter, drafter, tree=spec.tree if spec.drafts else "chain",
                                  budget=spec.budget if spec.drafts else None, policy=round_policy,
                                  observers=observers, tokenizer=getattr(target, "tokenizer", None))

    plain = decoder()  # no observers: its config names the run, and it runs the unrecorded warm-up
    metadata = _arm_metadata(plain, drafter, target, plan.limits.max_new_tokens, spec, plan.run_metadata, gate)
    if policy is not None and spec.drafts:  # the parameters as given: a policy run is its own arm (law.arms)
        metadata["policy"] = policy
    try:
        recorder = stack.enter_context(TraceRecorder(
            run_dir, resume=output.resume, overwrite=output.overwrite, break_lock=output.break_lock,
            flush_every_requests=plan.limits.flush_every,
            absent_means=_absent_means(stored, spec), **metadata))
    except (FileExistsError, NotADirectoryError) as err:  # RunLockedError included
        raise ValueError(str(err)) from err
    result = ArmResult(spec=spec, run_dir=run_dir, run_id=recorder.run_id, metadata=recorder.metadata)
    return _Arm(result=result, recorder=recorder, decoder=decoder([RecorderObserver(recorder)]), plain=plain)


def _absent_means(stored: dict | None, spec: ArmSpec) -> dict:
    """What a missing ``gate`` / ``verify_cost`` means: a drafting run with a curve used the cost gate, one
    without it the ratio gate; an AR run has no gate."""
    cost = stored is not None and stored.get("verify_cost") is not None
    return {"gate": ("cost" if cost else "ratio") if spec.drafts else None, "verify_cost": None}


def _arm_metadata(decoder: SpeculativeDecoder, drafter, target, max_new_tokens: int, spec: ArmSpec,
                  run_metadata, gate: str) -> dict:
    """The run metadata: the decoder's config, the drafter's, the job's keys, then ``gate`` and ``verify_cost``,
    always given so a resume compares them (the recorder omits them where ``_absent_means`` holds)."""
    config = decoder.config
    metadata = {
        "model_id": getattr(target, "model_id", None) or config["model_id"],  # a decoder over an adapter has none
        "drafter_id": config["drafter_id"] if spec.drafts else AR_DRAFTER_ID,
        "drafter_config": drafter_run_config(drafter),
        "tree_policy": config["tree_policy"] if spec.drafts else AR_TREE_POLICY,
        "tree_budget": config["budget"],
        "dtype": config["dtype"],
        "device": str(decoder.adapter.device),
        "max_new_tokens": max_new_tokens,
    }
    extra = run_metadata(spec) if callable(run_metadata) else run_metadata
    metadata.update(extra or {})
    metadata["gate"] = gate if spec.drafts else None
    metadata["verify_cost"] = config["verify_cost"]
    return metadata


def _encoded(task, encode: Callable, decoder: SpeculativeDecoder, keep_going: bool) -> tuple[list, dict] | None:
    """(prompt ids, extra generate arguments), or None for a prompt to skip (logged)."""
    try:
        prompt_ids, extra = encode(task, decoder)
    except Exception as err:
        if not keep_going:
            raise
        logger.warning("skipping %s: cannot tokenize the prompt (%s)", task.request_id, err)
        return None
    prompt_ids = list(prompt_ids)
    max_context = decoder.adapter.max_context
    if not prompt_ids:
        logger.warning("skipping %s: the prompt is empty after tokenization", task.request_id)
        return None
    if max_context is not None and len(prompt_ids) >= max_context:
        logger.warning("skipping %s: prompt has %d tokens, the model's context is %d (no room for a new token)",
                       task.request_id, len(prompt_ids), max_context)
        return None
    return prompt_ids, extra


def _decode(arm: _Arm, task, prompt_ids: list, extra: dict, max_new_tokens: int, keep_going: bool) -> None:
    """Decode one prompt with one arm; a failure raises, or with ``keep_going`` is logged and counted."""
    result = arm.result
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        generated = arm.decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, category=task.category,
                                         request_id=task.request_id, dataset=task.dataset,
                                         question_id=task.question_id, **extra)
    except RunLockLostError:  # the run's, not the request's: stop at once
        raise
    except Exception as err:  # with keep_going, never abort the run for one request
        if not keep_going:
            raise
        logger.error("request %s failed: %s: %s", task.request_id, type(err).__name__, err)
        result.counts["failed"] += 1
        return
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    result.decode_s += wall_s
    rounds, cost = round_cost(generated.rounds, arm.decoder.verify_cost)
    result.timings.append(Timing(arm=result.spec.name, request_id=task.request_id, category=task.category,
                                 new_tokens=generated.new_tokens, cpu_s=cpu_s, wall_s=wall_s, rounds=rounds,
                                 verify_cost=cost, matches_reference=True,
                                 draft_calls=draft_calls(generated.rounds) if result.spec.drafts else 0))
    result.counts["recorded"] += 1
    result.new_tokens += generated.new_tokens
    result.outputs[task.request_id] = generated.token_ids
    result.committed_per_round[task.category].append(generated.mean_committed_per_round)


def record_timed(tasks: Sequence, arm_names: Sequence[str], out: str | Path, target, *, limits: Limits,
                 reference: str = "ar", metadata: Mapping | None = None, break_lock: bool = False,
                 log: Callable[[str], None] = print, drafting: Drafting | None = None) -> RecordResult:
    """A timed trace set: every arm of ``arm_names`` that can run here decodes ``tasks`` into ``out/<arm>``
    (resumable; ``metadata`` added to each run), every timed call appended to ``out/timings.csv``. A law policy
    needs ``gate="cost"``. Set the thread count before calling."""
    from entropy_law.jobs.arms import available_arms

    drafting = drafting or Drafting()
    if drafting.policy is not None and drafting.gate != "cost":
        raise ValueError("a law policy prices trees with the verify-cost curve: record it with gate='cost'")
    out = Path(out)
    specs, messages = available_arms(arm_names)
    for m in messages:
        log(m)
    log(f"{len(tasks)} prompts, arms {[s.name for s in specs]}, {limits.max_new_tokens} new tokens, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}, load average {os.getloadavg()}")
    plan = RecordPlan(tasks, specs, target, Output(out, resume=True, break_lock=break_lock), limits, drafting,
                      run_metadata=lambda spec: {"replayed": False, "arm": spec.name, "cpu_count": os.cpu_count(),
                                                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                                                 **dict(metadata or {})})
    result = record_arms(plan, progress=False)
    timings = result.timings(reference)
    path = out / "timings.csv"
    if path.exists():  # a resumed recording: keep the calls timed before
        timings = pd.concat([pd.read_csv(path), timings], ignore_index=True)
    timings.to_csv(path, index=False)
    log(f"recorded into {out} (decode {result.decode_s:.0f} s wall); load average {os.getloadavg()}")
    return result
