"""``TraceRecorder``: writes one run of acceptance traces (the trace format) as a Parquet dataset directory.

A shard's three tables appear together or not at all (one ``os.rename``); a crashed writer's leftovers are
quarantined on resume, never deleted. Engines log through ``log_round`` or ``log_columns``. Never imports torch.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import operator
import os
import shutil
import subprocess
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from entropy_law import __version__
from entropy_law.traces.layout import (LOCK_FILE, QUARANTINE_DIR, RUN_FILE, SHARDS_DIR, create_lock, describe_holder,
                                       fsync_path, is_writer_file, lock_state, quarantine_path, read_lock,
                                       read_run_json, remove_lock, shard_dirs, shard_name, shard_seq, table_file,
                                       temp_shard_name, unfinished_shards, write_json_atomic)
from entropy_law.traces.schema import (FORMAT_NAME, FORMAT_VERSION, POLICY_COLUMNS, READABLE_FORMAT_VERSIONS, ROLES,
                                       RUN_METADATA_KEYS, SCHEMAS, STOP_REASONS, added_columns)
from entropy_law.traces.stats import DRAFT_STAT_KEYS, TARGET_STAT_KEYS, context_matches_of_output, target_stats_from_logits
from entropy_law.traces.stats import draft_stats as _draft_stats
from entropy_law.traces.validation import check_run, check_run_shards, check_values

_AUTO_KEYS = ("format", "format_version", "status", "package_version", "start_time", "end_time", "quarantined")
_LOCK_CHECK_EVERY_S = 1.0  # during a request, the writer looks at its lock file at most this often
_MAX_NAME_TRIES = 1000  # shard numbers tried when others are taken (only another writer could take them)
_ROLE_ACCEPTED, _ROLE_CORRECTION, _ROLE_BONUS = 0, 1, 2  # indices into ROLES
_ROLE_DICTIONARY = pa.array(ROLES, type=pa.string())
_COMPRESSION = "zstd"


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _git_revision() -> str | None:
    """HEAD of the checkout the package runs from, or None (never fails)."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        rev = out.stdout.strip()
        return rev if out.returncode == 0 and rev else None
    except Exception:  # no git, not a checkout, timeout: the revision is optional
        return None


def _target_stats_array(target_logits, target_stats, committed: int, where: str) -> np.ndarray:
    """The target statistics ``[5, committed]`` from exactly one of ``target_logits`` or ``target_stats``."""
    if (target_logits is None) == (target_stats is None):
        raise ValueError(f"{where}: give exactly one of target_logits ([committed, V]) or target_stats (dict)")
    if target_logits is not None:
        shape = tuple(getattr(target_logits, "shape", np.shape(target_logits)))
        if len(shape) != 2 or shape[0] != committed:
            raise ValueError(f"{where}: target_logits must have shape [committed={committed}, V]; got {shape}")
        computed = target_stats_from_logits(target_logits)
        stats = np.stack([computed[k] for k in TARGET_STAT_KEYS])
    else:
        if not isinstance(target_stats, dict):
            raise TypeError(f"{where}: target_stats must be a dict with keys {list(TARGET_STAT_KEYS)}")
        unknown = set(target_stats) - set(TARGET_STAT_KEYS)
        missing = [k for k in TARGET_STAT_KEYS if k not in target_stats]
        if unknown or missing:
            raise ValueError(f"{where}: target_stats needs keys {list(TARGET_STAT_KEYS)}; "
                             f"missing {missing}, unknown {sorted(unknown)}")
        try:
            stats = np.array([np.asarray(target_stats[k], dtype=np.float32).reshape(-1)
                              for k in TARGET_STAT_KEYS], dtype=np.float32)
        except ValueError as err:
            lengths = {k: np.size(target_stats[k]) for k in TARGET_STAT_KEYS}
            raise ValueError(f"{where}: target_stats arrays must all have length committed={committed}; "
                             f"got {lengths}") from err
        if stats.shape != (5, committed):
            raise ValueError(f"{where}: target_stats arrays must have length committed={committed}; "
                             f"got {stats.shape[1]}")
    if not _target_stats_ok(stats):
        _explain_target_stats(stats, where)
    return stats


def _target_stats_ok(stats: np.ndarray) -> bool:
    """Fast path of the per-round check: one min and one max per statistic (NaN fails every comparison)."""
    lo = stats.min(axis=1).tolist()
    hi = stats.max(axis=1).tolist()
    return (lo[0] >= 0 and lo[1] >= 0 and hi[0] < math.inf and hi[1] < math.inf and lo[2] >= 0 and lo[3] >= 0
            and hi[2] <= 1 and hi[3] <= 1 and lo[4] >= 0 and not bool((stats[3] > stats[2]).any()))


def _explain_target_stats(stats: np.ndarray, where: str) -> None:
    """Raise the ValueError that says which statistic is wrong and at which depth."""
    if np.isnan(stats).any():
        key, depth = np.argwhere(np.isnan(stats))[0]
        raise ValueError(f"{where}: target_stats[{TARGET_STAT_KEYS[key]!r}] is NaN at depth {depth + 1}")
    if (stats[:2] < 0).any() or np.isinf(stats[:2]).any():
        key, depth = np.argwhere((stats[:2] < 0) | np.isinf(stats[:2]))[0]
        raise ValueError(f"{where}: target_stats[{TARGET_STAT_KEYS[key]!r}] must be finite and >= 0 "
                         f"(nats); got {stats[key, depth]} at depth {depth + 1}")
    if (stats[4] < 0).any():
        raise ValueError(f"{where}: target_stats['logit_gap'] must be >= 0; got {stats[4].tolist()}")
    raise ValueError(f"{where}: target top1_prob/top2_prob must lie in [0, 1] with top2 <= top1; "
                     f"got {stats[2].tolist()} / {stats[3].tolist()}")


class RunLockedError(FileExistsError):
    """Another writer holds the run (``writer.lock`` names it), or a stale lock is there and was not broken."""


class RunLockLostError(RuntimeError):
    """This writer's ``writer.lock`` was removed or replaced while it wrote: it stops rather than share the run."""


_INT32_MAX = int(np.iinfo(np.int32).max)
_INT16_MAX = int(np.iinfo(np.int16).max)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _integer(value, name: str, where: str, *, low: int = 0, high: int = _INT32_MAX) -> int:
    """``value`` as an int in ``[low, high]``; an integral float (3.0) is taken, 1.5 refused (ValueError)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{where}: {name} must be an integer; got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {name} must be an integer; got {value!r}") from None
        if not as_float.is_integer():
            raise ValueError(f"{where}: {name} must be an integer; got {value!r}") from None
        number = int(as_float)
    if not low <= number <= high:
        raise ValueError(f"{where}: {name} must lie in [{low}, {high}]; got {number}")
    return number


def _milliseconds(value, name: str, where: str) -> float:
    """``value`` as a time in ms: finite, >= 0 and within float32 (else ValueError)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a number of ms; got {value!r}") from None
    if not 0 <= number <= _FLOAT32_MAX:
        raise ValueError(f"{where}: {name} must be finite and >= 0; got {value}")
    return number


def _token_ids(token_ids, where: str) -> np.ndarray:
    """The committed token ids as a flat int64 array; non-integers or ids outside [0, int32 max]: ValueError."""
    ids = np.asarray(token_ids)
    if ids.size and ids.dtype.kind not in "iu":
        shown = ids.reshape(-1)[:8].tolist()
        raise ValueError(f"{where}: token_ids must be integers (vocabulary indices); got {ids.dtype} values "
                         f"{shown}{' ...' if ids.size > 8 else ''}")
    ids = ids.reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() > _INT32_MAX):
        raise ValueError(f"{where}: token ids must lie in [0, {_INT32_MAX}]; got {ids.tolist()}")
    return ids.astype(np.int64)


def _policy_kind(kind: pa.DataType) -> str:
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return "int"
    return "float" if pa.types.is_floating(kind) else "str"


_POLICY_KINDS = {name: _policy_kind(SCHEMAS["rounds"].field(name).type) for name in POLICY_COLUMNS}


def _policy_value_ok(value, kind: str) -> bool:
    """Whether ``value`` (not None) can be stored as it is in a policy column of ``kind``."""
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):
        return False
    if kind == "int":
        return isinstance(value, numbers.Integral) and -_INT32_MAX - 1 <= int(value) <= _INT32_MAX
    if kind == "float":
        return isinstance(value, numbers.Real) and not abs(float(value)) > _FLOAT32_MAX
    return isinstance(value, str)


def _checked_policy(policy, where: str) -> dict | None:
    """The round's policy columns as a dict (a copy), or the ValueError naming the key that cannot be stored."""
    if policy is None:
        return None
    if not isinstance(policy, Mapping):
        raise ValueError(f"{where}: policy must be a dict of policy columns {list(POLICY_COLUMNS)}; "
                         f"got {type(policy).__name__}")
    unknown = [key for key in policy if key not in _POLICY_KINDS]
    if unknown:
        raise ValueError(f"{where}: unknown policy column(s) {sorted(unknown, key=str)}; known: {list(POLICY_COLUMNS)}")
    for key, value in policy.items():
        if value is not None and not _policy_value_ok(value, _POLICY_KINDS[key]):
            raise ValueError(f"{where}: policy[{key!r}] must be a {SCHEMAS['rounds'].field(key).type} value (or None: "
                             f"null); got {value!r}")
    return dict(policy)


def _check_target(path: Path, *, resume: bool, overwrite: bool) -> dict | None:
    """The metadata of the run at ``path`` (None: no run there yet), or the error that refuses to write there."""
    if not path.exists():
        return None
    if not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory; a run is a directory")
    run_file = path / RUN_FILE
    if not run_file.exists():
        if any(not is_writer_file(entry.name) for entry in path.iterdir()):
            raise FileExistsError(f"{path} is not empty and holds no trace run ({RUN_FILE}); "
                                  "pick a new or empty directory")
        return None
    existing = read_run_json(run_file)
    if overwrite:
        return existing
    version = existing.get("format_version")
    if version != FORMAT_VERSION and not (version in READABLE_FORMAT_VERSIONS and resume):  # an older run resumes
        raise ValueError(f"{run_file}: run has format version {version!r}; this package writes "
                         f"v{FORMAT_VERSION} and will not append to it. Use a new directory "
                         "(or overwrite=True to replace the run)")
    if not resume:
        state = "complete" if existing.get("status") == "complete" else "incomplete"
        raise FileExistsError(f"{path} already holds a {state} run ({existing.get('run_id')}); "
                              "pass resume=True to continue it (skipping completed requests) "
                              "or overwrite=True to replace it")
    return existing


def _check_lock(path: Path, *, break_lock: bool) -> dict | None:
    """None if no writer holds ``path``; the holder of a lock that ``break_lock`` may break; else RunLockedError."""
    holder = read_lock(path) if path.is_dir() else None
    if holder is None:
        return None
    state = lock_state(holder)
    lock = path / LOCK_FILE
    who = describe_holder(holder)
    if state == "live":
        extra = (" break_lock does not take a run from a process that is running; if that pid is not a writer "
                 f"of this run (a reused pid), delete {lock} by hand." if break_lock else "")
        raise RunLockedError(f"{path} is being written by another writer, {who} ({lock}); a run has one "
                             "writer at a time. Wait for it to finish or stop it, or record into another "
                             f"directory.{extra}")
    if break_lock:
        return holder
    if state == "stale":
        raise RunLockedError(f"{path}: stale writer lock ({lock}): {who} is not running (it crashed or was "
                             "killed; its finished shards are intact). Pass break_lock=True to take the run "
                             "over")
    if state == "foreign":
        raise RunLockedError(f"{path} is locked by {who}, another host; this host cannot tell whether that "
                             "writer still runs. If it does not, pass break_lock=True to take the run over")
    raise RunLockedError(f"{path}: {who} in {lock}; if no writer is running, pass break_lock=True to "
                         "take the run over")


def _as_stored(value):
    """``value`` as it reads back from JSON (tuples become lists): how metadata is compared."""
    return json.loads(json.dumps(value))


def _describe_conflicts(stored: dict, given: dict, absent_means: Mapping) -> list[str]:
    """One line per given key that differs from the run's (as stored in JSON); a key the run lacks compares with
    ``absent_means[key]``, and without one it is a difference."""
    lines = []
    for key, value in given.items():
        value = _as_stored(value)
        if key in stored:
            if stored[key] != value:
                lines.append(f"{key}: run has {stored[key]!r}, given {value!r}")
        elif key in absent_means:
            implied = _as_stored(absent_means[key])
            if implied != value:
                lines.append(f"{key}: run has {implied!r} (not in its {RUN_FILE}, which means {implied!r}), "
                             f"given {value!r}")
        else:
            lines.append(f"{key}: not recorded in the run (cannot be checked), given {value!r}")
    return lines


@dataclass(slots=True, eq=False)
class _OpenRequest:
    """Buffered rounds of one request that has begun and not yet ended."""

    request_id: str
    info: dict
    prompt_ids: np.ndarray | None = None
    rounds: list[tuple] = field(default_factory=list)
    token_ids: list[np.ndarray] = field(default_factory=list)
    stats: list[np.ndarray] = field(default_factory=list)  # each [5, committed] float32 in TARGET_STAT_KEYS order
    draft: list[np.ndarray | None] = field(default_factory=list)  # each [len(DRAFT_STAT_KEYS), committed] or None
    roles: list[np.ndarray] = field(default_factory=list)
    policy: list[dict | None] = field(default_factory=list)  # per round: its policy columns, or None
    last_round: int = -1
    next_position: int = 0
    n_tokens: int = 0
    row: dict | None = None


class TraceRecorder:
    """Log acceptance traces of one run into the directory ``path`` (the trace format).

    ``run_metadata``: ``model_id``, ``drafter_id``, ``drafter_config``, ``tree_policy``, ``dtype``, ``device``,
    ``seed``, ``run_id`` (generated if absent) and any JSON-serialisable keys. An existing run is appended to only with
    ``resume=True`` (a given key that differs from ``run.json`` is refused; a key the run lacks compares with
    ``absent_means[key]``) and replaced only with ``overwrite=True``. ``completed_requests``: the ids to skip.

    One writer per run: ``<path>/writer.lock`` is held until ``finish()`` (a live holder: ``RunLockedError``; a stale or
    foreign lock too unless ``break_lock=True``). Ended requests are written in a shard every ``flush_every_rounds``
    rounds or ``flush_every_requests`` requests, on ``flush()`` and ``finish()``. As a context manager a clean exit
    finishes the run; an exception flushes ended requests and propagates.
    """

    def __init__(self, path, *, overwrite: bool = False, resume: bool = False,
                 flush_every_rounds: int = 1000, flush_every_requests: int | None = None,
                 break_lock: bool = False, absent_means: Mapping | None = None, **run_metadata):
        self._lock: dict | None = None  # set once this writer holds writer.lock
        self._lock_seen: tuple | None = None  # (inode, mtime, size) of that lock file, for the per-call check
        self._lost: str | None = None  # why this writer stopped, once its lock was removed or taken
        self._lock_checked_at = 0.0  # time.monotonic() of the last per-call lock check
        self._pending: list[_OpenRequest] = []
        self._finished = False
        if overwrite and resume:
            raise ValueError("pass overwrite=True (replace the run) or resume=True (continue it), not both")
        if int(flush_every_rounds) < 1:
            raise ValueError(f"flush_every_rounds must be >= 1; got {flush_every_rounds}")
        if flush_every_requests is not None and int(flush_every_requests) < 1:
            raise ValueError(f"flush_every_requests must be >= 1 (or None: by rounds only); got {flush_every_requests}")
        self.path = Path(path)
        self._lock_file = os.fspath(self.path / LOCK_FILE)
        self.flush_every_rounds = int(flush_every_rounds)
        self.flush_every_requests = None if flush_every_requests is None else int(flush_every_requests)
        reserved = sorted(set(run_metadata) & set(_AUTO_KEYS))
        if reserved:
            raise ValueError(f"run metadata keys {reserved} are filled in by the recorder; do not pass them")
        for key, value in run_metadata.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"run metadata {key!r} is not JSON-serialisable ({err}); pass plain "
                                "str/int/float/bool/None, lists or dicts of them") from err
        if "drafter_config" in run_metadata and not isinstance(run_metadata["drafter_config"], dict):
            raise TypeError("drafter_config must be a dict")
        if "run_id" in run_metadata and (not isinstance(run_metadata["run_id"], str) or not run_metadata["run_id"]):
            raise ValueError(f"run_id must be a non-empty string; got {run_metadata['run_id']!r}")
        absent_means = dict(absent_means or {})
        try:
            json.dumps(absent_means)
        except (TypeError, ValueError) as err:
            raise TypeError(f"absent_means is not JSON-serialisable ({err})") from err

        _check_target(self.path, resume=resume, overwrite=overwrite)  # refuse before taking the lock
        stale = _check_lock(self.path, break_lock=break_lock)
        self.path.mkdir(parents=True, exist_ok=True)
        if stale is not None:
            (self.path / LOCK_FILE).unlink(missing_ok=True)
        try:
            self._lock = create_lock(self.path)
            self._lock_seen = self._lock_file_identity()
        except FileExistsError:
            holder = read_lock(self.path)
            raise RunLockedError(f"{self.path}: another writer took the run just now "
                                 f"({describe_holder(holder) if holder else 'and let it go again'}); "
                                 "a run has one writer at a time") from None
        if stale is not None:
            warnings.warn(f"trace run {self.path}: broke the writer lock of {describe_holder(stale)} "
                          "(break_lock=True); this writer holds the run now", UserWarning, stacklevel=2)
        try:  # the lock is held: look again (another writer may have changed the run meanwhile)
            existing = _check_target(self.path, resume=resume, overwrite=overwrite)
            self._open_run(existing, run_metadata, absent_means, overwrite=overwrite)
        except BaseException:
            self._release_lock()
            raise

    @staticmethod
    def check_path(path, *, resume: bool = False, overwrite: bool = False, break_lock: bool = False) -> None:
        """Raise what ``TraceRecorder(path, ...)`` would refuse, writing nothing (before loading a model)."""
        if overwrite and resume:
            raise ValueError("pass overwrite=True (replace the run) or resume=True (continue it), not both")
        path = Path(path)
        _check_target(path, resume=resume, overwrite=overwrite)
        _check_lock(path, break_lock=break_lock)

    def _open_run(self, existing: dict | None, run_metadata: dict, absent_means: dict, *, overwrite: bool) -> None:
        """Start a new run (no run there, or ``overwrite``: the old one is removed) or continue ``existing``."""
        run_file = self.path / RUN_FILE
        self._open: dict[str, _OpenRequest] = {}
        self._pending_rounds = 0
        self._completed: set[str] = set()
        if existing is not None and overwrite:
            for entry in self.path.iterdir():  # everything but this writer's lock
                if entry.name == LOCK_FILE:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            existing = None
        (self.path / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        if existing is None:
            meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "run_id": None,
                    "status": "running", "model_id": None, "drafter_id": None, "drafter_config": {},
                    "tree_policy": None, "dtype": None, "device": None,
                    "package_version": __version__, "seed": None, "start_time": _utc_now(),
                    "end_time": None, "git_revision": None}
            meta.update({k: v for k, v in run_metadata.items()  # a key's absence says it: not written
                         if not (k in absent_means and _as_stored(v) == _as_stored(absent_means[k]))})
            if meta["run_id"] is None:
                stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                meta["run_id"] = f"{stamp}-{uuid.uuid4().hex[:8]}"
            if "git_revision" not in run_metadata:
                meta["git_revision"] = _git_revision()
            self._next_seq = 0
        else:
            meta = existing
            absent = [k for k in RUN_METADATA_KEYS if k not in meta]
            if absent:
                raise ValueError(f"cannot resume {self.path}: {RUN_FILE} lacks key(s) {absent}; it was not "
                                 "written by this recorder")
            conflicts = _describe_conflicts(meta, run_metadata, absent_means)
            if conflicts:
                raise ValueError(f"cannot resume {self.path}: metadata differs from the run on disk ("
                                 + "; ".join(conflicts) + "). A run holds one configuration: record into a new "
                                 "directory, or pass overwrite=True to replace this run")
            meta["status"] = "running"
            meta["end_time"] = None
            meta.setdefault("resumed_at", []).append(_utc_now())
            shards = shard_dirs(self.path)
            damaged: list = []  # the readers' checks (validation.check_run_shards), every earlier shard
            self._completed.update(check_run_shards(shards, f"cannot resume {self.path}", damaged=damaged))
            self._next_seq = shard_seq(shards[-1]) + 1 if shards else 0
            if damaged:  # moved aside whole, so their prompts are not completed and are recorded again
                meta.setdefault("quarantined", []).extend(self._quarantine_damaged(damaged))
            leftovers = unfinished_shards(self.path)
            if leftovers:  # of a writer that died mid-shard: kept, out of the way, and said
                meta.setdefault("quarantined", []).extend(self._quarantine(leftovers))
        self.metadata = meta
        self.run_id: str = meta["run_id"]
        write_json_atomic(run_file, meta)

    def _move_to_quarantine(self, entry: Path, **why) -> dict:
        """Move ``entry`` to ``quarantine/``; its record for ``run.json`` (name, origin, time, ``why``)."""
        target = quarantine_path(self.path, entry)
        target.parent.mkdir(exist_ok=True)
        os.rename(entry, target)
        return {"name": str(target.relative_to(self.path)), "from": str(entry.relative_to(self.path)),
                "moved_at": _utc_now(), **why}

    def _quarantine(self, leftovers: list[Path]) -> list[dict]:
        """Quarantine unfinished ``shards/.tmp-*`` entries (with the request ids each holds, if readable) and warn."""
        moved, lines = [], []
        for leftover in leftovers:
            ids = None
            try:
                ids = pq.read_table(leftover / table_file("requests"), columns=["request_id"]).column(0).to_pylist()
            except Exception:  # a shard cut off while being written: no readable requests table
                pass
            moved.append(self._move_to_quarantine(leftover, request_ids=ids))
            if ids is None:
                lines.append(f"{leftover.name}: unreadable (cut off while written)")
            else:
                missing = sorted(set(ids) - self._completed)
                lines.append(f"{leftover.name}: {len(ids)} request(s)"
                             + (f", {len(missing)} not in the run's shards ({', '.join(missing[:5])}"
                                f"{', ...' if len(missing) > 5 else ''}): not completed, so the resumed job "
                                "records them again"
                                if missing else ", all also in the run's shards"))
        fsync_path(self.path)
        warnings.warn(f"trace run {self.path}: found {len(leftovers)} unfinished shard folder(s) of an earlier "
                      f"writer, not part of the run; moved them to {self.path / QUARANTINE_DIR} (nothing "
                      f"deleted; run.json lists them under 'quarantined'): " + "; ".join(lines)
                      + ". Inspect them, then delete the quarantine folder.", UserWarning, stacklevel=4)
        fsync_path(self.path / QUARANTINE_DIR)
        return moved

    def _quarantine_damaged(self, damaged: list[tuple[Path, str]]) -> list[dict]:
        """Quarantine finished shards that fail ``check_shard`` (with the reason) and warn."""
        moved, lines = [], []
        for shard, reason in damaged:
            moved.append(self._move_to_quarantine(shard, reason=reason))
            lines.append(f"{shard.name}: {reason}")
        fsync_path(self.path / SHARDS_DIR)
        fsync_path(self.path / QUARANTINE_DIR)
        warnings.warn(f"trace run {self.path}: {len(damaged)} finished shard(s) are damaged; moved them to "
                      f"{self.path / QUARANTINE_DIR} (nothing deleted; run.json lists them under 'quarantined') and "
                      "their prompts are not completed, so the resumed job records them again: " + "; ".join(lines),
                      UserWarning, stacklevel=4)
        return moved

    def __enter__(self) -> "TraceRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
            return False
        if self._lost is not None:  # it cannot write (its error names what was not written)
            return False
        try:
            self.flush()
        except Exception as flush_err:  # never hide the original error behind a flush failure
            warnings.warn(f"trace run {self.path}: flushing after an error failed: {flush_err}", stacklevel=2)
        finally:
            self._release_lock()
        return False

    def __del__(self):  # a recorder that is gone cannot write: let the run go
        if getattr(self, "_lock", None) is None:
            return
        try:
            if self._pending:  # never silently: say what was dropped
                warnings.warn(f"trace run {self.path}: recorder dropped without finish() or flush(); "
                              f"{len(self._pending)} ended request(s) were not written", ResourceWarning,
                              stacklevel=1)
            self._release_lock()
        except Exception:  # at interpreter exit, modules may be gone; the lock then reads as stale
            pass

    def _release_lock(self) -> None:
        """Let the run go (remove writer.lock if it is still this writer's)."""
        if self._lock is not None:
            try:
                remove_lock(self.path, self._lock)
            except OSError:
                pass
            self._lock = None

    def _lock_file_identity(self) -> tuple | None:
        """(inode, mtime, size) of ``writer.lock``, or None where it is gone: what the per-call check compares."""
        try:
            info = os.stat(self._lock_file)
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def _check_lock_quickly(self, when: str, *, every_s: float = 0.0) -> None:
        """One ``stat`` of ``writer.lock`` (at most once per ``every_s`` seconds), and the full check where it changed:
        a writer whose lock was removed or taken stops at once, not after decoding for nothing."""
        if self._lost is None and self._lock is not None:
            now = time.monotonic()
            if now - self._lock_checked_at < every_s:
                return
            if self._lock_file_identity() == self._lock_seen:
                self._lock_checked_at = now
                return
        self._check_lock_held(when)

    def _check_lock_held(self, when: str = "before writing a shard") -> None:
        """``RunLockLostError`` (what happened, what was kept and not written) once this writer lost its lock."""
        if self._lost is not None:
            raise RunLockLostError(self._lost)
        if self._lock is None:
            raise RuntimeError(f"trace run {self.path}: this recorder no longer holds the run (its lock was "
                               "released); open a new TraceRecorder (resume=True) to add to it")
        current = read_lock(self.path)
        if current is not None and current.get("token") == self._lock["token"]:
            self._lock_seen = self._lock_file_identity()  # the same holder (the file was touched, not taken)
            return
        pending = sorted(r.request_id for r in self._pending) + sorted(self._open)
        lock = self.path / LOCK_FILE
        if current is None:
            what = (f"its lock file {lock} was removed while this writer held the run (by hand or by a cleanup "
                    "script)")
            advice = (f"Check that no other writer records into {self.path} now, then resume the run "
                      "(resume=True)")
        else:
            what = f"this writer's lock was broken; the run is now held by {describe_holder(current)} ({lock})"
            advice = f"Let that writer finish, or stop it and resume the run (resume=True, break_lock=True)"
        self._lock = None
        self._lost = (f"trace run {self.path}: {what}. This writer stopped {when} so that two writers never share "
                      f"a run: the {len(self._completed)} request(s) already written are kept; not written: "
                      + (f"{len(pending)} request(s) {pending[:10]}{' ...' if len(pending) > 10 else ''}" if pending
                         else "none") + f". {advice}")
        raise RunLockLostError(self._lost)

    @property
    def completed_requests(self) -> frozenset[str]:
        """Request ids whose rows are on disk (for resume: skip these)."""
        return frozenset(self._completed)

    def _check_live(self) -> None:
        if self._lost is not None:
            raise RunLockLostError(self._lost)
        if self._finished:
            raise RuntimeError(f"trace run {self.path} is finished; open a new TraceRecorder (resume=True) to add to it")

    def begin_request(self, request_id, *, category, dataset="", question_id="", prompt_tokens=0,
                      image_tokens=0, prompt_ids=None) -> None:
        """Open a request (buffered until ``end_request``); ``prompt_ids`` give ``context_match`` (else null)."""
        self._check_live()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string; got {request_id!r}")
        self._check_lock_quickly(f"before request {request_id!r}")
        if request_id in self._completed:
            raise ValueError(f"request {request_id!r} is already complete in run {self.run_id}; "
                             "skip ids in recorder.completed_requests when resuming")
        if request_id in self._open or any(r.request_id == request_id for r in self._pending):
            raise ValueError(f"duplicate request id {request_id!r}: it was already begun in this run")
        if not isinstance(category, str) or not category:
            raise ValueError(f"category of request {request_id!r} must be a non-empty string; got {category!r}")
        where = f"begin_request({request_id!r})"
        prompt_tokens = _integer(prompt_tokens, "prompt_tokens", where)
        image_tokens = _integer(image_tokens, "image_tokens", where)
        ids = None
        if prompt_ids is not None:
            ids = np.asarray(prompt_ids)
            if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)) or (ids < 0).any():
                raise ValueError(f"prompt_ids of request {request_id!r} must be a flat sequence of token ids >= 0")
            ids = ids.astype(np.int64)
        self._open[request_id] = _OpenRequest(request_id, {
            "category": category, "dataset": str(dataset), "question_id": str(question_id),
            "prompt_tokens": prompt_tokens, "image_tokens": image_tokens}, ids)

    def _request(self, request_id) -> _OpenRequest:
        req = self._open.get(request_id)
        if req is None:
            if request_id in self._completed or any(r.request_id == request_id for r in self._pending):
                raise ValueError(f"request {request_id!r} has already ended; log rounds before end_request")
            raise ValueError(f"unknown request {request_id!r}: call begin_request({request_id!r}, category=...) first")
        return req

    def log_round(self, request_id, *, round_index, start_position, context_len, block_size, tree_nodes,
                  tree_depth, accepted, token_ids, ends_at_leaf, target_logits=None, target_stats=None,
                  draft_logits=None, draft_candidates=None, draft_logprobs=None, draft_stats=None,
                  draft_ms=0.0, verify_ms=0.0, overhead_ms=0.0, policy=None) -> None:
        """Buffer one verify round. ``token_ids``: the committed tokens (depths 1..committed).

        Exactly one of ``target_logits`` (``[committed, V]``, statistics in fp32) and ``target_stats``
        (``TARGET_STAT_KEYS`` arrays). Drafter statistics: ``draft_stats`` (``DRAFT_STAT_KEYS``; NaN = null), or from
        ``draft_logits`` or ``draft_candidates`` / ``draft_logprobs``; none: null. ``policy``: the round's
        ``POLICY_COLUMNS`` (missing: null).
        """
        self._check_live()
        self._check_lock_quickly(f"at round {round_index} of request {request_id!r}", every_s=_LOCK_CHECK_EVERY_S)
        req = self._request(request_id)
        # Every check comes before the request's buffers change: a refused round leaves the recorder as it was.
        where = f"log_round(request {request_id!r}, round {round_index})"
        round_index = _integer(round_index, "round_index", where)
        start_position = _integer(start_position, "start_position", where)
        context_len = _integer(context_len, "context_len", where)
        block_size = _integer(block_size, "block_size", where, low=1, high=_INT16_MAX)
        tree_nodes = _integer(tree_nodes, "tree_nodes", where)
        tree_depth = _integer(tree_depth, "tree_depth", where, high=_INT16_MAX)
        accepted = _integer(accepted, "accepted", where, high=_INT16_MAX)
        ids = _token_ids(token_ids, where)
        committed = len(ids)
        if round_index <= req.last_round:
            raise ValueError(f"{where}: round_index must increase within a request (last was {req.last_round})")
        if start_position < req.next_position:
            raise ValueError(f"{where}: start_position {start_position} overlaps tokens already logged "
                             f"(next free output position is {req.next_position})")
        if start_position + committed > _INT32_MAX:
            raise ValueError(f"{where}: output positions up to {start_position + committed} exceed {_INT32_MAX}")
        if not 0 <= tree_depth <= block_size - 1:
            raise ValueError(f"{where}: tree_depth {tree_depth} must lie in [0, block_size - 1 = {block_size - 1}]")
        if tree_nodes < tree_depth:
            raise ValueError(f"{where}: tree_nodes {tree_nodes} < tree_depth {tree_depth}; a tree of depth D has >= D nodes")
        if not 0 <= accepted <= tree_depth:
            raise ValueError(f"{where}: accepted (tau) {accepted} must lie in [0, tree_depth = {tree_depth}]")
        if not 1 <= committed <= accepted + 1:
            raise ValueError(f"{where}: {committed} committed tokens; a round commits 1..accepted + 1 = "
                             f"{accepted + 1} tokens (tau drafts plus one target token)")
        if committed == accepted + 1 and accepted == tree_depth and not ends_at_leaf:
            raise ValueError(f"{where}: accepted == tree_depth == {tree_depth}, so the path ends at a leaf; "
                             "ends_at_leaf must be True (the last token is a bonus)")
        times = tuple(_milliseconds(value, name, where) for name, value in
                      (("draft_ms", draft_ms), ("verify_ms", verify_ms), ("overhead_ms", overhead_ms)))
        policy = _checked_policy(policy, where)

        stats = _target_stats_array(target_logits, target_stats, committed, where)
        draft = self._draft_array(draft_stats, draft_logits, draft_candidates, draft_logprobs, ids, where)

        roles = np.zeros(committed, dtype=np.int8)
        if committed == accepted + 1:
            roles[-1] = _ROLE_BONUS if ends_at_leaf else _ROLE_CORRECTION
        req.rounds.append((round_index, start_position, context_len, block_size, tree_nodes, tree_depth,
                           accepted, committed, *times))
        req.token_ids.append(ids)
        req.stats.append(stats)
        req.draft.append(draft)
        req.roles.append(roles)
        req.policy.append(policy)
        req.last_round = round_index
        req.next_position = start_position + committed
        req.n_tokens += committed

    def _draft_array(self, draft_stats, draft_logits, draft_candidates, draft_logprobs, ids, where: str):
        """The drafter's statistics per committed token ``[len(DRAFT_STAT_KEYS), committed]``, or None."""
        committed = len(ids)
        draft = None
        if draft_stats is not None:
            if draft_logits is not None or draft_candidates is not None:
                raise ValueError(f"{where}: give draft_stats or draft_logits/draft_candidates, not both")
            draft = self._draft_from_dict(draft_stats, committed, where)
        elif draft_logits is not None or draft_candidates is not None:
            d = _draft_stats(draft_logits, ids, draft_candidates, draft_logprobs)
            draft = np.array([d[key] for key in DRAFT_STAT_KEYS], dtype=np.float64)
        elif draft_logprobs is not None:
            raise ValueError(f"{where}: draft_logprobs given without draft_candidates")
        return draft

    @staticmethod
    def _draft_from_dict(stats: dict, committed: int, where: str) -> np.ndarray:
        if not isinstance(stats, dict) or set(stats) - set(DRAFT_STAT_KEYS):
            raise ValueError(f"{where}: draft_stats must be a dict with keys among {list(DRAFT_STAT_KEYS)}")
        out = np.full((len(DRAFT_STAT_KEYS), committed), np.nan)
        for row, key in enumerate(DRAFT_STAT_KEYS):
            if key in stats and stats[key] is not None:
                values = np.asarray([np.nan if v is None else v for v in stats[key]]
                                    if isinstance(stats[key], (list, tuple)) else stats[key], dtype=np.float64)
                if values.shape != (committed,):
                    raise ValueError(f"{where}: draft_stats[{key!r}] must have length committed={committed}; "
                                     f"got shape {values.shape}")
                out[row] = values
        prob, rank, ent, top1 = out
        if ((prob < 0) | (prob > 1)).any():
            raise ValueError(f"{where}: draft_stats['prob'] must lie in [0, 1]; got {prob.tolist()}")
        if ((top1 < 0) | (top1 > 1)).any():
            raise ValueError(f"{where}: draft_stats['top1_prob'] must lie in [0, 1]; got {top1.tolist()}")
        if (rank < -1).any() or (np.nan_to_num(rank) % 1 != 0).any():
            raise ValueError(f"{where}: draft_stats['rank'] must be integers >= -1 (NaN = null); got {rank.tolist()}")
        if (ent < 0).any() or np.isinf(ent).any():
            raise ValueError(f"{where}: draft_stats['entropy_nats'] must be finite and >= 0; got {ent.tolist()}")
        return out

    def end_request(self, request_id, *, new_tokens, stop_reason, prefill_ms=0.0, decode_ms=0.0,
                    decode_cpu_ms=None) -> None:
        """Close a request; its rows are written at the next flush. ``decode_cpu_ms``: this process's CPU-clock
        time of the request's rounds (None: not measured, written as null)."""
        self._check_live()
        req = self._request(request_id)
        where = f"end_request({request_id!r})"
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"{where}: stop_reason must be one of {list(STOP_REASONS)}; got {stop_reason!r}")
        new_tokens = _integer(new_tokens, "new_tokens", where)
        if new_tokens < req.next_position:
            raise ValueError(f"{where}: new_tokens {new_tokens} < {req.next_position}, the end of the last "
                             "logged round (positions count new tokens from 0)")
        prefill_ms = _milliseconds(prefill_ms, "prefill_ms", where)
        decode_ms = _milliseconds(decode_ms, "decode_ms", where)
        if decode_cpu_ms is not None:
            decode_cpu_ms = _milliseconds(decode_cpu_ms, "decode_cpu_ms", where)
        req.row = dict(req.info, new_tokens=new_tokens, rounds=len(req.rounds), stop_reason=stop_reason,
                       prefill_ms=prefill_ms, decode_ms=decode_ms, decode_cpu_ms=decode_cpu_ms)
        del self._open[request_id]
        self._pending.append(req)
        self._pending_rounds += len(req.rounds)
        if self._pending_rounds >= self.flush_every_rounds or (
                self.flush_every_requests is not None and len(self._pending) >= self.flush_every_requests):
            self.flush()

    def _build_tables(self, pending: list[_OpenRequest]) -> dict[str, pa.Table]:
        run_id = self.run_id
        n_req = len(pending)
        ids = pa.array([r.request_id for r in pending], type=pa.string())
        cats = pa.array([r.row["category"] for r in pending], type=pa.string())

        requests = {"run_id": pa.array([run_id] * n_req, pa.string()), "request_id": ids, "category": cats}
        for f in SCHEMAS["requests"]:
            if f.name not in requests:
                requests[f.name] = pa.array([r.row.get(f.name) for r in pending], type=f.type)

        rounds_per_req = np.array([len(r.rounds) for r in pending], dtype=np.int64)
        all_rounds = [t for r in pending for t in r.rounds]
        cols = list(zip(*all_rounds)) if all_rounds else [()] * 11
        req_of_round = np.repeat(np.arange(n_req, dtype=np.int32), rounds_per_req)
        n_rounds = len(all_rounds)
        rounds = {
            "run_id": pa.DictionaryArray.from_arrays(np.zeros(n_rounds, np.int32), pa.array([run_id])),
            "request_id": pa.DictionaryArray.from_arrays(req_of_round, ids),
        }
        names = ("round_index", "start_position", "context_len", "block_size", "tree_nodes", "tree_depth",
                 "accepted", "committed", "draft_ms", "verify_ms", "overhead_ms")
        for name, values in zip(names, cols):
            rounds[name] = np.asarray(values, dtype=SCHEMAS["rounds"].field(name).type.to_pandas_dtype())
        committed = rounds["committed"].astype(np.int64)
        policies = [x for r in pending for x in r.policy]
        for name in POLICY_COLUMNS:  # the round's policy columns; null for rounds without a policy
            values = [None if x is None else x.get(name) for x in policies]
            rounds[name] = pa.array(values, type=SCHEMAS["rounds"].field(name).type)

        n_tok = int(committed.sum())
        round_of_token = np.repeat(np.arange(n_rounds), committed)
        first_of_round = np.cumsum(committed) - committed
        depth = np.arange(n_tok, dtype=np.int64) - first_of_round[round_of_token] + 1
        stats = np.concatenate([s for r in pending for s in r.stats], axis=1) if n_tok else np.zeros((5, 0), np.float32)
        drafts = [d if d is not None else np.full((len(DRAFT_STAT_KEYS), len(t)), np.nan)
                  for r in pending for d, t in zip(r.draft, r.token_ids)]
        draft = np.concatenate(drafts, axis=1) if n_tok else np.zeros((len(DRAFT_STAT_KEYS), 0))
        roles = np.concatenate([x for r in pending for x in r.roles]) if n_tok else np.zeros(0, np.int8)
        token_ids = np.concatenate([x for r in pending for x in r.token_ids]) if n_tok else np.zeros(0, np.int64)
        req_of_token = req_of_round[round_of_token]
        rank_null = np.isnan(draft[1])
        tokens = {
            "run_id": pa.DictionaryArray.from_arrays(np.zeros(n_tok, np.int32), pa.array([run_id])),
            "request_id": pa.DictionaryArray.from_arrays(req_of_token, ids),
            "category": pa.DictionaryArray.from_arrays(req_of_token, cats),
            "round_index": rounds["round_index"][round_of_token],
            "position": (rounds["start_position"][round_of_token] + depth - 1).astype(np.int32),
            "depth": depth.astype(np.int16),
            "token_id": token_ids.astype(np.int32),
            "role": pa.DictionaryArray.from_arrays(roles, _ROLE_DICTIONARY),
        }
        for row, key in enumerate(TARGET_STAT_KEYS):
            tokens[f"target_{key}" if key != "entropy_nats" else "target_entropy_nats"] = stats[row]
        tokens["draft_prob"] = pa.array(draft[0].astype(np.float32), mask=np.isnan(draft[0]))
        tokens["draft_rank"] = pa.array(np.where(rank_null, 0, draft[1]).astype(np.int32), mask=rank_null)
        tokens["draft_entropy_nats"] = pa.array(draft[2].astype(np.float32), mask=np.isnan(draft[2]))
        tokens["draft_top1_prob"] = pa.array(draft[3].astype(np.float32), mask=np.isnan(draft[3]))
        tokens["context_match"] = _context_column(pending, n_tok)
        return {"tokens": _to_schema(tokens, "tokens"), "rounds": _to_schema(rounds, "rounds"),
                "requests": _to_schema(requests, "requests")}

    def _write_shard(self, tables: dict[str, pa.Table], request_ids) -> Path:
        """Write ``tables`` as a new shard (temporary directory renamed to the next free number) and mark
        ``request_ids`` completed; on failure the temporary directory is removed and the rows stay buffered."""
        self._check_lock_held()
        shards = self.path / SHARDS_DIR
        tmp = shards / temp_shard_name(self._next_seq)
        tmp.mkdir(parents=True)
        try:
            for name in ("tokens", "rounds", "requests"):
                file = tmp / table_file(name)
                strings = [f.name for f in SCHEMAS[name] if pa.types.is_string(f.type)]
                # dictionary pages only for the string keys: numbers gain nothing from them (faster, smaller)
                pq.write_table(tables[name], file, compression=_COMPRESSION, use_dictionary=strings)
                fsync_path(file)
            seq = self._next_seq
            for _ in range(_MAX_NAME_TRIES):
                final = shards / shard_name(seq)
                try:
                    os.rename(tmp, final)  # the shard appears with all three tables, or not at all
                except OSError:
                    if not os.path.lexists(final):
                        raise
                    taken = shard_dirs(self.path)  # the name is taken: skip past every finished shard
                    seq = max(seq + 1, shard_seq(taken[-1]) + 1 if taken else 0)
                    continue
                break
            else:
                raise RuntimeError(f"trace run {self.path}: no free shard number from {self._next_seq} on")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # only this writer's own unfinished copy
            raise
        self._completed.update(request_ids)
        self._next_seq = seq + 1
        fsync_path(shards)
        return final

    def flush(self) -> None:
        """Write the rows of all ended requests as one new shard (open requests stay buffered)."""
        pending = [r for r in self._pending if r.request_id not in self._completed]
        if pending:
            self._write_shard(self._build_tables(pending), [r.request_id for r in pending])
        self._pending = []
        self._pending_rounds = 0

    def finish(self) -> None:
        """Flush, mark the run complete (run.json: status "complete", end_time) and let it go (its lock)."""
        if self._finished:
            return
        self.flush()
        if self._open:
            raise ValueError(f"trace run {self.path}: requests {sorted(self._open)} were begun but not ended; "
                             "call end_request for each (the run stays incomplete)")
        self._check_lock_held()
        self.metadata["status"] = "complete"
        self.metadata["end_time"] = _utc_now()
        write_json_atomic(self.path / RUN_FILE, self.metadata)
        self._finished = True
        self._release_lock()

    def log_columns(self, *, tokens=None, rounds=None, requests=None) -> None:
        """Write complete requests given as v1 columns (dicts of arrays or pyarrow Tables; a missing table: no rows)
        as one shard, after checking values and cross-table consistency; ``run_id`` is filled in when absent."""
        self._check_live()
        tables = {}
        for name, data in (("tokens", tokens), ("rounds", rounds), ("requests", requests)):
            where = f"log_columns({name}=...)"
            tables[name] = SCHEMAS[name].empty_table() if data is None else self._columns_to_table(data, name, where)
            check_values(tables[name], name, where)
        check_run(tables["tokens"], tables["rounds"], tables["requests"], "log_columns")
        new_ids = set(tables["requests"].column("request_id").to_pylist())
        clash = new_ids & (self._completed | set(self._open) | {r.request_id for r in self._pending})
        if clash:
            raise ValueError(f"log_columns: request ids already in run {self.run_id}: {sorted(clash)[:5]}")
        self.flush()
        self._write_shard(tables, new_ids)

    def _columns_to_table(self, data, name: str, where: str) -> pa.Table:
        schema = SCHEMAS[name]
        if isinstance(data, pa.Table):
            columns = {c: data.column(c) for c in data.column_names}
            n = data.num_rows
        elif isinstance(data, dict):
            columns = dict(data)
            lengths = {k: len(v) for k, v in columns.items() if not isinstance(v, str)}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"{where}: columns have different lengths {lengths}")
            n = next(iter(lengths.values()), 0)
        else:
            raise TypeError(f"{where}: expected a dict of arrays or a pyarrow.Table; got {type(data).__name__}")
        unknown = sorted(set(columns) - set(schema.names))
        if unknown:
            raise ValueError(f"{where}: unknown column(s) {unknown}; v1 {name} columns are {schema.names}")
        if "run_id" not in columns:
            columns["run_id"] = self.run_id
        for c in added_columns(name):
            columns.setdefault(c, pa.nulls(n, type=schema.field(c).type))  # added columns may be left out
        missing = [c for c in schema.names if c not in columns]
        if missing:
            raise ValueError(f"{where}: missing column(s) {missing}; v1 {name} columns are {schema.names}")
        arrays = []
        for f in schema:
            value = columns[f.name]
            try:
                if isinstance(value, str):
                    if not pa.types.is_string(f.type):
                        raise TypeError(f"a single string for a {f.type} column")
                    array = pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([value]))
                elif isinstance(value, (pa.Array, pa.ChunkedArray)):
                    array = value
                else:
                    arr = np.asarray(value)
                    if f.nullable and arr.dtype.kind == "f":
                        array = pa.array(np.nan_to_num(arr, nan=0).astype(f.type.to_pandas_dtype()),
                                         mask=np.isnan(arr))
                    else:
                        array = pa.array(arr)
                if pa.types.is_dictionary(array.type):
                    array = array.cast(array.type.value_type)
                array = array.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError) as err:
                raise ValueError(f"{where}: column {f.name!r} cannot be stored as {f.type}: {err}") from err
            arrays.append(array)
        table = pa.Table.from_arrays(arrays, schema=schema)
        if table.num_rows:
            bad = pc.not_equal(table.column("run_id"), self.run_id)
            if pc.any(bad).as_py():
                raise ValueError(f"{where}: run_id column differs from this run's id {self.run_id!r}")
        return table


def _context_column(pending: list[_OpenRequest], n_tok: int) -> pa.Array:
    """The tokens column ``context_match`` in row order: null for a request without prompt ids or with a gap."""
    parts = []
    for r in pending:
        output = np.concatenate(r.token_ids) if r.token_ids else np.zeros(0, np.int64)
        if r.prompt_ids is None or r.next_position != output.size:
            parts.append(np.full(output.size, -1, np.int16))
        else:
            parts.append(context_matches_of_output(r.prompt_ids.tolist(), output.tolist()))
    values = np.concatenate(parts) if parts else np.zeros(0, np.int16)
    if values.size != n_tok:
        raise AssertionError(f"context_match has {values.size} values for {n_tok} token rows")
    return pa.array(np.maximum(values, 0), type=pa.int16(), mask=values < 0)


def _to_schema(columns: dict, name: str) -> pa.Table:
    schema = SCHEMAS[name]
    n = len(next(iter(columns.values())))
    arrays = []
    for f in schema:
        if f.name not in columns and f.name in added_columns(name):
            arrays.append(pa.nulls(n, type=f.type))  # an added column this writer has no value for
            continue
        value = columns[f.name]
        array = value if isinstance(value, pa.Array) else pa.array(value, type=f.type)
        if pa.types.is_dictionary(array.type):
            array = array.cast(f.type)
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema)
