"""The on-disk layout of one trace run (format v1), shared by the writer and the reader.

Known here: the names of a run's files and folders, how shards are named and ordered, how
``run.json`` is written atomically and read back, and which entries are leftovers of a writer that
died mid-shard. Not known here: the columns of the tables (``schema``), buffering and the run's life
cycle (``recorder``), or how tables are read and checked (``reader``, ``validation``).

Layout (see ``docs/trace-schema.md``)::

    <run dir>/run.json                                metadata, rewritten atomically (temp + os.replace)
    <run dir>/shards/<seq:06d>/tokens.parquet         one shard = rows of completed requests only;
    <run dir>/shards/<seq:06d>/rounds.parquet         written into shards/.tmp-* and renamed in one
    <run dir>/shards/<seq:06d>/requests.parquet       os.rename, so its three tables appear together

Shards are immutable once renamed. A writer killed at any moment leaves every renamed shard
intact; at worst a ``shards/.tmp-*`` directory remains, which readers ignore. One writer per run.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from entropy_law.traces.schema import FORMAT_NAME

RUN_FILE = "run.json"
SHARDS_DIR = "shards"
TMP_PREFIX = ".tmp-"  # unfinished files and shard directories; readers skip them


def table_file(table: str) -> str:
    """File name of ``table`` (tokens, rounds or requests) inside a shard directory."""
    return f"{table}.parquet"


def shard_name(seq: int) -> str:
    """Directory name of the shard with sequence number ``seq`` (zero-padded, so names sort in order)."""
    return f"{seq:06d}"


def temp_shard_name(seq: int) -> str:
    """A fresh temporary directory name for shard ``seq`` while its tables are written."""
    return f"{TMP_PREFIX}{shard_name(seq)}-{uuid.uuid4().hex[:8]}"


def shard_seq(shard: Path) -> int:
    """Sequence number of a finished shard directory."""
    return int(shard.name)


def shard_dirs(run_dir: Path) -> list[Path]:
    """Finished shard directories of a run in sequence order (temporary ``.tmp-*`` ones are skipped)."""
    root = Path(run_dir) / SHARDS_DIR
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=shard_seq)


def unfinished_shards(run_dir: Path) -> list[Path]:
    """Leftover ``shards/.tmp-*`` entries of a writer that stopped while writing a shard."""
    root = Path(run_dir) / SHARDS_DIR
    return list(root.glob(f"{TMP_PREFIX}*")) if root.is_dir() else []


def fsync_path(path: Path) -> None:
    """Flush a file or directory entry to disk (a no-op where the file system cannot fsync it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync directories
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` so that readers see the old or the new file, never a partial one."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def read_run_json(path: Path) -> dict:
    """The metadata in a run's ``run.json``; ValueError if it is not JSON or not an entropy-law run."""
    try:
        with open(path, encoding="utf-8") as fh:
            meta = json.load(fh)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it is not a readable trace run") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{path}: format is {found!r}, expected {FORMAT_NAME!r}; not an entropy-law trace run")
    return meta
