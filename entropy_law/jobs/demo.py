"""The main job end to end: decode a Spec-Bench subset with every arm, record traces, fit the law, report.

Traces under ``<out>/<run-id>/traces/``, every output checked equal across arms (a mismatch is reported); the report,
``summary.txt`` (the detail) and ``demo.json`` beside them; the answer is ``jobs.report.verdict_lines``.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from entropy_law.jobs.plan import Drafting, Limits, Output, RecordPlan

DEFAULT_ARMS = ("ar", "ngram", "block-ddtree16")
DEFAULT_LIMIT = 5  # the fewest requests a category's verdict rests on (jobs.report.category_verdict)
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class DemoResult:
    """What ``run_demo`` did: where things are, what was left out, and the analysis."""

    run_dir: Path
    trace_dir: Path
    report_path: Path | None
    arms: list
    messages: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)  # (arm, request_id) whose output differs from AR
    timings_s: dict = field(default_factory=dict)
    analysis: object = None
    summary_text: str = ""  # the detail, as written to summary.txt
    answer_lines: list = field(default_factory=list)  # the short answer (``jobs.report.verdict_lines``)


def demo_limits(max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> Limits:
    """The demo's limits: ``max_new_tokens`` (at least 2), a warm-up of 16 tokens, a shard per prompt."""
    return Limits(max_new_tokens, warm_up_tokens=16, min_new_tokens=2)


@dataclass(frozen=True, eq=False)
class DemoPlan:
    """The demo, checked when built and passed whole to ``run_demo``: decode ``tasks`` with each of ``arms``
    (``jobs.arms.ARMS`` names; unavailable block arms dropped with a message) over ``target`` (a ``LoadedTarget``,
    or a causal LM with ``encode(task) -> ids``) within ``limits`` into ``<out>/<run_id>`` (default: UTC time).
    ``seed``, ``n_boot``, ``analysis_options``: of the ``TraceAnalysis``; ``run_metadata``: more run.json keys."""

    tasks: Sequence
    target: object
    limits: Limits = field(default_factory=demo_limits)
    arms: Sequence[str] = DEFAULT_ARMS
    out: str | Path = "runs"
    run_id: str | None = None
    seed: int = 0
    encode: Callable | None = None
    n_boot: int = 30
    report_format: str = "html"
    figure_formats: tuple = ("png", "pdf")
    ngram_options: dict | None = None
    analysis_options: dict | None = None
    run_metadata: dict | None = None

    def __post_init__(self):
        if self.limits.min_new_tokens < 2:  # the demo's rule, checked by Limits itself
            object.__setattr__(self, "limits", replace(self.limits, min_new_tokens=2))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        if not self.tasks:
            raise ValueError("no prompts to decode: check --limit / --categories")


def run_demo(plan: DemoPlan, *, progress: bool = True, log: Callable[[str], None] = print) -> DemoResult:
    """Decode the plan's tasks with each arm, record, analyse and report; ``log``: the arms left out, and why."""
    # lazy: `entropy-law --help` imports this module for its defaults; torch, pandas, matplotlib load only here
    import matplotlib

    matplotlib.use("Agg")
    from entropy_law.jobs.arms import available_arms
    from entropy_law.jobs.record import record_arms
    from entropy_law.jobs.speed import paired_speedups
    from entropy_law.jobs.report import cpu_share, load_note, terminal_summary, verdict_lines, write_report
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.traces.reader import load_traces

    tasks, seed, encode = plan.tasks, plan.seed, plan.encode
    specs, messages = available_arms(plan.arms, plan.target)
    for m in messages:
        log(m)
    if not any(s.drafts for s in specs):
        raise ValueError(f"no drafting arm left to run among {list(plan.arms)}")
    run_id = plan.run_id or _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(plan.out) / run_id
    trace_dir = run_dir / "traces"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"{run_dir} exists and is not empty; pick another --out or run id")
    t_start = time.perf_counter()

    # per prompt every arm in turn, after a short unrecorded warm-up (first forwards allocate and tune kernels)
    record_plan = RecordPlan(
        tasks, specs, plan.target, Output(trace_dir), plan.limits, Drafting(ngram_options=plan.ngram_options),
        encode=None if encode is None else (lambda task, decoder: (list(encode(task)), {})),
        run_metadata=lambda spec: {**(plan.run_metadata or {}), "seed": seed, "replayed": False,
                                   "demo_run_id": run_id, "arm": spec.name})
    recorded = record_arms(record_plan, progress=progress, desc="decode", log=log)
    timings = {"setup_s": recorded.setup_s, "decode_s": recorded.decode_s}
    model_id = recorded[specs[0].name].metadata["model_id"]
    first = recorded[specs[0].name].outputs
    mismatches = [(spec.name, task.request_id) for task in tasks if task.request_id in first for spec in specs
                  if recorded[spec.name].outputs.get(task.request_id) != first[task.request_id]]
    if mismatches:
        messages.append(f"WARNING: {len(mismatches)} outputs differ between arms (lossless decoding broken?): "
                        f"{mismatches[:5]}")

    t_an = time.perf_counter()
    traces = load_traces(trace_dir)
    analysis = TraceAnalysis(traces, n_boot=plan.n_boot, seed=seed, **(plan.analysis_options or {}))
    report = write_report(traces, run_dir, fmt=plan.report_format, analysis=analysis, source=str(trace_dir),
                          progress=progress, figure_formats=plan.figure_formats)
    ar = next((spec.name for spec in specs if not spec.drafts), None)  # paired speedups over it; None without AR
    measured = None if ar is None else paired_speedups(recorded.timings(ar), reference=ar, clock="cpu", seed=seed)
    if measured is not None:  # labelled with the analysis's arm names
        arm_of_run = dict(zip(analysis.runs["run_id"].astype(str), analysis.runs["arm"].astype(str)))
        label = {spec.name: arm_of_run.get(str(recorded[spec.name].run_id), spec.name) for spec in specs}
        measured = measured.assign(arm=measured["arm"].map(label))
    threads = int((plan.run_metadata or {}).get("torch_threads") or 1)
    share = cpu_share(traces, threads)
    loaded = load_note(share, threads)
    answer = verdict_lines(analysis, measured, loaded=loaded)
    timings["cpu_share"] = share
    timings["analysis_s"] = time.perf_counter() - t_an
    timings["total_s"] = time.perf_counter() - t_start
    summary = "\n".join([*answer, "", terminal_summary(analysis, measured, loaded=bool(loaded)), "",
                          *(f"note: {m}" for m in messages),
                          f"decode {timings['decode_s']:.0f} s, analysis + figures + report "
                          f"{timings['analysis_s']:.0f} s", f"report: {report}",
                          f"figures: {run_dir / 'figures'}   traces: {trace_dir}"])
    (run_dir / "summary.txt").write_text(summary + "\n", encoding="utf-8")
    (run_dir / "demo.json").write_text(json.dumps({
        "run_id": run_id, "model_id": model_id, "arms": [s.name for s in specs], "prompts": len(tasks),
        "max_new_tokens": plan.limits.max_new_tokens, "messages": messages, "mismatches": mismatches,
        "timings_s": timings,
        "speedup_vs_ar": None if measured is None else measured.to_dict("records")}, indent=2), encoding="utf-8")
    return DemoResult(run_dir=run_dir, trace_dir=trace_dir, report_path=report, arms=[s.name for s in specs],
                      messages=messages, mismatches=mismatches, timings_s=timings, analysis=analysis,
                      summary_text=summary, answer_lines=answer)
