"""Whether an in-memory analysis of a trace folder fits the memory available, checked before any row is read."""

from __future__ import annotations

import os


# a lower bound of what fit_law needs in memory per token row (bench/fleet.py fleet); the full report holds more
IN_MEMORY_BYTES_PER_TOKEN_ROW = 880


def available_memory() -> int | None:
    """Bytes available to a new allocation (``MemAvailable``, else free pages); None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(traces, what: str, *, available: int | None = None) -> int:
    """Refuse an in-memory ``what`` whose token rows (counted from the Parquet footers) need more memory than
    ``available`` bytes (default ``available_memory()``; unknown: no check). Returns the token rows."""
    from entropy_law.traces.reader import load_traces

    lazy = traces if hasattr(traces, "row_counts") else load_traces(traces, validate=False)
    rows = lazy.row_counts()["tokens"]
    available = available_memory() if available is None else available
    need = rows * IN_MEMORY_BYTES_PER_TOKEN_ROW
    if available is not None and need > available:
        raise ValueError(f"{what} in memory: {rows:,} token rows need at least {need / 2**30:.1f} GiB (about "
                         f"{IN_MEMORY_BYTES_PER_TOKEN_ROW} bytes a row for the law's fit alone), and "
                         f"{available / 2**30:.1f} GiB is available. Use --out-of-core (DuckDB over the shards; "
                         "docs/out-of-core.md), or give a subset of the runs; --no-memory-check runs it anyway")
    return rows
