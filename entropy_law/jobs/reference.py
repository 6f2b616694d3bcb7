"""Reference traces (``data/traces/``): one greedy decode per prompt, every other arm replayed offline.

1. Online (timed): each prompt decoded once with the n-gram drafter into ``<out>/ngram/``; lossless decoding makes
   its output the target's greedy output whatever the drafter.
2. AR timing (optional): the first ``ar_limit`` prompts per category decoded by AR into ``<out>/ar/``.
3. Replay (no timings): every other arm simulated on the greedy output (``decoding.replay``) from one teacher-forced
   target pass per prompt; replayed runs record ``replayed: true`` and ``replayed_from``.

Every step resumes an existing run directory; an arm whose block drafter checkpoint is missing is skipped with a
message. Also the workload replays of an arm (``workload_rounds`` and friends) used by ``payoff``."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.loading import model_of
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.replay import (PrecomputedBlockDrafter, replay_request, replay_run_metadata,
                                         teacher_forced_logits)
from entropy_law.decoding.round import DEFAULT_VERIFY_COST_RATIO, RoundRules
from entropy_law.jobs.arms import AR, ArmSpec, arm_spec, available_arms, find_block_checkpoint, make_drafter
from entropy_law.jobs.plan import Drafting, Limits, Output, RecordPlan, check_int
from entropy_law.jobs.record import record_arms
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder

DEFAULT_REPLAY_ARMS = ("ngram-ddtree16", "block", "block-ddtree16")
ONLINE_ARM = "ngram"
SEED = 0  # recorded in the run metadata (greedy decoding draws nothing)


def greedy_outputs(run_dir: Path, traces=None) -> dict:
    """request_id -> (category, question_id, output token ids, stop_reason) of a recorded run (``traces``: loaded)."""
    traces = load_traces(run_dir) if traces is None else traces
    tok = traces.tokens.sort_values(["request_id", "position"])
    req = traces.requests.set_index("request_id")
    out = {}
    for rid, part in tok.groupby("request_id", observed=True, sort=False):
        rid = str(rid)
        out[rid] = (str(req.loc[rid, "category"]), str(req.loc[rid, "question_id"]), part["token_id"].astype(int).tolist(),
                    str(req.loc[rid, "stop_reason"]))
    return out


def recorded_prompts(run_dir: Path, encode: Callable, tasks: dict, traces=None) -> dict:
    """request_id -> prompt token ids of every request of a recorded run, rebuilt by ``encode`` (task -> ids,
    e.g. ``lambda t: decoder.encode_prompt(t.messages())``) from its task (``tasks``: request id -> task) and
    checked against the recorded ``prompt_tokens``. Raises ``ValueError`` naming the run and the request where
    the task is unknown or the length differs (the rebuilt prompt is not the one decoded). ``traces``: loaded."""
    requests = (load_traces(run_dir) if traces is None else traces).requests
    out = {}
    for rid, recorded in zip(requests["request_id"].astype(str), requests["prompt_tokens"].astype(int)):
        if rid not in tasks:
            raise ValueError(f"{run_dir}: request {rid} is not among the tasks: cannot rebuild its prompt")
        ids = list(encode(tasks[rid]))
        if len(ids) != recorded:
            raise ValueError(f"{run_dir}: request {rid}: the re-encoded prompt has {len(ids)} tokens, the trace "
                             f"{recorded}")
        out[rid] = ids
    return out


def replay_drafter(drafter, target, prompt_ids: Sequence[int], output_ids: Sequence[int]):
    """``drafter`` ready to replay on ``prompt_ids`` + ``output_ids`` offline: itself where it reads no target
    features, else its ``PrecomputedBlockDrafter`` stand-in (for a hybrid drafter, around its block drafter)."""
    if callable(getattr(drafter, "with_block", None)):
        return drafter.with_block(replay_drafter(drafter.block, target, prompt_ids, output_ids))
    layers = tuple(getattr(drafter, "feature_layers", ()) or ())
    if not layers:
        return drafter
    with torch.inference_mode(), capture_features(model_of(target), layers) as cap:
        teacher_forced_logits(target, prompt_ids, output_ids)
        return PrecomputedBlockDrafter(drafter, prompt_ids, output_ids, cap.features()[0])


def first_per_category(tasks: Sequence, limit: int) -> list:
    """The first ``limit`` tasks of each category, in the order given."""
    per_cat: dict[str, int] = {}
    chosen = []
    for task in tasks:
        if per_cat.get(task.category, 0) < limit:
            chosen.append(task)
            per_cat[task.category] = per_cat.get(task.category, 0) + 1
    return chosen


def reference_limits(max_new_tokens: int = 256) -> Limits:
    """The reference traces' limits: ``max_new_tokens`` (at least 2), no warm-up, a shard per prompt."""
    return Limits(max_new_tokens, min_new_tokens=2)


@dataclass(frozen=True, eq=False)
class ReferencePlan:
    """The reference trace set, checked when built and passed whole to ``make_reference_traces``.

    ``tasks``: ``Task`` list in decode order; ``target``: a ``LoadedTarget``, or a causal LM with
    ``encode(task) -> ids``; ``replay_arms``: names from ``jobs.arms.ARMS``; ``ar_limit``: prompts per category
    also decoded by AR (0: none); ``verify_cost_ratio``: the drafting gate, online and in every replay;
    ``from_run``: a complete online n-gram run copied to ``<out>/ngram`` as the greedy source instead of
    decoding again; ``break_lock``: take over runs whose writer lock is stale."""

    tasks: Sequence
    target: object
    out: str | Path
    limits: Limits = field(default_factory=reference_limits)
    replay_arms: Sequence[str] = DEFAULT_REPLAY_ARMS
    ar_limit: int = 5
    encode: Callable | None = None
    verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO
    from_run: str | Path | None = None
    break_lock: bool = False

    def __post_init__(self):
        if self.limits.min_new_tokens < 2:  # this job's rule, checked by Limits itself
            object.__setattr__(self, "limits", replace(self.limits, min_new_tokens=2))
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if not self.tasks:
            raise ValueError("no prompts: check the limit / categories")
        check_int(self.ar_limit, name="ar_limit", option="--ar-limit", minimum=0)


def make_reference_traces(plan: ReferencePlan, *, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Write (or continue) the reference trace set of ``plan`` (``ReferencePlan``); returns {arm: run
    directory}. ``progress``: progress bars; ``log``: the arms left out, and why; a run adopted."""
    tasks, target, out, encode = plan.tasks, plan.target, plan.out, plan.encode
    verify_cost_ratio = plan.verify_cost_ratio

    def timed(tasks, arm):  # a timed online recording of one arm (jobs.record.record_arms)
        return record_arms(RecordPlan(
            tasks, [arm_spec(arm)], target, Output(out, resume=True, break_lock=plan.break_lock), plan.limits,
            Drafting(verify_cost_ratio=verify_cost_ratio),
            encode=None if encode is None else (lambda task, decoder: (list(encode(task)), {})),
            run_metadata=lambda spec: {"replayed": False, "arm": spec.name, "seed": SEED,
                                       "verify_cost_ratio": verify_cost_ratio}),
            progress=progress, desc=f"decode ({arm})", log=log)

    runs = {}
    if plan.from_run is not None:
        online_run_id = _adopt_online_run(Path(plan.from_run), out / ONLINE_ARM, tasks, log)
    else:  # 1. online n-gram decode (timed)
        online_run_id = timed(tasks, ONLINE_ARM)[ONLINE_ARM].run_id
    runs[ONLINE_ARM] = out / ONLINE_ARM

    if plan.ar_limit > 0:  # 2. AR timing on the first ar_limit prompts per category (timed)
        timed(first_per_category(tasks, plan.ar_limit), AR)
        runs[AR] = out / AR

    # 3. offline replay of the other arms from the recorded greedy outputs
    specs, messages = available_arms(plan.replay_arms, target)
    for m in messages:
        log(m)
    if specs:
        _replay(specs, plan, online_run_id, progress)
        runs.update({spec.name: out / spec.name for spec in specs})
    return runs


def _replay(specs: Sequence[ArmSpec], plan: ReferencePlan, online_run_id: str, progress: bool) -> None:
    """Replay ``specs`` on the greedy outputs of ``<out>/ngram`` into ``<out>/<arm>`` (resumable)."""
    tasks, target, out, encode = plan.tasks, plan.target, plan.out, plan.encode
    max_new_tokens, verify_cost_ratio, break_lock = plan.limits.max_new_tokens, plan.verify_cost_ratio, plan.break_lock
    model = model_of(target)
    plain = SpeculativeDecoder(target)  # the target's EOS ids, context, prompt encoding, dtype and device
    config = plain.config
    eos, max_context = config["eos_token_ids"], plain.adapter.max_context
    common = dict(model_id=config["model_id"], dtype=config["dtype"], device=str(plain.adapter.device),
                  max_new_tokens=max_new_tokens, seed=SEED, verify_cost_ratio=verify_cost_ratio)

    def ids_of(task):
        return list(encode(task)) if encode is not None else plain.encode_prompt(task.messages())

    outputs = greedy_outputs(out / ONLINE_ARM)
    by_id = {t.request_id: t for t in tasks}
    arms = []
    stack = contextlib.ExitStack()  # each recorder: finished on success, left "running" (resumable) on error
    for spec in specs:
        drafter = make_drafter(spec, target)
        meta = replay_run_metadata(drafter, spec.tree, spec.budget, replayed_from=online_run_id, arm=spec.name,
                                   **common)
        rec = stack.enter_context(TraceRecorder(out / spec.name, resume=True, break_lock=break_lock,
                                                flush_every_requests=1, **meta))
        arms.append((spec, drafter, rec))
    with stack:
        todo = [rid for rid in outputs if rid in by_id and outputs[rid][3] != "error"
                and any(rid not in rec.completed_requests for _, _, rec in arms)]
        with torch.inference_mode():
            for rid in tqdm(todo, desc="replay", unit="prompt", disable=not progress):
                task = by_id[rid]
                category, question_id, output_ids, _ = outputs[rid]
                prompt_ids = ids_of(task)
                block_layers = next((d.feature_layers for s, d, _ in arms if s.drafter == "block"), ())
                features = None
                if block_layers:
                    with capture_features(model, block_layers) as cap:
                        logits = teacher_forced_logits(target, prompt_ids, output_ids)
                        features = cap.features()[0]
                else:
                    logits = teacher_forced_logits(target, prompt_ids, output_ids)
                for spec, drafter, rec in arms:
                    if rid in rec.completed_requests:
                        continue
                    source = drafter
                    if spec.drafter == "block":
                        source = PrecomputedBlockDrafter(drafter, prompt_ids, output_ids, features)
                    replay_request(target, prompt_ids, output_ids, source, spec.tree, spec.budget,
                                   observers=[RecorderObserver(rec)], request_id=rid, category=category,
                                   dataset=task.dataset, question_id=question_id, logits=logits,
                                   eos_token_ids=eos, max_new_tokens=max_new_tokens, max_context=max_context,
                                   verify_cost_ratio=verify_cost_ratio)


def _adopt_online_run(source: Path, dest: Path, tasks: Sequence, log: Callable[[str], None]) -> str:
    """Copy a complete online n-gram run to ``dest`` (once) and return its run id; refuses an incomplete,
    replayed or non-n-gram run. Its prompts not among ``tasks`` are copied but not replayed."""
    if not (dest / "run.json").exists():
        meta = json.loads((source / "run.json").read_text()) if (source / "run.json").is_file() else None
        if meta is None:
            raise FileNotFoundError(f"--from-run {source}: no run.json there (give a run directory)")
        if meta.get("status") != "complete":
            raise ValueError(f"--from-run {source}: the run is not complete; finish it first (--resume)")
        if meta.get("replayed") or meta.get("drafter_id") != "ngram":
            raise ValueError(f"--from-run {source}: need a run decoded online with the n-gram drafter, got "
                             f"drafter {meta.get('drafter_id')!r} (replayed: {bool(meta.get('replayed'))})")
        known = {t.request_id for t in tasks}
        extra = sorted(set(load_traces(source).requests.request_id.astype(str)) - known)
        if extra:  # kept in the online run, not replayed
            log(f"online ngram: {len(extra)} prompts of {source} are not among the tasks and are not replayed")
        shutil.copytree(source, dest)
        log(f"online ngram: adopted {source} (run {meta['run_id']}) as the greedy source")
    return json.loads((dest / "run.json").read_text())["run_id"]


def _run_prompts(run_dir: str | Path, target, tasks):
    """A recorded run's (run.json, a plain decoder of the target, prompt ids and greedy outputs by request id);
    the prompts rebuilt from ``tasks`` or the task file its run.json names (``recorded_prompts``)."""
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).is_file():
        raise ValueError(f"{run_dir} is not a trace run (no {RUN_FILE}): give one run of the workload")
    meta = read_run_json(run_dir / RUN_FILE)
    source = tasks if tasks is not None else meta.get("tasks")
    if not source:
        raise ValueError(f"{run_dir}: run.json names no task file; pass the prompts it decoded (tasks=)")
    plain = SpeculativeDecoder(target)
    raw = meta.get("chat_template") is False
    by_id, traces = {t.request_id: t for t in load_tasks(source)}, load_traces(run_dir)  # read once for both
    prompts = recorded_prompts(run_dir, (lambda t: plain.encode_prompt(t.prompt, raw_prompt=True)) if raw
                               else (lambda t: plain.encode_prompt(t.messages())), by_id, traces)
    return meta, plain, prompts, greedy_outputs(run_dir, traces)


def context_matches(run_dirs: str | Path | Sequence[str | Path], target, *, tasks: str | Path | None = None,
                    max_length: int | None = None) -> pd.DataFrame:
    """One row per (``run_id``, ``request_id``, ``position``) of one or several recorded runs with
    ``context_match``: ``traces.stats.context_match_length`` of the prompt and output before that position, up to
    ``max_length`` (default ``CONTEXT_MATCH_MAX``); for ``fit_policy(context_match=)``. ``tasks``: the prompts'
    task file where run.json names none."""
    from entropy_law.traces.stats import CONTEXT_MATCH_MAX, context_matches_of_output

    max_length = CONTEXT_MATCH_MAX if max_length is None else int(max_length)
    frames = []
    for run_dir in [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs):
        meta, _, prompts, outputs = _run_prompts(run_dir, target, tasks)
        for rid in sorted(outputs):
            output = outputs[rid][2]
            frames.append(pd.DataFrame({"run_id": str(meta["run_id"]), "request_id": rid,
                                        "position": range(len(output)),
                                        "context_match": context_matches_of_output(prompts[rid], output,
                                                                                   max_length)}))
    if not frames:
        raise ValueError(f"{run_dirs}: no request to compute the context's copyability of")
    return pd.concat(frames, ignore_index=True)


def ensure_context_matches(traces, model: str | None = None, *, tasks: str | Path | None = None,
                           rebuild: bool = False, target=None):
    """``(traces, rebuilt_with)``: ``traces`` as recorded (``rebuilt_with`` None) where every position holds
    ``context_match`` and not ``rebuild``, else with it filled from the prompts (``attach_context_matches``) by
    ``target`` or ``runs_target(model)`` (``rebuilt_with``: its model id)."""
    tokens = traces.tokens
    if not rebuild and len(tokens) and "context_match" in tokens and tokens["context_match"].notna().all():
        return traces, None
    target = target if target is not None else runs_target(traces.runs, model)
    return attach_context_matches(traces, target, tasks=tasks), target.model_id


def runs_target(runs: pd.DataFrame, model: str | None = None):
    """The target that decoded ``runs`` (``TraceSet.runs``), loaded: ``model`` if given, else their one
    ``model_id``; ``ValueError`` naming ``--model`` where they record none or several or it does not load."""
    from entropy_law.decoding.loading import load_target

    models = sorted(runs["model_id"].astype(str).unique()) if "model_id" in runs else []
    name = model or (models[0] if len(models) == 1 else None)
    if name is None:
        raise ValueError(f"the runs name targets {models or 'none'}: pass --model, the target that decoded them")
    try:
        return load_target(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load the target {name!r} that decoded the runs ({err}); pass --model (an embedded "
                         "name, a local folder or a .gguf file)") from err


def attach_context_matches(traces, target, *, tasks: str | Path | None = None):
    """``traces`` with the tokens column ``context_match`` filled for every run from its prompts (rebuilt with
    ``target``'s tokenizer) and its recorded output (``context_matches``)."""
    from entropy_law.traces.stats import CONTEXT_MATCH_MAX

    paths = list(traces.runs["path"])
    if not paths:
        raise ValueError("no runs to attach the context's copyability to")
    return traces.with_context_match(context_matches(paths, target, tasks=tasks, max_length=CONTEXT_MATCH_MAX))


def _arm_checkpoint(recorded_sha256: str | None, checkpoint: str | Path | None) -> str | Path | None:
    """The block drafter checkpoint to replay an arm with: ``checkpoint`` if given or the arm recorded no
    SHA-256, else the one under ``data/drafters/`` with the recorded SHA-256 (``ValueError`` if none)."""
    if not recorded_sha256 or checkpoint is not None:
        return checkpoint
    found = find_block_checkpoint(recorded_sha256)
    if found is None:
        raise ValueError(f"the arm was recorded with the block drafter checkpoint sha256:{recorded_sha256[:12]}, which "
                         "is not under data/drafters/: pass it (checkpoint=; entropy-law predict --checkpoint FILE)")
    return found


def workload_inputs(workload_dir: str | Path, arm_meta: dict, target, tasks, checkpoint):
    """What replaying an arm over a workload run needs: (the workload's run.json, the arm's drafter, a plain
    decoder of the target, prompt ids and greedy outputs by request id)."""
    from entropy_law.drafters.hybrid import HybridDrafter
    from entropy_law.drafters.ngram import NgramDrafter

    meta, plain, prompts, outputs = _run_prompts(workload_dir, target, tasks)
    drafter_id = arm_meta.get("drafter_id")
    if drafter_id in (None, "none", "ar"):
        raise ValueError("arm_meta is an AR run's: give the run.json of a drafting arm")
    config = arm_meta.get("drafter_config") or {}
    if drafter_id == "ngram":
        drafter = NgramDrafter(**config)
    elif drafter_id == "hybrid":  # prompt lookup and the block drafter behind one drafter, as the arm ran them
        block = _arm_block_drafter(config.get("block") or {}, None, target, checkpoint)
        drafter = HybridDrafter(NgramDrafter(**(config.get("ngram") or {})), block,
                                **{k: config[k] for k in ("ngram_weight", "skip_block_at", "top_k") if k in config})
    else:
        drafter = _arm_block_drafter(config, drafter_id, target, checkpoint)
    return meta, drafter, plain, prompts, outputs


def _arm_block_drafter(config: dict, drafter_id: str | None, target, checkpoint):
    """The block drafter an arm ran (``config``: its ``drafter_config``; ``drafter_id``: the recorded id, None
    for a hybrid's), from ``checkpoint`` or the recorded SHA-256's, in the dtype it ran in (default fp32)."""
    dtype = config.get("compute_dtype", "float32")
    recorded = config.get("checkpoint_sha256")
    checkpoint = _arm_checkpoint(recorded, checkpoint)
    drafter = make_drafter(arm_spec("block"), target, checkpoint=checkpoint, compute_dtype=dtype)
    loaded = drafter.provenance.get("checkpoint_sha256")  # BlockDrafter.load hashed the file it read
    if recorded and loaded != recorded:
        raise ValueError(f"the arm was recorded with the block drafter checkpoint sha256:{recorded[:12]}, "
                         f"{checkpoint} is sha256:{loaded[:12]}: pass the checkpoint the arm ran with")
    if drafter_id is not None and drafter.drafter_id != drafter_id:
        raise ValueError(f"the arm was recorded with {drafter_id}, the block drafter loaded is {drafter.drafter_id}; "
                         "pass the arm's checkpoint (checkpoint=; entropy-law predict --checkpoint FILE)")
    return drafter


def decoded_requests(outputs: dict, requests: Collection[str] | None = None):
    """``(request_id, category, greedy output)`` of each request that decoded a token after the prefill, in
    request order; ``requests``: only these ids (None: all; an unknown one raises ``ValueError``)."""
    if requests is not None:
        unknown = sorted(set(map(str, requests)) - set(map(str, outputs)))
        if unknown:
            raise ValueError(f"the workload run holds no request {', '.join(unknown[:5])}"
                             f"{' ...' if len(unknown) > 5 else ''}: give request ids of its traces")
        keep = set(map(str, requests))
        outputs = {rid: value for rid, value in outputs.items() if str(rid) in keep}
    for rid in sorted(outputs):
        category, _, output, _ = outputs[rid]
        if len(output) >= 2:
            yield rid, category, output


def workload_proposals(workload_dir: str | Path, arm_meta: dict, target, *, tasks: str | Path | None = None,
                       checkpoint: str | Path | None = None) -> pd.DataFrame:
    """An arm's drafter replayed at every output position of each request of a workload run (any run: greedy
    output does not depend on the drafter): ``decoding.replay.replay_proposals`` rows keyed by ``run_id`` and
    ``request_id``, for ``predict_workload(proposals=)``.

    ``arm_meta``: the arm's ``run.json``; its drafter is rebuilt from it (block drafter: ``checkpoint``, default
    the one it recorded). Its ratio gate is applied; a cost gate or law policy is not (every proposal kept);
    ``attrs["gate"]`` says which. Prompts are rebuilt from ``tasks`` (default the run's) and checked against the
    recorded lengths (``recorded_prompts``)."""
    from entropy_law.decoding.replay import replay_proposals, run_gate_threshold

    meta, stops, replays = _replays(workload_dir, arm_meta, target, tasks, checkpoint)
    threshold = run_gate_threshold(arm_meta)
    gate = (f"the arm's ratio gate (drafts where the expected accepted drafts >= {threshold:g})" if threshold is not None
            else "no gate: the arm's cost gate or policy is not reproduced by a replay; every proposal kept")
    frames = []
    for rid, _, prompt, output, drafter in replays:
        frame = replay_proposals(prompt, output, drafter, arm_meta.get("tree_policy", "chain"),
                                 arm_meta.get("tree_budget"), **stops,
                                 min_expected_accepted=threshold if threshold is not None else 0.0)
        frames.append(frame.assign(run_id=str(meta["run_id"]), request_id=rid))
    if not frames:
        raise _nothing_to_replay(workload_dir)
    out = pd.concat(frames, ignore_index=True)
    out.attrs["gate"] = gate
    return out


GATE_KEYS = ("gate", "verify_cost", "min_expected_accepted", "verify_cost_ratio")  # what arm_round_options reads


def with_gate(arm_meta: dict, gate_meta: dict) -> dict:
    """``arm_meta`` with the gate keys (``GATE_KEYS``) of ``gate_meta`` in place of its own (unset ones left
    out: the replay's defaults); checked by ``arm_round_options``."""
    out = {k: v for k, v in arm_meta.items() if k not in GATE_KEYS}
    out.update({k: gate_meta[k] for k in GATE_KEYS if gate_meta.get(k) is not None})
    arm_round_options(out)
    return out


def arm_round_options(arm_meta: dict) -> tuple[dict, str]:
    """``replay_rounds`` options reproducing an arm's ratio gate, cost gate (its stored curve) or law policy
    from its ``run.json``, and a phrase naming it."""
    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.decoding.replay import run_gate_threshold

    options: dict = {}
    stored = arm_meta.get("verify_cost")
    if stored is not None:
        if not isinstance(stored, dict):
            raise ValueError(f"the arm's run.json holds verify_cost {stored!r}, not a measured curve: its cost gate "
                             "cannot be replayed")
        options["verify_cost"] = VerifyCost.from_config(stored)
    elif arm_meta.get("gate") == "cost":
        raise ValueError("the arm's run.json says gate 'cost' but holds no verify_cost curve: its gate cannot be "
                         "replayed")
    if isinstance(arm_meta.get("policy"), dict):
        options["policy"] = arm_meta["policy"]
        return options, "the arm's law policy (its stored parameters and cost curve)"
    threshold = run_gate_threshold(arm_meta)
    if threshold is not None:
        options["min_expected_accepted"] = threshold
        return options, f"the arm's ratio gate (drafts where the expected accepted drafts >= {threshold:g})"
    if arm_meta.get("min_expected_accepted") is not None:
        options["min_expected_accepted"] = float(arm_meta["min_expected_accepted"])
    return options, "the arm's cost gate (its stored verify-cost curve)"


def _replayed_requests(workload_dir, arm_meta: dict, target, tasks, checkpoint, requests=None):
    """(the gate or policy replayed, an iterator of (run_id, request_id, category, ``ReplayResult``)): the arm's
    rounds replayed over each request's greedy output; run and drafter are checked before the first replay."""
    from entropy_law.decoding.replay import replay_rounds

    meta, stops, replays = _replays(workload_dir, arm_meta, target, tasks, checkpoint, requests)
    options, gate = arm_round_options(arm_meta)
    entropies = _recorded_entropies(workload_dir) if "policy" in options else {}
    return gate, ((str(meta["run_id"]), rid, category,
                   replay_rounds(prompt, output, drafter, arm_meta.get("tree_policy", "chain"),
                                 arm_meta.get("tree_budget"), entropies=entropies.get(str(rid)), **stops, **options))
                  for rid, category, prompt, output, drafter in replays)


def _replays(workload_dir, arm_meta: dict, target, tasks, checkpoint, requests=None):
    """(the workload's run.json, its stopping rules as the replay functions take them, an iterator of
    (request_id, category, prompt ids, greedy output, the arm's drafter ready to replay them))."""
    meta, drafter, plain, prompts, outputs = workload_inputs(workload_dir, arm_meta, target, tasks, checkpoint)
    stops = dict(eos_token_ids=plain.config["eos_token_ids"], max_new_tokens=meta.get("max_new_tokens"),
                 max_context=plain.adapter.max_context)
    return meta, stops, ((rid, category, prompts[rid], output, replay_drafter(drafter, target, prompts[rid], output))
                         for rid, category, output in decoded_requests(outputs, requests))


def _recorded_entropies(run_dir) -> dict:
    """request_id -> the recorded target entropy at each output position (what a law policy reads)."""
    tokens = load_traces(run_dir).tokens.sort_values(["request_id", "position"])
    return {str(rid): g["target_entropy_nats"].to_numpy(float) for rid, g in tokens.groupby("request_id")}


def _nothing_to_replay(workload_dir) -> ValueError:
    return ValueError(f"{workload_dir}: no request decoded a token after the prefill: nothing to replay")


def workload_oracle_rounds(workload_dir: str | Path, arm_meta: dict, target, *, verify_cost, draft_cost: float = 0.0,
                           budgets: Sequence[int] = (0, 1, 2, 4, 8, 16), tasks: str | Path | None = None,
                           checkpoint: str | Path | None = None) -> pd.DataFrame:
    """The hindsight oracle of an arm's drafter over a workload run (``decoding.replay.oracle_rounds``): per
    round the budget of ``budgets`` (0: a plain step) committing most tokens per modelled cost ``c(N + 1)`` (+
    ``draft_cost`` when it drafts) under ``verify_cost``. A ceiling for any per-round policy, not a decoder. Rows
    as ``workload_rounds`` (a round verifying nothing counts as skipped); arguments as ``workload_rounds``."""
    from entropy_law.decoding.replay import oracle_rounds

    meta, stops, replays = _replays(workload_dir, arm_meta, target, tasks, checkpoint)
    rows = []
    for rid, category, prompt, output, drafter in replays:
        result = oracle_rounds(prompt, output, drafter, budgets=budgets, verify_cost=verify_cost, draft_cost=draft_cost,
                               tree=arm_meta.get("tree_policy", "chain"), **stops)
        rows += [dict(run_id=str(meta["run_id"]), request_id=rid, category=category, round_index=i, committed=c,
                      tree_nodes=n, accepted=a, policy_drafted=n > 0)  # decode rounds are 1.. (0: the prefill)
                 for i, (n, c, a) in enumerate(zip(result.budgets, result.committed, result.accepted), start=1)]
    return _request_counts(rows, workload_dir)


# workload_round_outcomes' columns of what a law policy reads before drafting, and its rate then
READ_BEFORE_DRAFT = ("entropy", "window_entropy", "context_match", "law_rate")


def workload_round_outcomes(workload_dir: str | Path, arm_meta: dict, target, *,
                            budgets: Sequence[int] = (0, 1, 2, 4, 8, 16), policy: dict | None = None,
                            verify_cost=None, tasks: str | Path | None = None,
                            checkpoint: str | Path | None = None,
                            requests: Collection[str] | None = None) -> pd.DataFrame:
    """What a round of each budget would do from every output position of each request of a workload run
    (``decoding.replay.round_outcomes``), keyed by ``run_id``, ``request_id`` and ``category``. With ``policy``
    (law policy parameters) each start also gets what it reads before drafting (``READ_BEFORE_DRAFT``, ``law_rate``
    uncalibrated) under ``verify_cost`` (default: the parameters' curve). ``requests``: only these request ids
    (None: all). Other arguments as ``workload_rounds``."""
    from entropy_law.decoding.policy import LawPolicy
    from entropy_law.decoding.replay import round_outcomes

    meta, stops, replays = _replays(workload_dir, arm_meta, target, tasks, checkpoint, requests)
    law = None if policy is None else LawPolicy(policy, verify_cost)
    rules = RoundRules.make("chain", None, drafting=False, max_context=stops["max_context"])
    entropies = {} if law is None else _recorded_entropies(workload_dir)
    frames = []
    for rid, category, prompt, output, drafter in replays:
        table = round_outcomes(prompt, output, drafter, budgets=budgets, tree=arm_meta.get("tree_policy", "chain"),
                               **stops)
        if law is not None:
            max_new = int(meta.get("max_new_tokens") or len(output))
            if str(rid) not in entropies:
                raise ValueError(f"{workload_dir}: request {rid} has no recorded target entropies for the policy")
            inputs = []
            for start in sorted(set(table["start_position"].tolist())):  # the decision before drafting, no history
                decision = law.before_draft(entropies[str(rid)], start,
                                            rules.usable_depth(len(prompt) + start - 1, max_new - start),
                                            context=prompt + output[:start])
                inputs.append({"start_position": start, **{k: decision[k] for k in READ_BEFORE_DRAFT if k in decision}})
            table = table.merge(pd.DataFrame(inputs), on="start_position")
        frames.append(table.assign(run_id=str(meta["run_id"]), request_id=rid, category=category))
    if not frames:
        raise _nothing_to_replay(workload_dir)
    return pd.concat(frames, ignore_index=True)


def _request_counts(rows: list[dict] | pd.DataFrame, workload_dir) -> pd.DataFrame:
    """Per request, ``count_rounds`` of replayed rounds (``rows``: dicts or a frame) with its category."""
    from entropy_law.payoff.workload import ROUND_COUNT_COLUMNS, count_rounds

    if len(rows) == 0:
        raise _nothing_to_replay(workload_dir)
    rounds = pd.DataFrame(rows)
    categories = rounds[["run_id", "request_id", "category"]].drop_duplicates()
    out = count_rounds(rounds).merge(categories, on=["run_id", "request_id"])
    return out[[*ROUND_COUNT_COLUMNS, "accepted", "skipped_rounds"]]


ROUND_FIELDS = ("round_index", "start_position", "tree_nodes", "tree_depth", "accepted", "committed")


def round_proposals(run_dir: str | Path, target, *, tasks: str | Path | None = None,
                    checkpoint: str | Path | None = None) -> pd.DataFrame:
    """The drafter's proposal of every drafting round of a recorded run, rebuilt offline by replaying the run on
    its own outputs (each round checked equal to the recorded one on ``ROUND_FIELDS``, else ``ValueError``):
    ``ReplayResult.round_proposals`` rows per (``run_id``, ``request_id``, ``round_index``, ``depth``) with
    ``top1_prob``, also at depths past the rejection. For ``glance.law_round_expectations(drafts=)``."""
    from entropy_law.traces.layout import RUN_FILE, read_run_json

    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).is_file():
        raise ValueError(f"{run_dir} is not a trace run (no {RUN_FILE}): give one drafting run")
    _, replayed = _replayed_requests(run_dir, read_run_json(run_dir / RUN_FILE), target, tasks, checkpoint)
    recorded = load_traces(run_dir).rounds
    by_request = {str(rid): part.sort_values("round_index")
                  for rid, part in recorded.groupby("request_id", observed=True)}
    frames = []
    for run_id, rid, _, result in replayed:
        mine = [tuple(int(getattr(r, f)) for f in ROUND_FIELDS) for r in result.rounds]
        part = by_request.get(rid)
        theirs = [] if part is None else [tuple(int(v) for v in row) for row in
                                          part[list(ROUND_FIELDS)].itertuples(index=False, name=None)]
        if mine != theirs:
            first = next(i for i, (a, b) in enumerate(zip(mine + [None], theirs + [None])) if a != b)
            raise ValueError(f"{run_dir}: request {rid}: replayed round {first} differs from the recorded one "
                             f"({mine[first] if first < len(mine) else None} against "
                             f"{theirs[first] if first < len(theirs) else None}; fields {list(ROUND_FIELDS)}): "
                             "not the drafter, tree or gate that recorded the run")
        frames.append(result.round_proposals().assign(run_id=run_id, request_id=rid))
    if not frames:
        raise _nothing_to_replay(run_dir)
    out = pd.concat(frames, ignore_index=True)
    return out[["run_id", "request_id", "round_index", "start_position", "proposal_depth", "depth", "top1_prob"]]


def workload_rounds(workload_dir: str | Path, arm_meta: dict, target, *, tasks: str | Path | None = None,
                    checkpoint: str | Path | None = None) -> pd.DataFrame:
    """The rounds an arm would decode on a workload run, replayed exactly (greedy output does not depend on the
    drafter, and drafters propose from the context alone; ``tests/test_replay_online.py``) under its tree, budget,
    gate or policy. One row per request (``ROUND_COUNT_COLUMNS``, ``accepted``, ``skipped_rounds``) for
    ``price_rounds``; ``attrs["gate"]`` names the gate or policy. Arguments as ``workload_proposals``."""
    rounds = workload_round_records(workload_dir, arm_meta, target, tasks=tasks, checkpoint=checkpoint)
    out = _request_counts(rounds, workload_dir)
    out.attrs["gate"] = rounds.attrs["gate"]
    return out


def workload_round_records(workload_dir: str | Path, arm_meta: dict, target, *, tasks: str | Path | None = None,
                           checkpoint: str | Path | None = None,
                           requests: Collection[str] | None = None) -> pd.DataFrame:
    """``workload_rounds``' replayed rounds one row each (``round_index`` 0: the prefill), with ``committed``,
    ``tree_nodes``, ``accepted``, ``policy_drafted`` and ``policy_route`` (the hybrid's choice; null without a
    policy). ``requests``: as ``workload_round_outcomes``; other arguments as ``workload_rounds``."""
    gate, replayed = _replayed_requests(workload_dir, arm_meta, target, tasks, checkpoint, requests)
    out = pd.DataFrame([dict(run_id=run_id, request_id=rid, category=category, round_index=r.round_index,
                             committed=r.committed, tree_nodes=r.tree_nodes, accepted=r.accepted,
                             policy_drafted=None if r.policy is None else bool(r.policy.get("draft")),
                             policy_route=None if r.policy is None else r.policy.get("route"))
                        for run_id, rid, category, result in replayed for r in result.rounds])
    if out.empty:
        raise _nothing_to_replay(workload_dir)
    out.attrs["gate"] = gate
    return out
