"""The on-disk layout of one trace run (format v2), shared by the writer and the reader (``docs/trace-schema.md``)::

    <run dir>/run.json                            metadata, rewritten atomically (temp + os.replace)
    <run dir>/writer.lock                         the writer's pid and host while it has the run open
    <run dir>/shards/<seq:06d>/{tokens,rounds,requests}.parquet
                                                  written into shards/.tmp-* and renamed in one os.rename
    <run dir>/quarantine/<name>/                  leftovers of a crashed writer, kept out of the way

Shards are immutable once renamed; the rename that publishes a shard also claims its number.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import socket
import uuid
from pathlib import Path

from entropy_law.traces.schema import FORMAT_NAME

RUN_FILE = "run.json"
SHARDS_DIR = "shards"
TMP_PREFIX = ".tmp-"  # unfinished files and shard directories; readers skip them
LOCK_FILE = "writer.lock"  # held by the one writer of a run: {"pid", "host", "started", "token"}
QUARANTINE_DIR = "quarantine"  # leftovers of a crashed writer, moved here by a resumed writer


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
    return sorted(root.glob(f"{TMP_PREFIX}*")) if root.is_dir() else []


def quarantined(run_dir: Path) -> list[Path]:
    """Entries of the run's ``quarantine`` folder (leftovers a resumed writer moved out of the way)."""
    root = Path(run_dir) / QUARANTINE_DIR
    return sorted(root.iterdir()) if root.is_dir() else []


def quarantine_path(run_dir: Path, leftover: Path) -> Path:
    """A free path in ``<run dir>/quarantine/`` for ``leftover`` (its name without the leading dot)."""
    root = Path(run_dir) / QUARANTINE_DIR
    name = leftover.name.lstrip(".")
    target = root / name
    while target.exists():
        target = root / f"{name}-{uuid.uuid4().hex[:8]}"
    return target


def is_writer_file(name: str) -> bool:
    """Whether ``name`` is the lock or a temporary ``run.json``: a folder holding only these counts as empty."""
    return name == LOCK_FILE or name.startswith(f"{TMP_PREFIX}{RUN_FILE}")


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


def write_parquet_atomic(path: Path, table, *, check=None, **options) -> Path:
    """Write ``table`` to ``path`` so that readers see the old or the new file, never a partial one; ``check(tmp_path)``
    runs before the replace (if it raises, ``path`` is kept)."""
    import pyarrow.parquet as pq

    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(table, tmp, **options)
        fsync_path(tmp)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return path


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


# -- the writer's lock ------------------------------------------------------------------------------------

def this_host() -> str:
    return socket.gethostname()


def _dump_synced(payload: dict, fh) -> None:
    json.dump(payload, fh)
    fh.flush()
    os.fsync(fh.fileno())


def _pid_running(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): kill(pid, 0) said it exists
        return True


def read_lock(run_dir: Path) -> dict | None:
    """The holder in ``writer.lock`` (``pid``, ``host``, ``started``, ``token``), None, or ``{"unreadable": why}``."""
    path = Path(run_dir) / LOCK_FILE
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        return {"unreadable": str(err)}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"unreadable": f"not JSON ({text[:60]!r})"}
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int) or not holder.get("host"):
        return {"unreadable": f"no pid and host in it ({text[:60]!r})"}
    return holder


def lock_state(holder: dict) -> str:
    """``"live"`` (its process runs on this host), ``"stale"`` (this host, the process is gone),
    ``"foreign"`` (another host: cannot be checked from here) or ``"unreadable"``."""
    if "unreadable" in holder:
        return "unreadable"
    if holder["host"] != this_host():
        return "foreign"
    return "live" if _pid_running(holder["pid"]) else "stale"


def describe_holder(holder: dict) -> str:
    """The holder in words, for errors and warnings."""
    if "unreadable" in holder:
        return f"an unreadable lock ({holder['unreadable']})"
    return f"pid {holder['pid']} on host {holder['host']!r} (since {holder.get('started', '?')})"


def create_lock(run_dir: Path) -> dict:
    """Create ``<run dir>/writer.lock`` for this process (FileExistsError if one is there), never seen half-written
    (linked from a temporary file, or ``O_EXCL`` without hard links)."""
    holder = {"pid": os.getpid(), "host": this_host(),
              "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "token": uuid.uuid4().hex}
    path = Path(run_dir) / LOCK_FILE
    tmp = path.with_name(f"{TMP_PREFIX}{LOCK_FILE}.{holder['token'][:8]}")
    with open(tmp, "w", encoding="utf-8") as fh:
        _dump_synced(holder, fh)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here: create it exclusively (a crash may leave it empty: "unreadable")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _dump_synced(holder, fh)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(Path(run_dir))
    return holder


def remove_lock(run_dir: Path, holder: dict) -> bool:
    """Remove ``<run dir>/writer.lock`` if it is still ``holder``'s (same token); True if removed."""
    current = read_lock(run_dir)
    if current is None or current.get("token") != holder.get("token"):
        return False
    (Path(run_dir) / LOCK_FILE).unlink(missing_ok=True)
    return True


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
