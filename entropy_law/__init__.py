"""entropy-law: measure and model when speculative drafting pays.

The rooms are listed in ``docs/architecture.md``; none of the analysis rooms imports torch. Each room exports its
own names; this namespace holds the short list a user calls, imported on first use, so ``import entropy_law``
stays cheap and the analysis works without torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_EXPORTS = {
    # decode
    "load_target": "entropy_law.decoding.loading",
    "SpeculativeDecoder": "entropy_law.decoding.decoder",
    "ARDecoder": "entropy_law.decoding.decoder",
    "Drafter": "entropy_law.decoding.interface",
    "DraftProposal": "entropy_law.decoding.interface",
    "Round": "entropy_law.decoding.round",
    "replay_rounds": "entropy_law.decoding.replay",
    "NgramDrafter": "entropy_law.drafters.ngram",
    "BlockDrafter": "entropy_law.drafters.block",
    "load_tasks": "entropy_law.prompts.text",
    # record
    "TraceRecorder": "entropy_law.traces.recorder",
    "RecorderObserver": "entropy_law.decoding.observers",
    "load_traces": "entropy_law.traces.reader",
    # fit
    "fit_law": "entropy_law.law.fit",
    "compare_laws": "entropy_law.law.compare",
    "loco_transfer": "entropy_law.law.transfer",
    "when_drafting_pays": "entropy_law.payoff.cost",
    "workload_breakeven": "entropy_law.payoff.workload",
    "simulate_traces": "entropy_law.analysis.simulate",
    "TraceAnalysis": "entropy_law.analysis",
    # show
    "make_figures": "entropy_law.plots.gallery",
    "write_report": "entropy_law.jobs.report",
    "run_demo": "entropy_law.jobs.demo",
    "DemoPlan": "entropy_law.jobs.demo",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'entropy_law' has no attribute {name!r} (the rooms export more: "
                             "entropy_law.decoding, .drafters, .traces, .law, .payoff, .outofcore, .glance, "
                             ".analysis, .plots, .jobs, .prompts)")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
