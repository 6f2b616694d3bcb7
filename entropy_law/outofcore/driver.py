"""DuckDB runs the at-risk query over groups of finished Parquet shards: ``aggregate_at_risk_sql``.

A request lies in one shard, so groups of whole shards give the cells of one query over all files while memory holds one
group's rows; cells two groups share are pooled. The arm rule of ``atrisk.at_risk_table`` holds (or ``by_arm`` labels
each run with its arm).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from entropy_law.law import arms, atrisk
from entropy_law.law.fit import get_family
from entropy_law.outofcore.sql import _KEYS, _means_for, at_risk_sql

DEFAULT_CHUNK_BYTES = 256 << 20  # token files per DuckDB query (compressed Parquet on disk)


@dataclass
class _Shards:
    """The finished shards of the selected runs, and the runs table of the query."""

    dirs: list[Path]
    runs: pd.DataFrame  # run_id, drafter_id (the arms checked)


def _shards(traces_or_path, drafters: Sequence[str] | None, by_arm: bool = False) -> _Shards:
    """The selected runs' shards. ``by_arm``: ``drafter_id`` is each run's arm label (``drafters`` selects
    labels); otherwise a drafter id that holds two arms is refused."""
    from entropy_law.traces.reader import load_traces

    traces = traces_or_path if hasattr(traces_or_path, "dataset") else load_traces(traces_or_path, validate=False)
    runs = traces.runs
    for column in ("run_id", "drafter_id"):
        if column not in runs:
            raise ValueError(f"the runs lack {column!r}: every run.json of format v1 has it")
    if by_arm:
        runs = runs.assign(drafter_id=arms.run_arms(runs)["arm"].to_numpy())
    if drafters is not None:
        runs = runs.loc[runs["drafter_id"].astype(str).isin([str(d) for d in drafters])]
    runs = runs.reset_index(drop=True)
    if not by_arm:
        arms.check_one_arm_per_drafter(runs)  # never pool two arms under one drafter id
    keep = set(runs["run_id"].astype(str))
    tokens = [Path(f) for f in traces.dataset("tokens").files]
    rounds = {Path(f).parent for f in traces.dataset("rounds").files}
    dirs = []
    for file in tokens:
        if file.parent not in rounds:
            raise ValueError(f"{file.parent}: a shard without its rounds file")
        dirs.append(file.parent)
    selected = []
    run_of = {str(Path(p)): str(r) for p, r in zip(traces.runs["path"], traces.runs["run_id"])}
    for shard in dirs:
        run_id = run_of.get(str(shard.parent.parent))
        if run_id is None or run_id in keep:
            selected.append(shard)
    table = pd.DataFrame({"run_id": runs["run_id"].astype(str), "drafter_id": runs["drafter_id"].astype(str)})
    return _Shards(dirs=selected, runs=table)


def _chunks(dirs: Sequence[Path], chunk_bytes: int) -> list[list[Path]]:
    """Groups of whole shards whose token files hold about ``chunk_bytes`` on disk."""
    groups, current, size = [], [], 0
    for shard in dirs:
        nbytes = (shard / "tokens.parquet").stat().st_size
        if current and size + nbytes > chunk_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(shard)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def _views_per_group(con, shards: _Shards, chunk_bytes: int, tables=("tokens", "rounds")):
    """Register ``runs``; per group of shards make views of its ``tables``, yield its index."""
    con.register("runs", shards.runs)
    for i, group in enumerate(_chunks(shards.dirs, chunk_bytes)):
        for table in tables:
            con.read_parquet([str(s / f"{table}.parquet") for s in group]).create_view(table, replace=True)
        yield i


def _connect(threads: int | None, memory_limit: str | None, temp_directory: str | None):
    import duckdb

    con = duckdb.connect(":memory:")
    if threads is not None:
        con.execute(f"SET threads TO {int(threads)}")
    if memory_limit is not None:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET temp_directory = '{temp_directory or tempfile.gettempdir()}'")
    return con


def _query_spec(family, bin_columns, keys, means) -> tuple[tuple, tuple, list]:
    """(bin columns, cell keys, covariate means) of a family's aggregate, with the overrides given."""
    fam = get_family(family or "law_exp")
    bins = tuple(bin_columns) if bin_columns is not None else tuple(fam.bin_columns)
    keys = tuple(keys) if keys is not None else (*_KEYS, *fam.extra_keys)
    if keys[:4] != _KEYS or not set(keys[4:]) <= {"drafted_depth"}:
        raise ValueError(f"keys must be {list(_KEYS)}, optionally followed by 'drafted_depth'; got {list(keys)}")
    return bins, keys, _means_for(fam, means, with_rounds=True)


def aggregate_at_risk_sql(traces, family: str | None = None, *, bin_columns: Sequence[str] | None = None,
                          keys: Sequence[str] | None = None, width_log10: float = 0.05, eps: float = atrisk.EPS_NATS,
                          means: str = "all", drafters: Sequence[str] | None = None, by_arm: bool = False,
                          on_invalid: str = "raise", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                          threads: int | None = None, memory_limit: str | None = None,
                          temp_directory: str | None = None) -> pd.DataFrame:
    """``aggregate_at_risk(at_risk_table(traces))`` computed by DuckDB over the Parquet shards.

    ``traces``: a run directory, a folder of runs or a ``TraceSet``. ``family``: its bin columns and extra keys (default
    ``law_exp``), overridden by ``bin_columns`` / ``keys``. ``means``: ``"all"`` or ``"family"`` (those the formula
    reads). ``drafters``: these ids (arm labels with ``by_arm``). ``on_invalid``: as ``at_risk_table``. ``chunk_bytes``:
    token bytes per query; ``threads``, ``memory_limit``, ``temp_directory``: DuckDB settings.
    """
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bins, keys, columns = _query_spec(family, bin_columns, keys, means)
    sql = at_risk_sql(bin_columns=bins, width_log10=width_log10, eps=eps, means=columns,
                      drafted_depth_key="drafted_depth" in keys)
    shards = _shards(traces, drafters, by_arm)
    con = _connect(threads, memory_limit, temp_directory)
    try:
        parts = [_fetch_arrow(con.sql(sql)) for _ in _views_per_group(con, shards, chunk_bytes)]
    finally:
        con.close()
    return _finish(parts, bins, keys, columns, eps=eps, width_log10=width_log10, on_invalid=on_invalid)


def _fetch_arrow(result):
    """A DuckDB relation's rows as a pyarrow Table (``to_arrow_table``; ``arrow`` in older DuckDB)."""
    for name in ("to_arrow_table", "arrow"):
        method = getattr(result, name, None)
        if method is not None:
            return method()
    raise RuntimeError("this DuckDB has no Arrow export of a result (need duckdb >= 1.1)")


_STRING_KEYS = ("drafter_id", "category", "request_id")


def _finish(parts, bins, keys, means, *, eps, width_log10, on_invalid) -> pd.DataFrame:
    """The cells of every query as ``aggregate_at_risk`` returns them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bin_names = [f"bin_{c}" for c in bins]
    ordered = [*keys, *bin_names, "n_acc", "n", *means, "n_rej"]
    cell = [*keys, *bin_names]
    types = {c: pa.string() if c in _STRING_KEYS else pa.float64() if c in means else pa.int64() for c in ordered}
    tables = [t.select(ordered).cast(pa.schema([(c, types[c]) for c in ordered])) for t in parts]
    table = pa.concat_tables(tables) if tables else pa.schema([(c, types[c]) for c in ordered]).empty_table()
    if bin_names:
        invalid = pc.is_null(table.column(bin_names[0]))
        for name in bin_names[1:]:
            invalid = pc.or_(invalid, pc.is_null(table.column(name)))
        if pc.any(invalid).as_py():
            bad = table.filter(invalid)
            if on_invalid == "raise":
                examples = pc.unique(bad.column("request_id")).to_pylist()[:3]
                raise ValueError(f"invalid covariates at at-risk positions: {pc.sum(bad.column('n')).as_py()} rows "
                                 f"with NaN, infinite or negative values (e.g. requests {examples}). Fix the traces, "
                                 "or pass on_invalid='drop' to drop those rows (their rounds stay in).")
            table = table.filter(pc.invert(invalid))
    table = table.sort_by([(c, "ascending") for c in cell])
    for name in _STRING_KEYS:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pc.dictionary_encode(table.column(name)))
    frame = table.to_pandas()
    for name in _STRING_KEYS:  # as the pandas path: object columns
        frame[name] = frame[name].astype(object)
    attrs = dict(kind=atrisk.KIND_AGGREGATED, eps=eps, width_log10=width_log10, bin_columns=tuple(bins),
                 keys=tuple(keys))
    decode_time = tuple(m for m in means if m in atrisk.DECODE_TIME)
    if decode_time:
        attrs["extra_means"] = decode_time
    if len(frame) > 1:  # one drafter's runs share a request id: their cells pooled, as the pandas path does
        same = np.ones(len(frame) - 1, dtype=bool)
        for name in cell:
            values = frame[name].to_numpy()
            same &= values[1:] == values[:-1]
        if same.any():
            frame.attrs.update(attrs)
            frame = atrisk.combine_aggregates([frame])[ordered]
    frame.attrs.update(attrs)
    return frame


def finish_cells(result, family: str | None = None, *, bin_columns: Sequence[str] | None = None,
                 keys: Sequence[str] | None = None, width_log10: float = 0.05, eps: float = atrisk.EPS_NATS,
                 means: str = "all", on_invalid: str = "raise") -> pd.DataFrame:
    """The rows of ``at_risk_sql(...)`` run elsewhere (a DataFrame or Arrow table, e.g. from Spark) as the aggregate
    ``fit_law`` takes, for the query's ``family`` (or ``bin_columns`` / ``keys``) and ``means``; arms unchecked."""
    import pyarrow as pa

    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bins, keys, columns = _query_spec(family, bin_columns, keys, means)
    table = result if isinstance(result, pa.Table) else pa.Table.from_pandas(result, preserve_index=False)
    return _finish([table], bins, keys, columns, eps=eps, width_log10=width_log10, on_invalid=on_invalid)
