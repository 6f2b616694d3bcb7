"""One trace set analysed once, and where that trace set comes from: ``trace_analysis`` (``TraceAnalysis``, a thin
facade over the law, payoff and measured-speedup rooms), ``tables`` (the results and law tables), ``simulate``
(traces drawn from a known law, beside what uses them) and ``sample_traces`` (the reference traces, else simulated
ones written through ``TraceRecorder``). No torch, decoding or plotting.
"""

from entropy_law.analysis.sample_traces import resolve_traces, write_simulated_traces
from entropy_law.analysis.simulate import SimulatedTraces, TreeSpec, simulate_traces
from entropy_law.analysis.tables import format_interval
from entropy_law.analysis.trace_analysis import AR_ARM, DEFAULT_FAMILY, TraceAnalysis
from entropy_law.law.view import TraceView, make_view
from entropy_law.payoff.measured import SPEEDUP_BOOT

__all__ = ["AR_ARM", "DEFAULT_FAMILY", "SPEEDUP_BOOT", "SimulatedTraces", "TraceAnalysis", "TraceView", "TreeSpec",
           "format_interval", "make_view", "resolve_traces", "simulate_traces", "write_simulated_traces"]
