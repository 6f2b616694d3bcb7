"""entropy-law: measure and model when speculative drafting pays.

Layers (see ``docs/architecture.md``): ``entropy_law.decoding`` (torch; decodes and records),
``entropy_law.traces`` (the trace format: write and read), ``entropy_law.law`` (fits, tests and
predictions; never imports torch), ``entropy_law.plots`` (figures). Public names are imported lazily,
so ``import entropy_law`` stays cheap and the analysis works without loading torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_EXPORTS = {
    "TraceRecorder": "entropy_law.traces.recorder",
    "load_traces": "entropy_law.traces.reader",
    "TraceSet": "entropy_law.traces.reader",
    "TraceValidationError": "entropy_law.traces.validation",
    "FORMAT_VERSION": "entropy_law.traces.schema",
    "load_target": "entropy_law.decoding.loading",
    "DraftProposal": "entropy_law.decoding.interface",
    "Drafter": "entropy_law.decoding.interface",
    "RoundRecord": "entropy_law.decoding.interface",
    # the entropy law (analysis layer; no torch)
    "at_risk_table": "entropy_law.law.atrisk",
    "aggregate_at_risk": "entropy_law.law.atrisk",
    "fit_law": "entropy_law.law.fit",
    "FittedLaw": "entropy_law.law.fit",
    "LAW_FAMILIES": "entropy_law.law.fit",
    "simulate_traces": "entropy_law.law.simulate",
    "compare_laws": "entropy_law.law.compare",
    "block_prediction": "entropy_law.law.transfer",
    "loco_transfer": "entropy_law.law.transfer",
    "universality_test": "entropy_law.law.hypotheses",
    "category_ranking_test": "entropy_law.law.hypotheses",
    "drafter_entropy_test": "entropy_law.law.hypotheses",
    "preregistered_tests": "entropy_law.law.hypotheses",
    "bootstrap_law": "entropy_law.law.bootstrap",
    "fit_cost_model": "entropy_law.law.cost",
    "when_drafting_pays": "entropy_law.law.cost",
    "TargetAdapter": "entropy_law.decoding.adapter",
    "SpeculativeDecoder": "entropy_law.decoding.decoder",
    "ARDecoder": "entropy_law.decoding.decoder",
    "GenerationResult": "entropy_law.decoding.decoder",
    "RecorderObserver": "entropy_law.decoding.observers",
    "NgramDrafter": "entropy_law.drafters.ngram",
    "BlockDrafter": "entropy_law.drafters.block",
    "BlockDrafterConfig": "entropy_law.drafters.block",
    "load_default_drafter": "entropy_law.drafters.block",
    "PrecomputedBlockDrafter": "entropy_law.drafters.training.loop",
    "build_tree": "entropy_law.decoding.tree",
    "ddtree_tree": "entropy_law.decoding.tree",
    "replay_rounds": "entropy_law.decoding.replay",
    "replay_request": "entropy_law.decoding.replay",
    "teacher_forced_target_stats": "entropy_law.decoding.replay",
    "load_tasks": "entropy_law.prompts.text",
    # figures, reports and the main job
    "TraceAnalysis": "entropy_law.law.analysis",
    "make_figures": "entropy_law.plots.gallery",
    "write_report": "entropy_law.jobs.report",
    "results_markdown": "entropy_law.jobs.report",
    "run_demo": "entropy_law.jobs.demo",
    "make_reference_traces": "entropy_law.jobs.reference",
    "Task": "entropy_law.prompts.text",
    # vision-language targets
    "ImagePromptEncoder": "entropy_law.decoding.vlm",
    "ImagePrompt": "entropy_law.decoding.vlm",
    "VLMTargetAdapter": "entropy_law.decoding.vlm",
    "Qwen2VLTargetAdapter": "entropy_law.decoding.vlm",
    "LlavaTargetAdapter": "entropy_law.decoding.vlm",
    "vlm_adapter": "entropy_law.decoding.vlm",
    "generate_with_image": "entropy_law.decoding.vlm",
    "load_vlm_target": "entropy_law.decoding.vlm",
    "ImageRequests": "entropy_law.decoding.vlm",
    "load_image_tasks": "entropy_law.prompts.image",
    "ImageTask": "entropy_law.prompts.image",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'entropy_law' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
