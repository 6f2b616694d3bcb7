"""The trace format (v2; v1 runs read too): the one written contract between decoding and analysis.

Known here, one module each: the format (``schema``: tables, columns, types, version), the
on-disk layout of a run (``layout``: file names, shards, atomic ``run.json``), the writer
(``recorder``: ``TraceRecorder``), the reader (``reader``: ``load_traces`` -> ``TraceSet``), the
rules a valid table obeys (``validation``: ``TraceValidationError``) and the per-token statistics
recorded from logits (``stats``: entropies in nats, top-1/top-2 probabilities, logit gap).
Not known here: how rounds are decoded, or how traces are analysed (``entropy_law.law``).

Depends on numpy, pyarrow and pandas only; never imports torch, so any engine can log through it.
"""

from entropy_law.traces.reader import TraceSet, load_traces
from entropy_law.traces.recorder import TraceRecorder
from entropy_law.traces.recorder import RunLockedError, RunLockLostError
from entropy_law.traces.schema import FORMAT_VERSION
from entropy_law.traces.stats import TARGET_STAT_KEYS, draft_stats, target_stats_from_logits
from entropy_law.traces.validation import TraceValidationError

__all__ = [
    "FORMAT_VERSION",
    "RunLockLostError",
    "RunLockedError",
    "TARGET_STAT_KEYS",
    "TraceRecorder",
    "TraceSet",
    "TraceValidationError",
    "draft_stats",
    "load_traces",
    "target_stats_from_logits",
]
