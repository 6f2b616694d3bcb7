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
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'entropy_law' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
