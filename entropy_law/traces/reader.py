"""``load_traces``: read trace runs (format v2, and v1) into pandas / Arrow, validating on the way.

Known here: how to find runs (directories with ``run.json``), which shards to read (finished ones, never leftovers or
the quarantine), filtering by run and category, and when to warn. String keys come back as pandas ``Categorical``. Never
imports torch.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from entropy_law.traces.layout import (QUARANTINE_DIR, RUN_FILE, SHARDS_DIR, describe_holder, lock_state, quarantined,
                                       read_lock, read_run_json, shard_dirs, table_file, unfinished_shards)
from entropy_law.traces.schema import READABLE_FORMAT_VERSIONS, RUN_METADATA_KEYS, SCHEMAS, TABLES, added_columns
from entropy_law.traces.validation import TraceValidationError, check_run, check_run_shards, check_values

_DICTIONARY_COLUMNS = ("run_id", "request_id", "category", "role", "dataset", "stop_reason")


@dataclass
class _Run:
    run_id: str
    path: Path
    metadata: dict
    files: dict[str, list[Path]]  # table -> one file per finished shard
    tables: dict[str, pa.Table] = field(default_factory=dict)  # loaded lazily, cached


def _find_run_dirs(path: Path) -> list[Path]:
    if (path / RUN_FILE).is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob(RUN_FILE) if not p.parent.name.startswith("."))
    return [p for p in found if not {SHARDS_DIR, QUARANTINE_DIR} & set(p.relative_to(path).parts)]


def _open_run(run_dir: Path) -> _Run:
    meta = read_run_json(run_dir / RUN_FILE)
    version = meta.get("format_version")
    if version not in READABLE_FORMAT_VERSIONS:
        raise TraceValidationError(f"{run_dir / RUN_FILE}: unknown format version {version!r}; this package reads "
                                   f"{', '.join(f'v{v}' for v in READABLE_FORMAT_VERSIONS)} (upgrade entropy-law "
                                   "to read newer runs)")
    missing = [k for k in RUN_METADATA_KEYS if k not in meta]
    if missing:
        raise TraceValidationError(f"{run_dir / RUN_FILE}: run metadata is missing key(s) {missing}")
    files: dict[str, list[Path]] = {t: [] for t in TABLES}
    for shard in shard_dirs(run_dir):
        for table in TABLES:
            file = shard / table_file(table)
            if not file.is_file():
                raise TraceValidationError(f"{shard}: shard has no {table_file(table)} (a shard holds "
                                           f"{', '.join(table_file(t) for t in TABLES)}); it is damaged")
            files[table].append(file)
    return _Run(run_id=meta["run_id"], path=run_dir, metadata=meta, files=files)


def _read_file(file: Path, table: str) -> pa.Table:
    schema = SCHEMAS[table]
    dictionary = [c for c in _DICTIONARY_COLUMNS if c in schema.names]
    try:
        present = set(pq.read_schema(file).names)
        data = pq.read_table(file, columns=[c for c in schema.names if c in present], read_dictionary=dictionary)
    except (pa.ArrowInvalid, OSError) as err:
        raise TraceValidationError(f"{file}: cannot read as Parquet ({err})") from err
    return with_added_columns(data, table_name=table)


def with_added_columns(table: pa.Table, *, table_name: str) -> pa.Table:
    """``table`` with every v1 column in schema order; added columns an older file lacks become nulls."""
    schema = SCHEMAS[table_name]
    missing = [f for f in schema if f.name not in table.column_names]
    unknown = [f.name for f in missing if f.name not in added_columns(table_name)]
    if unknown:
        raise TraceValidationError(f"{table_name} table is missing column(s) {unknown}")
    for f in missing:
        table = table.append_column(f, pa.nulls(table.num_rows, type=f.type))
    return table.select(schema.names)


def _dictionary_schema(table: str) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type) if f.name in _DICTIONARY_COLUMNS else f.type,
                               nullable=f.nullable) for f in SCHEMAS[table]])


def _concat(tables: list[pa.Table], table: str) -> pa.Table:
    if not tables:
        return _dictionary_schema(table).empty_table()
    return pa.concat_tables(tables, promote_options="default").unify_dictionaries()


def _request_ids(table: pa.Table) -> pa.Array:
    """The ``request_id`` column as one plain string array."""
    ids = table.column("request_id").combine_chunks()
    return ids.dictionary_decode() if pa.types.is_dictionary(ids.type) else ids


class TraceSet:
    """Traces of one or more runs, keyed by ``run_id`` + ``request_id``, rows in on-disk order.

    ``.tokens``, ``.rounds``, ``.requests``: pandas DataFrames (cached); ``.table(name)``: the Arrow table;
    ``.dataset(name)``: a lazy ``pyarrow.dataset``; ``.runs`` / ``.metadata``: per run; ``.filter(...)``: a subset.
    """

    def __init__(self, runs: list[_Run], *, categories: tuple[str, ...] | None = None, validate: bool = True):
        self._runs = runs
        self._categories = categories
        self._validate = validate
        self._pandas: dict[str, pd.DataFrame] = {}

    def __repr__(self) -> str:
        cats = "all" if self._categories is None else list(self._categories)
        return f"TraceSet({len(self._runs)} run(s): {[r.run_id for r in self._runs]}, categories: {cats})"

    # -- metadata ---------------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, dict]:
        return {r.run_id: dict(r.metadata) for r in self._runs}

    def row_counts(self) -> dict[str, int]:
        """Rows per table of the selected runs from the Parquet footers (no category selection: an upper bound then)."""
        return {name: sum(pq.ParquetFile(f).metadata.num_rows for r in self._runs for f in r.files[name])
                for name in TABLES}

    @property
    def runs(self) -> pd.DataFrame:
        rows = []
        for r in self._runs:
            row = {"run_id": r.run_id, "status": r.metadata.get("status"), "path": str(r.path),
                   "shards": len(r.files["tokens"])}
            row.update({k: v for k, v in r.metadata.items() if k not in row and k not in ("format",)})
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def summary(self) -> pd.DataFrame:
        """Per run: status, requests, rounds, tokens, mean accepted (tau) and committed per round."""
        rows = []
        for r in self._runs:
            rounds = self._run_table(r, "rounds")
            n = rounds.num_rows
            rows.append({
                "run_id": r.run_id, "status": r.metadata.get("status"),
                "requests": self._run_table(r, "requests").num_rows, "rounds": n,
                "tokens": self._run_table(r, "tokens").num_rows,
                "mean_accepted": pc.mean(rounds.column("accepted")).as_py() if n else float("nan"),
                "mean_committed": pc.mean(rounds.column("committed")).as_py() if n else float("nan"),
            })
        return pd.DataFrame(rows)

    # -- tables -----------------------------------------------------------------------------------------
    def _load(self, run: _Run, table: str) -> pa.Table:
        if table not in run.tables:
            parts = []
            for file in run.files[table]:
                part = _read_file(file, table)
                if self._validate:
                    check_values(part, table, str(file))
                parts.append(part)
            run.tables[table] = _concat(parts, table)
        return run.tables[table]

    def _run_table(self, run: _Run, table: str) -> pa.Table:
        full = self._load(run, table)
        if self._categories is None:
            return full
        if table == "rounds":
            reqs = self._load(run, "requests")
            ids = _request_ids(reqs.filter(pc.is_in(reqs.column("category"), value_set=pa.array(self._categories))))
            return full.filter(pc.is_in(full.column("request_id"), value_set=ids))
        return full.filter(pc.is_in(full.column("category"), value_set=pa.array(self._categories)))

    def table(self, name: str) -> pa.Table:
        """The Arrow table ``name`` (tokens, rounds or requests) of the selected runs and categories."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; choose one of {list(TABLES)}")
        return _concat([self._run_table(r, name) for r in self._runs], name)

    def _frame(self, name: str) -> pd.DataFrame:
        if name not in self._pandas:
            self._pandas[name] = self.table(name).to_pandas(split_blocks=True)
        return self._pandas[name]

    tokens = property(lambda self: self._frame("tokens"))
    rounds = property(lambda self: self._frame("rounds"))
    requests = property(lambda self: self._frame("requests"))

    def dataset(self, name: str) -> ds.Dataset:
        """A lazy ``pyarrow.dataset`` over table ``name``'s files (filtered by category; not validated)."""
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r}; choose one of {list(TABLES)}")
        files = [str(f) for r in self._runs for f in r.files[name]]
        fmt = ds.ParquetFileFormat(read_options={"dictionary_columns": [
            c for c in _DICTIONARY_COLUMNS if c in SCHEMAS[name].names]})
        dataset = ds.dataset(files, schema=_dictionary_schema(name), format=fmt)
        if self._categories is None:
            return dataset
        if name == "rounds":  # no category column: select the chosen requests of each run
            expression = pc.scalar(False)
            for r in self._runs:
                ids = _request_ids(self._run_table(r, "requests"))
                expression = expression | ((pc.field("run_id") == r.run_id) & pc.field("request_id").isin(ids))
            return dataset.filter(expression)
        return dataset.filter(pc.field("category").isin(pa.array(self._categories)))

    # -- selection ----------------------------------------------------------------------------------------
    def filter(self, *, run_id=None, category=None) -> "TraceSet":
        """A TraceSet restricted to some runs (id or list of ids) and/or categories (name or list)."""
        runs = self._runs
        if run_id is not None:
            wanted = [run_id] if isinstance(run_id, str) else list(run_id)
            known = {r.run_id for r in runs}
            unknown = [w for w in wanted if w not in known]
            if unknown:
                raise ValueError(f"unknown run id(s) {unknown}; runs here: {sorted(known)}")
            runs = [r for r in runs if r.run_id in wanted]
        categories = self._categories
        if category is not None:
            wanted_cats = (category,) if isinstance(category, str) else tuple(category)
            present = set()
            for r in runs:
                present.update(pc.unique(self._load(r, "requests").column("category")
                                         .cast(pa.string())).to_pylist())
            missing = [c for c in wanted_cats if c not in present]
            if missing and not (set(wanted_cats) & present):
                raise ValueError(f"no request of category {missing} in the selected runs; "
                                 f"categories present: {sorted(present)}")
            categories = wanted_cats if categories is None else tuple(c for c in categories if c in wanted_cats)
        return TraceSet(runs, categories=categories, validate=self._validate)

    def with_context_match(self, lengths: pd.DataFrame) -> "TraceSet":
        """This TraceSet with the tokens column ``context_match`` filled from ``lengths`` (``run_id``, ``request_id``,
        ``position``, ``context_match``: ``jobs.reference.context_matches``). A value that differs from a recorded one,
        an unknown run, duplicate or negative rows: ValueError."""
        given = checked_context_matches(lengths, "lengths")
        known = {r.run_id for r in self._runs}
        unknown = sorted(set(given["run_id"]) - known)
        if unknown:
            raise ValueError(f"lengths names runs {unknown} that this TraceSet does not hold: {sorted(known)}")
        runs = []
        for run in self._runs:
            part = given.loc[given["run_id"] == run.run_id]
            if part.empty:
                runs.append(run)
                continue
            tokens = self._load(run, "tokens")
            keys = pd.DataFrame({"request_id": tokens.column("request_id").cast(pa.string()).to_numpy(),
                                 "position": tokens.column("position").to_numpy()})
            merged = keys.merge(part.drop(columns="run_id"), on=["request_id", "position"], how="left",
                                validate="many_to_one")["context_match"].to_numpy(dtype=float)
            recorded = tokens.column("context_match").to_numpy(zero_copy_only=False).astype(float)
            clash = ~np.isnan(merged) & ~np.isnan(recorded) & (merged != recorded)
            if clash.any():
                raise ValueError(f"run {run.run_id!r}: {int(clash.sum())} given context_match values differ from "
                                 "the recorded ones")
            value = np.where(np.isnan(recorded), merged, recorded)
            column = pa.array(np.nan_to_num(value).astype(np.int16), mask=np.isnan(value))
            index = tokens.schema.get_field_index("context_match")
            filled = tokens.set_column(index, tokens.schema.field(index), column)
            runs.append(_Run(run.run_id, run.path, run.metadata, run.files, {**run.tables, "tokens": filled}))
        return TraceSet(runs, categories=self._categories, validate=self._validate)

    def validate(self) -> None:
        """Read and check every shard in threads (raises on the first problem); keep the tables."""
        for run in self._runs:
            shards = list(zip(*(run.files[t] for t in TABLES)))
            with ThreadPoolExecutor(max_workers=min(len(shards), os.cpu_count() or 1) or 1) as pool:
                checked = list(pool.map(_read_checked_shard, shards))  # re-raises the first shard's error
            for i, table in enumerate(TABLES):  # request ids unique across shards: checked on loading
                run.tables[table] = _concat([parts[i] for parts in checked], table)


def checked_context_matches(lengths, name: str) -> pd.DataFrame:
    """``lengths`` (``run_id``, ``request_id``, ``position``, ``context_match``: one row per output position, as
    ``jobs.reference.context_matches`` returns) checked, with string keys; ``name``: what the errors call it."""
    needed = ("run_id", "request_id", "position", "context_match")
    if not isinstance(lengths, pd.DataFrame) or any(c not in lengths for c in needed):
        raise ValueError(f"{name} must be a DataFrame with columns {list(needed)} (one row per output position; "
                         "jobs.reference.context_matches makes it from a recorded run)")
    given = lengths[list(needed)].astype({"run_id": str, "request_id": str})
    if given["context_match"].isna().any() or (given["context_match"] < 0).any():
        raise ValueError(f"{name} holds missing or negative context_match values")
    if given.duplicated(["run_id", "request_id", "position"]).any():
        raise ValueError(f"{name} holds several rows for one (run_id, request_id, position)")
    return given


def _read_checked_shard(files: tuple[Path, ...]) -> list[pa.Table]:
    tables = []
    for file, table in zip(files, TABLES):
        part = _read_file(file, table)
        check_values(part, table, str(file))
        tables.append(part)
    check_run(*tables, where=str(files[0].parent))
    return tables


def load_traces(path, *, run_id=None, category=None, validate: bool = True) -> TraceSet:
    """Load trace runs from ``path``: a run directory, a folder searched recursively, or a list of them (a run reached
    twice is read once; two folders with one run id are an error).

    ``validate=True`` reads and checks every file now (``TraceValidationError`` names the file and first bad row);
    ``validate=False`` applies the cheap shard checks and reads tables when first used. An incomplete run, or one with a
    crashed writer's leftovers, loads with a ``UserWarning``.
    """
    roots = [Path(p) for p in ([path] if isinstance(path, (str, os.PathLike)) else path)]
    if not roots:
        raise ValueError("no trace path given")
    run_dirs, resolved = [], set()
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(f"trace path {root} does not exist")
        found = _find_run_dirs(root) if root.is_dir() else []
        if not found:
            raise FileNotFoundError(f"no trace run under {root}: a run is a directory with {RUN_FILE} "
                                    "(written by entropy_law.TraceRecorder)")
        for d in found:
            if d.resolve() not in resolved:
                resolved.add(d.resolve())
                run_dirs.append(d)
    runs = []
    seen: dict[str, Path] = {}
    for run_dir in run_dirs:
        run = _open_run(run_dir)
        if run.run_id in seen:
            raise TraceValidationError(f"run id {run.run_id!r} appears twice: {seen[run.run_id]} and {run_dir}")
        seen[run.run_id] = run_dir
        check_run_shards([f.parent for f in run.files["requests"]], f"run {run.run_id!r} at {run_dir}")
        runs.append(run)
    traces = TraceSet(runs, validate=validate)
    if run_id is not None or category is not None:
        traces = traces.filter(run_id=run_id)
    if validate:
        traces.validate()
    if category is not None:
        traces = traces.filter(category=category)
    for run in traces._runs:
        for message in _run_warnings(run):
            warnings.warn(message, UserWarning, stacklevel=2)
    return traces


def _run_warnings(run: _Run) -> list[str]:
    """What a reader of ``run`` must be told: it is incomplete (and who holds it), or its folder holds leftovers."""
    messages = []
    holder = read_lock(run.path)
    state = lock_state(holder) if holder is not None else None
    status = run.metadata.get("status")
    tmp = unfinished_shards(run.path)
    leftover = (f"{len(tmp)} unfinished temporary shard(s) ({', '.join(p.name for p in tmp[:3])}"
                f"{', ...' if len(tmp) > 3 else ''})")
    if status != "complete":
        writer = ""
        if state == "live":
            writer = f"; its writer, {describe_holder(holder)}, is still running"
        elif state is not None:
            writer = (f"; its writer's lock is {'stale' if state == 'stale' else 'left'} ({describe_holder(holder)}"
                      f"{' is not running' if state == 'stale' else ''}): resume it with break_lock=True "
                      "(entropy-law record --resume --break-lock)")
        ignored = (f"; ignored {leftover}, not read: resuming the run moves them to its quarantine folder"
                   if tmp else "")
        messages.append(
            f"trace run {run.run_id!r} at {run.path} is incomplete (status {status!r}): its writer did not "
            f"finish (crashed, interrupted, or still running); loaded {len(run.files['tokens'])} finished "
            f"shard(s){ignored}{writer}")
    elif tmp:
        messages.append(
            f"trace run {run.run_id!r} at {run.path} is complete but holds {leftover} of a writer that stopped "
            "while writing them; they are not part of the run and are not read. Inspect them (resuming the run "
            "moves them to its quarantine folder), then delete them")
    kept = quarantined(run.path)
    if kept:
        messages.append(
            f"trace run {run.run_id!r} at {run.path} holds {len(kept)} quarantined leftover(s) in "
            f"{run.path / QUARANTINE_DIR} ({', '.join(p.name for p in kept[:3])}{', ...' if len(kept) > 3 else ''}): "
            "unfinished or damaged shards of an earlier writer, not part of the run and not read; run.json lists them "
            "under 'quarantined'. Inspect them, then delete the folder")
    return messages
