"""The trace format (v2; v1 runs read too): the one written contract between decoding and analysis.

One module each: the format (``schema``), a run's on-disk layout (``layout``), the writer (``recorder``), the
reader (``reader``), the rules a valid table obeys (``validation``) and the per-token statistics (``stats``).
Depends on numpy, pyarrow and pandas only; never imports torch, so any engine can log through it.
"""

from entropy_law.traces.reader import TraceSet, load_traces
from entropy_law.traces.recorder import RunLockedError, RunLockLostError, TraceRecorder
from entropy_law.traces.schema import FORMAT_VERSION
from entropy_law.traces.stats import TARGET_STAT_KEYS, draft_stats, target_stats_from_logits
from entropy_law.traces.validation import TraceValidationError

__all__ = ["FORMAT_VERSION", "RunLockLostError", "RunLockedError", "TARGET_STAT_KEYS", "TraceRecorder", "TraceSet",
           "TraceValidationError", "draft_stats", "load_traces", "target_stats_from_logits"]
