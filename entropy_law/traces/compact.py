"""Compaction of a finished trace run: its many small shards rewritten as a few larger ones, nothing else changed.

``compact_run`` rewrites a complete run into a sibling folder, checks every table reads back equal, then swaps
the folders (``run_id`` kept). A failure leaves the original whole (at ``.<name>.before-compacting`` mid-swap).
"""

from __future__ import annotations

import datetime as _dt
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from entropy_law.traces.layout import (LOCK_FILE, RUN_FILE, SHARDS_DIR, read_lock, read_run_json, shard_dirs,
                                       table_file, unfinished_shards, write_json_atomic)
from entropy_law.traces.recorder import _AUTO_KEYS, TraceRecorder

TABLES = ("tokens", "rounds", "requests")


def _read_shards(shards: list[Path]) -> list[dict[str, pa.Table]]:
    return [{name: pq.read_table(shard / table_file(name)) for name in TABLES} for shard in shards]


def _concat(parts: list[dict[str, pa.Table]], name: str) -> pa.Table:
    return pa.concat_tables([p[name] for p in parts], promote_options="default")


def compact_run(run_dir: str | Path, *, rounds_per_shard: int = 1000) -> dict:
    """Rewrite the complete run at ``run_dir`` in shards of about ``rounds_per_shard`` rounds; returns
    ``{"shards_before", "shards_after", "rows"}``. Refuses a run not complete, held by a writer, or with leftovers."""
    run = Path(run_dir)
    if int(rounds_per_shard) < 1:
        raise ValueError(f"rounds_per_shard must be >= 1; got {rounds_per_shard}")
    meta = read_run_json(run / RUN_FILE)
    if meta.get("status") != "complete":
        raise ValueError(f"{run}: the run is {meta.get('status')!r}, not complete; finish or resume it before "
                         "compacting (a writer may still add shards)")
    if read_lock(run) is not None:
        raise ValueError(f"{run}: a writer holds {LOCK_FILE}; compact the run once nobody writes to it")
    if unfinished_shards(run):
        raise ValueError(f"{run}: unfinished shard folders are there; resume the run once (they are "
                         "quarantined) before compacting")
    shards = shard_dirs(run)
    parts = _read_shards(shards)
    groups, group, rounds = [], [], 0
    for part in parts:  # whole source shards, so a request is never split
        group.append(part)
        rounds += part["rounds"].num_rows
        if rounds >= rounds_per_shard:
            groups.append(group)
            group, rounds = [], 0
    if group:
        groups.append(group)
    rows = {name: sum(p[name].num_rows for p in parts) for name in TABLES}
    if len(groups) == len(shards):  # nothing to merge (compacted already, or one shard per ~rounds_per_shard)
        return {"shards_before": len(shards), "shards_after": len(shards), "rows": rows}

    tmp = run.with_name(f".{run.name}.compacting")
    if tmp.exists():
        shutil.rmtree(tmp)  # an earlier compaction that died before its swap: never the run itself
    try:
        given = {k: v for k, v in meta.items() if k not in _AUTO_KEYS}  # run.json is restored whole below
        rec = TraceRecorder(tmp, flush_every_rounds=10 ** 12, **given)
        for group in groups:
            rec.log_columns(**{name: _concat(group, name) for name in TABLES})
        rec.finish()
        written = _read_shards(shard_dirs(tmp))
        for name in TABLES:  # every row back, in order, with the same values
            if not parts:
                break
            before, after = _concat(parts, name), _concat(written, name)
            # columns added to the format after the run was written are null in the copy (the reader's view)
            added = [c for c in after.column_names if c not in before.column_names]
            if (not after.select(before.column_names).cast(before.schema).equals(before)
                    or any(after.column(c).null_count != after.num_rows for c in added)):
                raise RuntimeError(f"{run}: the compacted {name} table differs from the original; nothing changed")
        for entry in run.iterdir():
            if entry.name in (RUN_FILE, SHARDS_DIR, LOCK_FILE):
                continue
            copy = shutil.copytree if entry.is_dir() else shutil.copy2
            copy(entry, tmp / entry.name)
        result = {"shards_before": len(shards), "shards_after": len(groups), "rows": rows}
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        compacted = [*meta.get("compacted", []), {"time": stamp, "shards_before": len(shards),
                                                   "shards_after": len(groups)}]
        write_json_atomic(tmp / RUN_FILE, {**meta, "compacted": compacted})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = run.with_name(f".{run.name}.before-compacting")
    run.rename(old)
    tmp.rename(run)
    shutil.rmtree(old)
    return result
