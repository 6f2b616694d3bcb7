"""One trace set analysed once, and where that trace set comes from.

Known here, one module each: ``trace_analysis`` (``TraceAnalysis``: a thin facade over the law, payoff and
measured-speedup rooms, cached per arm; what the figures, the report, the demo and the notebooks call),
``tables`` (the results and law tables they show, ``format_interval``), ``simulate`` (``simulate_traces``: traces
drawn from a known law, with toy timings, in the trace format's tables) and ``sample_traces`` (where the
figures, notebooks and reports find traces: the reference traces, else simulated ones written through
``TraceRecorder``). The simulator lives here, beside what uses it: the sample traces the figures and
notebooks fall back to, ``entropy-law law --simulate`` and the tests that recover a known law; the law room
itself never needs it.

Not known here: how a law is fitted (``entropy_law.law``), what drafting costs and when it pays
(``entropy_law.payoff``), the out-of-core path (``entropy_law.outofcore``), GLANCE's law (``entropy_law.glance``),
torch, decoding, drafters, jobs and plotting.
"""

from entropy_law.analysis.sample_traces import resolve_traces, write_simulated_traces
from entropy_law.analysis.simulate import SimulatedTraces, TreeSpec, simulate_traces
from entropy_law.analysis.tables import format_interval
from entropy_law.analysis.trace_analysis import AR_ARM, DEFAULT_FAMILY, TraceAnalysis
from entropy_law.law.view import TraceView, make_view
from entropy_law.payoff.measured import SPEEDUP_BOOT

__all__ = [
    "AR_ARM",
    "DEFAULT_FAMILY",
    "SPEEDUP_BOOT",
    "SimulatedTraces",
    "TraceAnalysis",
    "TraceView",
    "TreeSpec",
    "format_interval",
    "make_view",
    "resolve_traces",
    "simulate_traces",
    "write_simulated_traces",
]
