"""Out of core: the aggregated at-risk table of many runs as one SQL query over the Parquet shards.

Known here: the aggregation of ``atrisk.aggregate_at_risk`` (counts per drafter x category x request x depth
x log-spaced covariate bin, with within-cell covariate means) written down as ONE SQL query over three tables,
``tokens`` and ``rounds`` (the trace files, format v1) and ``runs`` (``run_id -> drafter_id``, from each
``run.json``), in the SQL that DuckDB and Spark SQL share (``at_risk_sql``; ``docs/out-of-core.md``); and
its embedded driver (``aggregate_at_risk_sql``): DuckDB runs the query over groups of finished shards, each
group's tables views over its files, so memory holds one group's rows and the growing table of cells, never
all the rows. A request, hence a round, lies in one shard, so every window of the query (the cumulative
entropy of a round) lies in one group, and groups give the same cells as one query over all files; cells of
two groups that share a key (one drafter's runs reusing a request id, which the in-memory path pools too)
are merged by ``atrisk.combine_aggregates``. ``fit_law_out_of_core`` fits a law family on the result.

The arm rule of ``arms`` holds here as in ``atrisk.at_risk_table``: the runs selected by ``drafter_id``
must be one arm each (``arms.check_one_arm_per_drafter``), else the query is not run. Which rows are at risk,
the covariates and their checks are those of ``atrisk`` (a test compares both paths cell by cell).

Not known here: how traces are written, model fits (``fit``). No torch; DuckDB is imported when a query runs.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from entropy_law.law import arms, atrisk
from entropy_law.law.fit import get_family

# covariate column -> (trace column, SQL name of its checked value in the query)
_TRACE_COLUMNS = {"target_entropy_nats": "h", "target_renyi2_nats": "h2", "target_top1_prob": "p1",
                  "target_logit_gap": "gap"}
_LOG_OF = {"log_entropy": "h", "log_renyi2": "h2", "log_logit_gap": "gap"}
_KEYS = tuple(atrisk.KEY_COLUMNS)  # drafter_id, category, request_id, depth
DEFAULT_CHUNK_BYTES = 256 << 20  # token files per DuckDB query (compressed Parquet on disk)


def _literal(value: float) -> str:
    """A DOUBLE literal both DuckDB and Spark SQL read as the same IEEE double (``0.001E0``, ``1e-05``)."""
    text = repr(float(value))
    return text if "e" in text or "inf" in text or "nan" in text else f"{text}E0"


def _means_for(family, means: str, with_rounds: bool) -> list[str]:
    """Covariate means the aggregate keeps: all of ``atrisk.mean_columns`` (``"all"``, what the pandas path
    keeps) or only those the family's formula reads (``"family"``: fewer columns, the same fit)."""
    every = [*atrisk.COVARIATES, *atrisk.DERIVED]
    if not with_rounds:
        every.remove("log_drafted_depth")
    if means == "all":
        return every
    if means != "family":
        raise ValueError("means must be 'all' (every covariate mean, as aggregate_at_risk) or 'family'")
    terms = family.terms or "log_entropy"  # law_iso: isotonic in the cells' mean log entropy
    used = [c for c in every if re.search(rf"\b{c}\b", terms)]
    if family.name == "law_exp_mundlak":
        used.append("log_entropy")
    return sorted(set(used), key=every.index)


def at_risk_sql(*, bin_columns: Sequence[str] = ("target_entropy_nats",), width_log10: float = 0.05,
                eps: float = atrisk.EPS_NATS, means: Sequence[str] | None = None,
                drafted_depth_key: bool = False) -> str:
    """The aggregation as one SQL query over the tables ``tokens``, ``rounds`` and ``runs``.

    Returns one row per cell: the keys ``drafter_id, category, request_id, depth`` (and ``drafted_depth`` with
    ``drafted_depth_key``), one ``bin_<column>`` per ``bin_columns`` (``floor((log10(x + eps) - log10(eps)) /
    width_log10)``, NULL for rows whose covariates fail the checks of ``atrisk.validate_covariates``: the
    driver refuses or drops those cells), ``n_acc``, ``n`` and ``n_rej`` and the mean of every column of
    ``means`` (default: all of ``atrisk.COVARIATES`` and ``atrisk.DERIVED``). It uses only what DuckDB and
    Spark SQL both read the same way (CTEs, CASE, CAST, GREATEST, LN, LOG10, FLOOR, a ROWS window); the
    ``rounds`` join is there only when ``log_drafted_depth`` or the ``drafted_depth`` key is asked for.
    """
    means = list(means) if means is not None else [*atrisk.COVARIATES, *atrisk.DERIVED]
    unknown = sorted(set(means) - set(atrisk.COVARIATES) - set(atrisk.DERIVED))
    if unknown:
        raise ValueError(f"unknown covariate means {unknown}; known: {[*atrisk.COVARIATES, *atrisk.DERIVED]}")
    bad_bins = sorted(set(bin_columns) - set(atrisk.COVARIATES) - {"cum_entropy_nats"})
    if bad_bins:
        raise ValueError(f"cannot bin {bad_bins}; bin columns are covariates or cum_entropy_nats")
    with_rounds = drafted_depth_key or "log_drafted_depth" in means
    needs_cum = "cum_entropy_nats" in bin_columns or {"cum_entropy_nats", "log1p_cum_entropy"} & set(means)
    lo, hi, inf = _literal(-atrisk.NEGATIVE_TOLERANCE), "CAST('Infinity' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)"
    e = _literal(eps)

    # 1. the at-risk rows with the round's drafted depth where needed, and the row check of validate_covariates
    drafted = ",\n        d.tree_depth AS drafted_depth" if with_rounds else ""
    join_rounds = ("\n    JOIN rounds AS d\n      ON d.run_id = t.run_id AND d.request_id = t.request_id"
                   " AND d.round_index = t.round_index" if with_rounds else "")
    at_risk = f"""at_risk AS (
    SELECT t.run_id, r.drafter_id, t.category, t.request_id, t.round_index, t.depth,
        CASE WHEN t.role = 'accepted' THEN 1 ELSE 0 END AS accepted,
        CAST(t.target_entropy_nats AS DOUBLE) AS h,
        CAST(t.target_renyi2_nats AS DOUBLE) AS h2,
        CAST(t.target_top1_prob AS DOUBLE) AS p1,
        CAST(t.target_logit_gap AS DOUBLE) AS gap{drafted}
    FROM tokens AS t
    JOIN runs AS r ON r.run_id = t.run_id{join_rounds}
    WHERE t.role IN ('accepted', 'correction')
)"""
    # NaN fails every comparison in both engines, so the range checks also refuse NaN (and NULL)
    checked = f"""checked AS (
    SELECT *,
        (h >= {lo} AND h < {hi}
         AND h2 >= {lo} AND h2 < {hi}
         AND gap >= {lo} AND gap < {hi}
         AND p1 > {inf} AND p1 < {hi}) AS valid
    FROM at_risk
)"""
    # 2. covariates: entropies and gaps in [-1e-5, 0) are fp32 round-off, set to 0 (as validate_covariates)
    cols = ["drafter_id", "category", "request_id", "depth", "accepted", "valid"]
    if with_rounds:
        cols.append("drafted_depth")
    value = {"target_entropy_nats": "GREATEST(h, 0.0E0)", "target_renyi2_nats": "GREATEST(h2, 0.0E0)",
             "target_top1_prob": "p1", "target_logit_gap": "GREATEST(gap, 0.0E0)"}
    for name in atrisk.COVARIATES:
        cols.append(f"CASE WHEN valid THEN {value[name]} END AS {name}")
    if needs_cum:  # sum of H over the round's earlier at-risk depths: the inclusive running sum minus H
        cols.append("CASE WHEN valid THEN SUM(CASE WHEN valid THEN GREATEST(h, 0.0E0) ELSE 0.0E0 END) OVER (\n"
                    "            PARTITION BY run_id, request_id, round_index ORDER BY depth\n"
                    "            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - GREATEST(h, 0.0E0) END"
                    " AS cum_entropy_nats")
    covariates = "covariates AS (\n    SELECT " + ",\n        ".join(cols) + "\n    FROM checked\n)"

    # 3. derived columns and bins
    log10_eps = _literal(np.log10(eps))
    width = _literal(width_log10)
    derived = ["*"]
    for name, source in _LOG_OF.items():
        if name in means:
            column = {"h": "target_entropy_nats", "h2": "target_renyi2_nats", "gap": "target_logit_gap"}[source]
            derived.append(f"LN({column} + {e}) AS {name}")
    if "log1p_cum_entropy" in means:
        derived.append("LN(1.0E0 + GREATEST(cum_entropy_nats, 0.0E0)) AS log1p_cum_entropy")
    if "log_drafted_depth" in means:
        derived.append("LN(GREATEST(CAST(drafted_depth AS DOUBLE), 1.0E0)) AS log_drafted_depth")
    for column in bin_columns:
        derived.append(f"CAST(FLOOR((LOG10({column} + {e}) - ({log10_eps})) / {width}) AS BIGINT) AS bin_{column}")
    binned = "binned AS (\n    SELECT " + ",\n        ".join(derived) + "\n    FROM covariates\n)"

    # 4. one row per cell
    keys = [*_KEYS, *(["drafted_depth"] if drafted_depth_key else []), *[f"bin_{c}" for c in bin_columns]]
    out = [*keys, "SUM(accepted) AS n_acc", "COUNT(*) AS n"]
    out += [f"AVG({m}) AS {m}" for m in means]
    out.append("COUNT(*) - SUM(accepted) AS n_rej")
    select = ("SELECT " + ",\n       ".join(out) + "\nFROM binned\nGROUP BY " + ", ".join(keys))
    return "WITH " + ",\n".join([at_risk, checked, covariates, binned]) + "\n" + select


# ------------------------------------------------------------------------------------- the DuckDB driver


@dataclass
class _Shards:
    """The finished shards of the selected runs, and the runs table of the query."""

    dirs: list[Path]
    runs: pd.DataFrame  # run_id, drafter_id (the arms checked)


def _shards(traces_or_path, drafters: Sequence[str] | None) -> _Shards:
    from entropy_law.traces.reader import load_traces

    traces = traces_or_path if hasattr(traces_or_path, "dataset") else load_traces(traces_or_path, validate=False)
    runs = traces.runs
    for column in ("run_id", "drafter_id"):
        if column not in runs:
            raise ValueError(f"the runs lack {column!r}: every run.json of format v1 has it")
    if drafters is not None:
        runs = runs.loc[runs["drafter_id"].astype(str).isin([str(d) for d in drafters])]
    runs = runs.reset_index(drop=True)
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


def aggregate_at_risk_sql(
    traces,
    family: str | None = None,
    *,
    bin_columns: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    width_log10: float = 0.05,
    eps: float = atrisk.EPS_NATS,
    means: str = "all",
    drafters: Sequence[str] | None = None,
    on_invalid: str = "raise",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threads: int | None = None,
    memory_limit: str | None = None,
    temp_directory: str | None = None,
) -> pd.DataFrame:
    """``aggregate_at_risk(at_risk_table(traces))`` computed by DuckDB over the Parquet shards, out of core.

    ``traces``: a run directory, a folder of runs (searched as ``load_traces`` does) or a ``TraceSet`` (its
    selection of runs is used; a category selection is not: select categories in the cells). The
    result has the columns, order of cells and ``attrs`` of ``atrisk.aggregate_at_risk`` (string keys as
    object columns), so ``fit_law`` takes it as it is. ``family``: bin columns and extra keys of that law
    family (default: ``law_exp``: bins of the target entropy, keys drafter x category x request x depth);
    ``bin_columns`` / ``keys`` override them. ``means``: ``"all"`` keeps every covariate mean (the pandas
    path's columns), ``"family"`` only those the family's formula reads (less memory, the same fit).
    ``drafters``: only these drafter ids. ``on_invalid``: ``"raise"`` (default) or ``"drop"`` rows with NaN,
    infinite or negative covariates, as ``at_risk_table``. ``chunk_bytes``: token files per query (memory
    holds one group of shards' rows); ``threads``, ``memory_limit`` (e.g. ``"2GB"``) and ``temp_directory``
    (where DuckDB spills) are DuckDB settings.
    """
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bins, keys, columns = _query_spec(family, bin_columns, keys, means)
    sql = at_risk_sql(bin_columns=bins, width_log10=width_log10, eps=eps, means=columns,
                      drafted_depth_key="drafted_depth" in keys)
    shards = _shards(traces, drafters)
    con = _connect(threads, memory_limit, temp_directory)
    try:
        con.register("runs", shards.runs)
        parts = []
        for group in _chunks(shards.dirs, chunk_bytes):
            con.read_parquet([str(s / "tokens.parquet") for s in group]).create_view("tokens", replace=True)
            con.read_parquet([str(s / "rounds.parquet") for s in group]).create_view("rounds", replace=True)
            parts.append(_fetch_arrow(con.sql(sql)))
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
    """The cells of every query as ``aggregate_at_risk`` returns them. Sorted in Arrow, with the string keys
    dictionary-encoded until the end (object columns whose rows share one Python string per value), since the
    cells of a large fleet number about half its rows."""
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
    for name in _STRING_KEYS:  # as the pandas path: object columns (here sharing one str per value)
        frame[name] = frame[name].astype(object)
    attrs = dict(kind=atrisk.KIND_AGGREGATED, eps=eps, width_log10=width_log10, bin_columns=tuple(bins),
                 keys=tuple(keys))
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
    """The rows of ``at_risk_sql(...)`` run elsewhere (a pandas DataFrame or pyarrow Table, e.g. Spark's
    ``spark.sql(query).toPandas()``) as the aggregate ``fit_law`` takes: cells with a NULL bin (invalid
    covariates) refused or dropped, types, column order, cells sorted, ``attrs``. Give the ``family`` (or
    ``bin_columns`` / ``keys``) and ``means`` the query was made for; the arms are yours to check
    (``arms.check_one_arm_per_drafter`` on the ``runs`` table you registered)."""
    import pyarrow as pa

    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bins, keys, columns = _query_spec(family, bin_columns, keys, means)
    table = result if isinstance(result, pa.Table) else pa.Table.from_pandas(result, preserve_index=False)
    return _finish([table], bins, keys, columns, eps=eps, width_log10=width_log10, on_invalid=on_invalid)


def fit_law_out_of_core(traces, family: str = "law_exp", by: str | None = None, *, width_log10: float = 0.05,
                        eps: float = atrisk.EPS_NATS, drafters: Sequence[str] | None = None, on_invalid: str = "raise",
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int | None = None,
                        memory_limit: str | None = None, temp_directory: str | None = None, **fit_options):
    """``fit_law`` on runs larger than memory: ``aggregate_at_risk_sql`` (the family's covariate means
    only), then ``fit_law`` on the cells. ``fit_options`` go to ``fit_law`` (``depth``, ``cov_type``, ...);
    the estimates equal ``fit_law(load_traces(path), family)`` (``tests/test_outofcore.py``)."""
    from entropy_law.law.fit import fit_law

    counts = aggregate_at_risk_sql(traces, family, width_log10=width_log10, eps=eps, means="family",
                                   drafters=drafters, on_invalid=on_invalid, chunk_bytes=chunk_bytes,
                                   threads=threads, memory_limit=memory_limit, temp_directory=temp_directory)
    return fit_law(counts, family, by=by, eps=eps, width_log10=width_log10, **fit_options)


__all__ = ["aggregate_at_risk_sql", "at_risk_sql", "finish_cells", "fit_law_out_of_core"]
