"""Out of core: the aggregated at-risk table of many runs as one SQL query over the Parquet shards.

Known here: the aggregation of ``atrisk.aggregate_at_risk`` (counts per drafter x category x request x depth
x log-spaced covariate bin, with within-cell covariate means) written down as ONE SQL query over three tables,
``tokens`` and ``rounds`` (the trace files, format v1) and ``runs`` (``run_id -> drafter_id``, from each
``run.json``), in the SQL that DuckDB and Spark SQL share (``at_risk_sql``; ``docs/out-of-core.md``); and
its embedded driver (``aggregate_at_risk_sql``): DuckDB runs the query over groups of finished shards, each
group's tables views over its files, so memory holds one group's rows and the growing table of cells, never
all the rows. A request, hence a round, lies in one shard, so every window of the query (the cumulative
entropy of a round; the decode-time covariates of ``atrisk.sequence_covariates`` over a request's whole output:
the previous position's entropy, the running-mean entropy, the position) lies in one group, and groups give the
same cells as one query over all files; cells of
two groups that share a key (one drafter's runs reusing a request id, which the in-memory path pools too)
are merged by ``atrisk.combine_aggregates``. ``fit_law_out_of_core`` fits a law family without ever holding the
cells (about half as many as the token rows): each group's cells go to a temporary Parquet file, and
statsmodels' IRLS and CR1 sandwich run in passes over them, a batch at a time (X'WX and X'Wz summed per
pass; the observed Hessian and the per-request score sums at the estimate), so memory grows with the number
of requests, never with rows or cells; the result is ``fit_law``'s ``FittedLaw``, equal to it within 1e-6, for
the primary law ``law_exp_obs_ceil`` too (decode-time covariates; its offset c of log(H + c) profiled over
``fit.EPS_GRID`` by one streamed fit per offset).

The arm rule of ``arms`` holds here as in ``atrisk.at_risk_table``: the runs selected by ``drafter_id``
must be one arm each (``arms.check_one_arm_per_drafter``), else the query is not run. Which rows are at risk,
the covariates and their checks are those of ``atrisk`` (a test compares both paths cell by cell).

Not known here: how traces are written, the law families and their checks (``fit``: the streamed fit reuses
its formulas, ``check_counts`` and ``FittedLaw``). No torch; DuckDB is imported when a query runs.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from statsmodels.tools.sm_exceptions import DomainWarning

from entropy_law.law import arms, atrisk
from entropy_law.law.fit import get_family

# covariate column -> (trace column, SQL name of its checked value in the query)
_TRACE_COLUMNS = {"target_entropy_nats": "h", "target_renyi2_nats": "h2", "target_top1_prob": "p1",
                  "target_logit_gap": "gap"}
_LOG_OF = {"log_entropy": "h", "log_renyi2": "h2", "log_logit_gap": "gap"}
_KEYS = tuple(atrisk.KEY_COLUMNS)  # drafter_id, category, request_id, depth
# the decode-time covariates of ``atrisk.sequence_covariates`` the query computes (windows over each request's
# whole output, every role), the columns binned among them, and the raw column a fitted log is taken of
_SEQUENCE_MEANS = ("lag_entropy_nats", "log_lag_entropy", "run_mean_entropy_nats", "log_run_mean_entropy",
                   "log1p_position")
_SEQUENCE_BINS = ("lag_entropy_nats", "run_mean_entropy_nats", "position")
_RAW_OF_LOG = {"log_lag_entropy": "lag_entropy_nats", "log_run_mean_entropy": "run_mean_entropy_nats"}
# the target's top-1 miss: 1 - p1 (a bin column) and log(1 - p1 + 1e-3) (``atrisk._add_target_miss``); a fit takes
# the log of the cells' mean miss, so the raw mean it reads is that of target_top1_prob
_MISS_BIN = "target_miss_prob"
_MISS_LOG = "log_target_miss"
_MISS_RAW = "target_top1_prob"
DEFAULT_CHUNK_BYTES = 256 << 20  # token files per DuckDB query (compressed Parquet on disk)


def _literal(value: float) -> str:
    """A DOUBLE literal both DuckDB and Spark SQL read as the same IEEE double (``0.001E0``, ``1e-05``)."""
    text = repr(float(value))
    return text if "e" in text or "inf" in text or "nan" in text else f"{text}E0"


def _means_for(family, means: str, with_rounds: bool) -> list[str]:
    """Covariate means the aggregate keeps: all of ``atrisk.mean_columns`` with the family's decode-time means
    (``"all"``, what the pandas path keeps) or only those the family's fit reads (``"family"``: fewer columns, the
    same fit). The fit reads the log of a decode-time covariate as the log of its cell mean
    (``atrisk.add_log_covariates``) and a profiled offset's log(H + c) as that of the cells' mean entropy, so
    ``"family"`` keeps those raw means instead of the means of the logs."""
    every = [*atrisk.COVARIATES, *atrisk.DERIVED]
    if not with_rounds:
        every.remove("log_drafted_depth")
    family_means = getattr(family, "means", ())
    sequence = [m for m in family_means if m in _SEQUENCE_MEANS]
    miss = [_MISS_LOG] if _MISS_LOG in family_means else []  # after the sequence means, as in LawFamily.means
    if means == "all":
        return [*every, *sequence, *miss]
    if means != "family":
        raise ValueError("means must be 'all' (every covariate mean, as aggregate_at_risk) or 'family'")
    terms = family.terms or "log_entropy"  # law_iso: isotonic in the cells' mean log entropy
    used = [c for c in every if re.search(rf"\b{c}\b", terms)]
    if family.name == "law_exp_mundlak":
        used.append("log_entropy")
    if getattr(family, "profile_eps", False):
        used.append("target_entropy_nats")
    if miss and re.search(rf"\b{_MISS_LOG}\b", terms):
        used.append(_MISS_RAW)  # the fit's log(1 - p1 + 1e-3) is taken of the cells' mean p1
    raw = {_RAW_OF_LOG.get(m, m) for m in sequence if re.search(rf"\b{m}\b", terms)}
    return [*sorted(set(used), key=every.index), *[m for m in sequence if m in raw]]


def _miss_sql(p1: str) -> str:
    """The target's miss probability 1 - p1, clipped to [0, 1], of the SQL expression ``p1``
    (``atrisk._add_target_miss``)."""
    return f"LEAST(GREATEST(1.0E0 - {p1}, 0.0E0), 1.0E0)"


def _log_bin(column: str, eps: float, width_log10: float) -> str:
    """The log-spaced bin of ``column`` in SQL: floor((log10(x + eps) - log10(eps)) / width_log10)."""
    return (f"CAST(FLOOR((LOG10({column} + {_literal(eps)}) - ({_literal(np.log10(eps))})) / "
            f"{_literal(width_log10)}) AS BIGINT)")


def at_risk_sql(*, bin_columns: Sequence[str] = ("target_entropy_nats",), width_log10: float = 0.05,
                eps: float = atrisk.EPS_NATS, means: Sequence[str] | None = None,
                drafted_depth_key: bool = False) -> str:
    """The aggregation as one SQL query over the tables ``tokens``, ``rounds`` and ``runs``.

    Returns one row per cell: the keys ``drafter_id, category, request_id, depth`` (and ``drafted_depth`` with
    ``drafted_depth_key``), one ``bin_<column>`` per ``bin_columns`` (``floor((log10(x + eps) - log10(eps)) /
    width_log10)``, NULL for rows whose covariates fail the checks of ``atrisk.validate_covariates``: the
    driver refuses or drops those cells), ``n_acc``, ``n`` and ``n_rej`` and the mean of every column of
    ``means`` (default: all of ``atrisk.COVARIATES`` and ``atrisk.DERIVED``; also the decode-time covariates
    of ``atrisk.sequence_covariates``: ``lag_entropy_nats``, ``run_mean_entropy_nats``, ``log1p_position`` and
    the logs ``log_lag_entropy``, ``log_run_mean_entropy``). It uses only what DuckDB and Spark SQL both read
    the same way (CTEs, CASE, CAST, GREATEST, COALESCE, ISNAN, LN, LOG10, FLOOR, ROWS windows, LAG); the
    ``rounds`` join is there only when ``log_drafted_depth`` or the ``drafted_depth`` key is asked for, and the
    windows over each request's output (``sequence_windows``: every token row, all roles, ordered by position)
    only when a decode-time covariate is asked for or binned (``lag_entropy_nats``, ``run_mean_entropy_nats``,
    ``position``).
    """
    means = list(means) if means is not None else [*atrisk.COVARIATES, *atrisk.DERIVED]
    known = [*atrisk.COVARIATES, *atrisk.DERIVED, *_SEQUENCE_MEANS, _MISS_LOG]
    unknown = sorted(set(means) - set(known))
    if unknown:
        raise ValueError(f"unknown covariate means {unknown}; known: {known}")
    bad_bins = sorted(set(bin_columns) - set(atrisk.COVARIATES) - {"cum_entropy_nats", *_SEQUENCE_BINS, _MISS_BIN})
    if bad_bins:
        raise ValueError(f"cannot bin {bad_bins}; bin columns are covariates, cum_entropy_nats, {_MISS_BIN} or "
                         f"{list(_SEQUENCE_BINS)}")
    needs_miss = _MISS_BIN in bin_columns or _MISS_LOG in means
    with_rounds = drafted_depth_key or "log_drafted_depth" in means
    needs_cum = "cum_entropy_nats" in bin_columns or {"cum_entropy_nats", "log1p_cum_entropy"} & set(means)
    needs_lag = "lag_entropy_nats" in bin_columns or {"lag_entropy_nats", "log_lag_entropy"} & set(means)
    needs_run = "run_mean_entropy_nats" in bin_columns or {"run_mean_entropy_nats", "log_run_mean_entropy"} & set(means)
    needs_pos = "position" in bin_columns or "log1p_position" in means
    needs_sequence = needs_lag or needs_run or needs_pos
    lo, hi, inf = _literal(-atrisk.NEGATIVE_TOLERANCE), "CAST('Infinity' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)"
    e = _literal(eps)

    # 0. the decode-time covariates of atrisk.sequence_covariates, from each request's whole output (every
    # token row, all roles, ordered by position): H at the previous position (at the first: its own H),
    # the running mean of H (sum / count of rows so far), the position. As atrisk._add_sequence_covariates,
    # H is max(H, 0); a NaN or NULL H is NULL here (pandas' NaN): skipped by the running sum, replaced by the
    # row's own H as the previous entropy
    ctes = []
    source = "tokens"
    if needs_sequence:
        h_seq = "CAST(target_entropy_nats AS DOUBLE)"
        window = ("OVER (PARTITION BY run_id, request_id ORDER BY position\n"
                  "            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)")
        ctes.append(f"""entropy_sequence AS (
    SELECT run_id, request_id, category, round_index, position, depth, role, target_entropy_nats,
        target_renyi2_nats, target_top1_prob, target_logit_gap,
        CASE WHEN {h_seq} IS NULL OR ISNAN({h_seq}) THEN NULL ELSE GREATEST({h_seq}, 0.0E0) END AS h_seq
    FROM tokens
)""")
        ctes.append(f"""sequence_windows AS (
    SELECT *,
        COALESCE(LAG(h_seq) OVER (PARTITION BY run_id, request_id ORDER BY position), h_seq) AS lag_h,
        SUM(h_seq) {window} AS sum_h,
        COUNT(*) {window} AS n_h
    FROM entropy_sequence
)""")
        source = "sequence_windows"

    # 1. the at-risk rows with the round's drafted depth where needed, and the row check of validate_covariates
    drafted = ",\n        d.tree_depth AS drafted_depth" if with_rounds else ""
    if needs_sequence:
        drafted += (",\n        CAST(t.position AS DOUBLE) AS pos,\n        t.lag_h,\n"
                    "        t.sum_h / CAST(t.n_h AS DOUBLE) AS run_mean_h")
    join_rounds = ("\n    JOIN rounds AS d\n      ON d.run_id = t.run_id AND d.request_id = t.request_id"
                   " AND d.round_index = t.round_index" if with_rounds else "")
    at_risk = f"""at_risk AS (
    SELECT t.run_id, r.drafter_id, t.category, t.request_id, t.round_index, t.depth,
        CASE WHEN t.role = 'accepted' THEN 1 ELSE 0 END AS accepted,
        CAST(t.target_entropy_nats AS DOUBLE) AS h,
        CAST(t.target_renyi2_nats AS DOUBLE) AS h2,
        CAST(t.target_top1_prob AS DOUBLE) AS p1,
        CAST(t.target_logit_gap AS DOUBLE) AS gap{drafted}
    FROM {source} AS t
    JOIN runs AS r ON r.run_id = t.run_id{join_rounds}
    WHERE t.role IN ('accepted', 'correction')
)"""
    # NaN fails every comparison in both engines, so the range checks also refuse NaN (and NULL); a decode-time
    # covariate that is not finite (an infinite entropy earlier in the output) makes the row invalid too
    sequence_check = ""
    if needs_sequence:
        sequence_check = (f"\n         AND lag_h >= 0.0E0 AND lag_h < {hi}"
                          f"\n         AND run_mean_h >= 0.0E0 AND run_mean_h < {hi}")
    checked = f"""checked AS (
    SELECT *,
        (h >= {lo} AND h < {hi}
         AND h2 >= {lo} AND h2 < {hi}
         AND gap >= {lo} AND gap < {hi}
         AND p1 > {inf} AND p1 < {hi}{sequence_check}) AS valid
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
    if needs_lag:
        cols.append("CASE WHEN valid THEN lag_h END AS lag_entropy_nats")
    if needs_run:
        cols.append("CASE WHEN valid THEN run_mean_h END AS run_mean_entropy_nats")
    if needs_pos:
        cols.append("CASE WHEN valid THEN pos END AS position")
    if needs_miss:  # the target's mass off its greedy token, 1 - p1 in [0, 1] (atrisk._add_target_miss)
        cols.append(f"CASE WHEN valid THEN {_miss_sql('p1')} END AS {_MISS_BIN}")
    covariates = "covariates AS (\n    SELECT " + ",\n        ".join(cols) + "\n    FROM checked\n)"

    # 3. derived columns and bins
    derived = ["*"]
    for name, source in _LOG_OF.items():
        if name in means:
            column = {"h": "target_entropy_nats", "h2": "target_renyi2_nats", "gap": "target_logit_gap"}[source]
            derived.append(f"LN({column} + {e}) AS {name}")
    if "log1p_cum_entropy" in means:
        derived.append("LN(1.0E0 + GREATEST(cum_entropy_nats, 0.0E0)) AS log1p_cum_entropy")
    if "log_drafted_depth" in means:
        derived.append("LN(GREATEST(CAST(drafted_depth AS DOUBLE), 1.0E0)) AS log_drafted_depth")
    for name, raw in _RAW_OF_LOG.items():  # atrisk.add_log_covariates: log(max(x, 0) + eps)
        if name in means:
            derived.append(f"LN(GREATEST({raw}, 0.0E0) + {e}) AS {name}")
    if "log1p_position" in means:
        derived.append("LN(1.0E0 + position) AS log1p_position")
    if _MISS_LOG in means:
        derived.append(f"LN({_MISS_BIN} + {_literal(atrisk.EPS_PROB)}) AS {_MISS_LOG}")
    for column in bin_columns:
        derived.append(f"{_log_bin(column, eps, width_log10)} AS bin_{column}")
    binned = "binned AS (\n    SELECT " + ",\n        ".join(derived) + "\n    FROM covariates\n)"

    # 4. one row per cell
    keys = [*_KEYS, *(["drafted_depth"] if drafted_depth_key else []), *[f"bin_{c}" for c in bin_columns]]
    out = [*keys, "SUM(accepted) AS n_acc", "COUNT(*) AS n"]
    out += [f"AVG({m}) AS {m}" for m in means]
    out.append("COUNT(*) - SUM(accepted) AS n_rej")
    select = ("SELECT " + ",\n       ".join(out) + "\nFROM binned\nGROUP BY " + ", ".join(keys))
    return "WITH " + ",\n".join([*ctes, at_risk, checked, covariates, binned]) + "\n" + select


# ------------------------------------------------------------------------------------- the DuckDB driver


@dataclass
class _Shards:
    """The finished shards of the selected runs, and the runs table of the query."""

    dirs: list[Path]
    runs: pd.DataFrame  # run_id, drafter_id (the arms checked)


def _shards(traces_or_path, drafters: Sequence[str] | None, by_arm: bool = False) -> _Shards:
    """``by_arm``: the runs table's ``drafter_id`` is each run's arm label (``arms.run_arms``: model, drafter,
    tree policy, budget, gate), so arms that share a drafter id stay apart, as in ``analysis.make_view``;
    ``drafters`` then selects arm labels. Otherwise a drafter id that holds two arms is refused."""
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
    """Register ``runs`` on ``con``, then for each group of shards (``_chunks``) make ``tables`` views over its
    files and yield the group's index: the one loop of every query here (memory holds one group's rows)."""
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
    by_arm: bool = False,
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
    ``drafters``: only these drafter ids (arm labels with ``by_arm``: the cells keyed by arm, see
    ``fit_law_out_of_core``). ``on_invalid``: ``"raise"`` (default) or ``"drop"`` rows with NaN,
    infinite or negative covariates, as ``at_risk_table``. ``chunk_bytes``: token files per query (memory
    holds one group of shards' rows); ``threads``, ``memory_limit`` (e.g. ``"2GB"``) and ``temp_directory``
    (where DuckDB spills) are DuckDB settings.
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
    decode_time = tuple(m for m in means if m in atrisk.DECODE_TIME)
    if decode_time:  # as aggregate_at_risk(extra_means=...): combine_aggregates pools them too
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


# ------------------------------------------------------------------------------ the out-of-core fit

STREAM_BATCH_CELLS = 1 << 18  # cells per batch of the streamed fit (memory: ~ batch x (K + 3) x 8 bytes, a few copies)


class OutOfCoreError(ValueError):
    """A family or option the streamed fit cannot do; the message says what to use instead."""


def _streamable(fam) -> None:
    """Refuse families the streamed fit cannot reproduce exactly (their cells or estimator need more than the
    GLM sums of the cells the query computes). Profiled offsets (``profile_eps``: one streamed fit per offset)
    and the decode-time covariates of ``atrisk.sequence_covariates`` (windows over each request's output) are
    done; the drafter's own statistics (``draft_entropy_nats``, ``draft_top1_prob``) and the context's copyability
    (``context_match``) are not computed by the query."""
    if fam.link == "isotonic":
        raise OutOfCoreError("law_iso is not a GLM: fit it in memory on the cells, fit_law(aggregate_at_risk_sql(path, "
                             "'law_iso'), 'law_iso') (its cells number about half the token rows)")
    known = {*atrisk.COVARIATES, *atrisk.DERIVED, *_SEQUENCE_MEANS, _MISS_LOG}
    missing = [m for m in getattr(fam, "means", ()) if m not in known]
    bins = [b for b in fam.bin_columns if b not in {*atrisk.COVARIATES, "cum_entropy_nats", *_SEQUENCE_BINS,
                                                    _MISS_BIN}]
    if missing or bins:
        raise OutOfCoreError(f"{fam.name} uses covariates {sorted(set(missing + bins))} that the out-of-core query "
                             "does not compute (the drafter's own statistics at each depth, the context's "
                             f"copyability): fit it in memory, fit_law(load_traces(path), {fam.name!r}), or fit a "
                             "family on the target's entropy "
                             "sequence out of core, such as 'law_exp_obs_ceil' (the primary law) or 'law_exp_obs'")


def _sql_str(value) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _write_cells(con, traces, bins, keys, means, *, width_log10, eps, drafters, chunk_bytes, folder: Path,
                 by_arm: bool = False) -> list:
    """The query's cells of every group of shards written to ``folder`` (one Parquet file per group)."""
    sql = at_risk_sql(bin_columns=bins, width_log10=width_log10, eps=eps, means=means,
                      drafted_depth_key="drafted_depth" in keys)
    shards = _shards(traces, drafters, by_arm)
    if not shards.dirs:
        raise ValueError("no finished shards under the given path: nothing to fit")
    files = []
    for i in _views_per_group(con, shards, chunk_bytes):
        path = folder / f"cells-{i:05d}.parquet"
        con.execute(f"COPY ({sql}) TO {_sql_str(path)} (FORMAT PARQUET)")
        files.append(path)
    return files


def _cell_source(con, files, bins, keys, means, on_invalid) -> tuple[str, list]:
    """SQL selecting the valid cells of ``files`` (pooled where two groups hold one cell key), and notes."""
    listing = "[" + ", ".join(_sql_str(f) for f in files) + "]"
    con.execute(f"CREATE OR REPLACE VIEW cells_raw AS SELECT * FROM read_parquet({listing}, filename = true)")
    bin_names = [f"bin_{c}" for c in bins]
    notes = []
    if bin_names:
        null = " OR ".join(f"{b} IS NULL" for b in bin_names)
        bad_rows = con.sql(f"SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM cells_raw WHERE {null}").fetchall()[0][0]
        if bad_rows:
            if on_invalid == "raise":
                examples = [r[0] for r in con.sql(f"SELECT DISTINCT request_id FROM cells_raw WHERE {null} "
                                                   "ORDER BY 1 LIMIT 3").fetchall()]
                raise ValueError(f"invalid covariates at at-risk positions: {bad_rows} rows with NaN, infinite or "
                                 f"negative values (e.g. requests {examples}). Fix the traces, or pass "
                                 "on_invalid='drop' to drop those rows (their rounds stay in).")
            notes.append(f"dropped {bad_rows} at-risk rows with invalid covariates")
        where = "WHERE NOT (" + null + ") AND n > 0"
    else:
        where = "WHERE n > 0"
    cell = [*keys, *bin_names]
    cast = {"drafter_id": "VARCHAR", "category": "VARCHAR", "request_id": "VARCHAR"}
    # one drafter's runs reusing a request id in two groups: their cells are pooled, as in memory
    shared = con.sql("SELECT 1 FROM (SELECT drafter_id, request_id FROM cells_raw GROUP BY drafter_id, request_id "
                     "HAVING COUNT(DISTINCT filename) > 1) LIMIT 1").fetchall()
    if shared:
        cols = [f"CAST({c} AS {cast.get(c, 'BIGINT')}) AS {c}" for c in cell]
        cols += [f"CAST(SUM({c}) AS BIGINT) AS {c}" for c in ("n_acc", "n", "n_rej")]
        cols += [f"SUM({m} * n) / SUM(n) AS {m}" for m in means]
        source = f"SELECT {', '.join(cols)} FROM cells_raw {where} GROUP BY {', '.join(cell)}"
    else:
        cols = [f"CAST({c} AS {cast.get(c, 'BIGINT')}) AS {c}" for c in cell]
        cols += [f"CAST({c} AS BIGINT) AS {c}" for c in ("n_acc", "n", "n_rej")]
        cols += [f"CAST({m} AS DOUBLE) AS {m}" for m in means]
        source = f"SELECT {', '.join(cols)} FROM cells_raw {where}"
    return source, notes


def _batches(con, sql: str, batch_cells: int):
    """The rows of ``sql`` as pandas frames of at most ``batch_cells`` rows (DuckDB streams them, on a cursor of
    their own, so that a reader left early blocks no other query)."""
    cursor = con.cursor()
    try:
        for batch in cursor.sql(sql).to_arrow_reader(batch_cells):
            if batch.num_rows:
                yield batch.to_pandas()
    finally:
        cursor.close()


class _Cache:
    """The design matrix, outcomes, trials and cluster codes of every cell, in batches, in one binary file read
    back batch by batch (the page cache holds it, not this process)."""

    def __init__(self, path: Path, k: int, *, entropy: bool = False):
        self.path, self.k, self.sizes = path, k, []
        self._file = open(path, "wb")
        # with ``entropy``: the cells' mean entropy beside the design, for ``_OffsetCache``
        self.entropy_path = path.with_suffix(".entropy") if entropy else None
        self._entropy = open(self.entropy_path, "wb") if entropy else None

    def write(self, x: np.ndarray, y: np.ndarray, n: np.ndarray, g: np.ndarray, h: np.ndarray | None = None) -> None:
        self.sizes.append(len(y))
        for a, dtype in ((x, np.float64), (y, np.float64), (n, np.float64), (g, np.int32)):
            self._file.write(np.ascontiguousarray(a, dtype=dtype).tobytes())
        if self._entropy is not None:
            self._entropy.write(np.ascontiguousarray(h, dtype=np.float64).tobytes())

    def close(self) -> None:
        self._file.close()
        if self._entropy is not None:
            self._entropy.close()

    def unlink(self) -> None:
        self.close()
        for path in (self.path, self.entropy_path):
            if path is not None:
                path.unlink(missing_ok=True)

    def __iter__(self):
        with open(self.path, "rb") as f:
            for size in self.sizes:
                x = np.fromfile(f, np.float64, size * self.k).reshape(size, self.k)
                y = np.fromfile(f, np.float64, size)
                n = np.fromfile(f, np.float64, size)
                g = np.fromfile(f, np.int32, size)
                yield x, y, n, g


class _OffsetCache:
    """The cells of a ``_Cache`` built with log(H + c0) (and ``entropy``) seen with another offset c: design
    column ``j`` (``log_entropy``, a plain column of the design) replaced batch by batch by
    log(max(H, 0) + c) of the cells' mean entropy, the very values patsy would put there; so a profiled offset
    builds its design once, not once per offset."""

    def __init__(self, base: _Cache, j: int, offset: float):
        self.base, self.j, self.offset = base, j, float(offset)
        self.k, self.sizes, self.path = base.k, base.sizes, None

    def column(self, h: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(h, 0.0) + self.offset)  # as fit._fit_profile_eps

    def __iter__(self):
        with open(self.base.entropy_path, "rb") as f:
            for (x, y, n, g), size in zip(self.base, self.sizes):
                x[:, self.j] = self.column(np.fromfile(f, np.float64, size))
                yield x, y, n, g

    def unlink(self) -> None:  # the base is removed by its owner
        pass


def _plain_column(names: Sequence[str], name: str) -> int | None:
    """The index of design column ``name`` where it is the only column that reads ``name`` (a main effect:
    no interaction, spline or other transform of it), else None."""
    reading = [i for i, column in enumerate(names) if re.search(rf"\b{re.escape(name)}\b", column)]
    return reading[0] if len(reading) == 1 and names[reading[0]] == name else None


def _irls_pass(cache: _Cache, fam_obj, beta):
    """One pass of statsmodels' IRLS (``GLM._fit_irls``) over the cells: the binomial deviance at ``beta``
    (``None``: at the start ``family.starting_mu``), as ``Binomial.deviance`` computes it, and the normal
    equations of the next weighted least squares (weights n w(mu), working response eta + g'(mu) (y/n - mu))."""
    k = cache.k
    tiny = np.finfo(float).eps
    xtwx, xtwz, dev = np.zeros((k, k)), np.zeros(k), 0.0
    for x, y, n, _ in cache:
        p = y / n
        if beta is None:
            mu = fam_obj.starting_mu(p)
            eta = fam_obj.predict(mu)
        else:
            eta = x @ beta
            mu = fam_obj.fitted(eta)
        ratio = np.clip(p / (mu + 1e-20), tiny, np.inf)
        ratio_rej = np.clip((1.0 - p) / (1.0 - mu + 1e-20), tiny, np.inf)
        dev += float(np.sum(2 * n * (p * np.log(ratio) + (1 - p) * np.log(ratio_rej))))
        deriv = fam_obj.link.deriv(mu)  # once: Family.weights is 1 / (g'(mu)^2 Var(mu)), the same numbers
        w = n * (1.0 / (deriv ** 2 * fam_obj.variance(mu)))
        z = eta + deriv * (p - mu)
        xw = x * w[:, None]
        xtwx += xw.T @ x
        xtwz += xw.T @ z
    return dev, xtwx, xtwz


def _sandwich_pass(cache: _Cache, link: str, beta, n_groups: int):
    """At the estimate, through statsmodels' own GLM on each batch: the observed Hessian (the bread of
    ``cov_cluster``), the scores summed per request (the meat), the expected information, llf and deviance."""
    import statsmodels.api as sm

    from entropy_law.law.fit import _family_obj

    k = cache.k
    hessian, information = np.zeros((k, k)), np.zeros((k, k))
    scores = np.zeros((n_groups, k))
    llf = deviance = 0.0
    finite = True
    for x, y, n, g in cache:
        family = _family_obj(link)  # statsmodels keeps the trials on the family instance
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DomainWarning)  # the log link, as in fit._fit_glm
            model = sm.GLM(np.column_stack([y, n - y]), x, family=family)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            score = model.score_obs(beta)
            h = model.hessian(beta, observed=True)
            information += model.hessian(beta, observed=False)
            mu = model.predict(beta)
            llf += float(model.loglike(beta))
            deviance += float(family.deviance(model.endog, mu, model.var_weights, model.freq_weights, 1.0))
        finite = finite and bool(np.all(np.isfinite(h)))
        hessian += h
        for j in range(k):
            scores[:, j] += np.bincount(g, weights=score[:, j], minlength=n_groups)
    return dict(hessian=hessian, information=-information, scores=scores, llf=llf, deviance=deviance, finite=finite)


def _C(data, contrast=None, levels=None):
    """patsy's ``C``, except that a column that already is a pandas Categorical (its levels set up front) is
    passed on as it is: patsy then takes its codes at once (for ``C(x)`` it converts value by value in Python,
    seconds per million cells). Same levels, contrasts and column names."""
    from patsy.categorical import C

    if contrast is None and levels is None and isinstance(getattr(data, "dtype", None), pd.CategoricalDtype):
        return data
    return C(data, contrast, levels)


def _llf_pass(cache: _Cache, link: str, beta) -> float:
    """The log-likelihood at ``beta`` as statsmodels' ``GLM.loglike`` computes it (the binomial family's
    ``loglike`` at the inverse link of X beta, the trials on the family instance), without building a GLM per
    batch."""
    from entropy_law.law.fit import _family_obj

    llf = 0.0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for x, y, n, _ in cache:
            family = _family_obj(link)
            family.n = n
            llf += float(family.loglike(y / n, family.link.inverse(x @ beta)))
    return llf


def _needed_columns(rhs: str, fam, available) -> list:
    """The cell columns the design of ``rhs`` reads: those it names, the raw means whose logs the fit takes
    (``atrisk.add_log_covariates``), and for a profiled offset the mean entropy instead of its log."""
    used = [c for c in available if re.search(rf"\b{re.escape(c)}\b", rhs)]
    if fam.name == "law_exp_mundlak":
        used += [c for c in ("log_entropy", "category") if c not in used]
    if fam.means:
        raw_of = {**_RAW_OF_LOG, _MISS_LOG: _MISS_RAW}
        used += [raw for log, raw in raw_of.items() if re.search(rf"\b{log}\b", rhs) and raw not in used]
    if fam.profile_eps:
        used = [c for c in used if c != "log_entropy"] + ["target_entropy_nats"]
    missing = [c for c in used if c not in available]
    if missing:
        raise RuntimeError(f"the cells lack {missing} for {fam.name}: report this as a bug")
    return list(dict.fromkeys(used))


# the log covariates whose count-weighted means over the fitted cells ``FittedLaw.steady_state`` reads
_STEADY_STATE = ("log_run_mean_entropy", "log1p_position", "log_drafted_depth")


def _fit_streamed(con, source: str, fam, *, depth: str, cov_type: str, alpha: float, eps: float,
                  min_requests_per_category: int, drop_small_categories: bool, batch_cells: int, tol: float,
                  max_iter: int, folder: Path, notes: list, start_params=None):
    """``fit_law`` on the cells selected by ``source``, in passes over them; memory holds one batch of cells,
    the per-request score sums (requests x parameters) and the request ids. A family with decode-time
    covariates is fitted on the logs of their cell means, and a ``profile_eps`` family once per offset c of
    ``fit.EPS_GRID`` on log(H + c) of the cells' mean entropy, keeping the fit of largest log-likelihood, as
    ``fit_law`` (``atrisk.add_log_covariates``, ``fit._fit_profile_eps``)."""
    import patsy
    import statsmodels.api as sm
    from statsmodels.genmod.generalized_linear_model import GLMResults, GLMResultsWrapper

    from entropy_law.law import fit as fitmod
    from entropy_law.law.stats import warn_if_few_requests

    extra = [c for c in ("drafted_depth",) if c in con.sql(f"SELECT * FROM ({source}) LIMIT 0").columns]
    keys = ["drafter_id", "category", "request_id", *extra]
    summary = con.sql(f"SELECT {', '.join(keys)}, CAST(SUM(n_acc) AS BIGINT) AS n_acc, CAST(SUM(n_rej) AS BIGINT) "
                      f"AS n_rej, CAST(SUM(n) AS BIGINT) AS n FROM ({source}) GROUP BY {', '.join(keys)}").df()
    # the checks of fit_law, on one row per request (and drafted depth): the same sums, counts and levels
    summary, check_notes = fitmod.check_counts(summary, fam, min_requests_per_category=min_requests_per_category,
                                              drop_small_categories=drop_small_categories, cov_type=cov_type)
    notes = [*notes, *check_notes]
    if fam.means and fam.needs_drafted_depth and summary["drafted_depth"].nunique() < 2:
        # as fit_law: a drafter that always drafts one depth (a full-block chain) has no log D term
        notes.append(f"every at-risk round drafted depth {int(summary['drafted_depth'].iloc[0])}: the log D term is "
                     "not identified and is left out")
        fam = fitmod.without_drafted_depth(fam)
    categories = sorted(summary["category"].unique())
    if check_notes and fam.needs_categories:  # small categories dropped
        source = f"SELECT * FROM ({source}) WHERE category IN ({', '.join(_sql_str(c) for c in categories)})"
    request_ids = np.sort(summary["request_id"].unique().astype(str))
    depths = [int(r[0]) for r in con.sql(f"SELECT DISTINCT depth FROM ({source}) ORDER BY 1").fetchall()]
    n_requests = len(request_ids)
    common = dict(family=fam, depths=tuple(depths), categories=tuple(categories),
                  drafters=tuple(sorted(summary["drafter_id"].unique())), n_rows=int(summary["n"].sum()),
                  n_requests=n_requests, eps=float(eps), alpha=alpha, depth_model=depth, notes=notes)
    if cov_type == "cluster":
        few = warn_if_few_requests(n_requests, f"the cluster-robust intervals of {fam.name} (widened: t with "
                                   f"{n_requests - 1} df)")
        if few:
            notes.append(few)
    category_means = {}
    if fam.name == "law_exp_mundlak":
        rows = con.sql(f"SELECT category, SUM(log_entropy * n) / SUM(n) FROM ({source}) GROUP BY category").fetchall()
        category_means = {c: float(m) for c, m in sorted(rows)}
    common["category_means"] = category_means

    depth_term = fitmod.DEPTH_TERMS[depth]
    rhs = " + ".join(t for t in (depth_term, fam.terms) if t) or "1"
    lhs = "n_rej + n_acc" if fam.outcome == "rejection" else "n_acc + n_rej"
    available = con.sql(f"SELECT * FROM ({source}) LIMIT 0").columns
    columns = _needed_columns(rhs, fam, available)
    factors = set(re.findall(r"C\((\w+)\)", rhs))
    levels = {"depth": depths, "category": categories, "drafter_id": list(common["drafters"])}

    def frames(with_counts: bool, offset):
        cols = [*columns, *(["n_acc", "n_rej", "n", "request_id"] if with_counts else [])]
        for frame in _batches(con, f"SELECT {', '.join(dict.fromkeys(cols))} FROM ({source})", batch_cells):
            for name in factors & set(frame.columns):  # every level known up front: patsy needs no pass to find them
                frame[name] = pd.Categorical(frame[name], categories=levels[name])
            if fam.means:  # fit_law: the logs of the cells' covariate means, as predictions take them
                atrisk.add_log_covariates(frame)
            if offset is not None:  # fit._fit_profile_eps: log(H + c) of the cells' mean entropy
                frame["log_entropy"] = np.log(np.maximum(frame["target_entropy_nats"].to_numpy(dtype=float), 0.0)
                                              + offset)
            if category_means:
                frame, _ = fitmod._add_mundlak(frame, category_means)
            yield frame

    def build(offset, index: int):
        """The design of the cells (on disk), its info, the first cells, and the count-weighted sums of the
        steady-state covariates."""
        design = patsy.incr_dbuilder(rhs, lambda: frames(False, offset),
                                     eval_env=patsy.EvalEnvironment([{"C": _C}, vars(fitmod)]), NA_action="raise")
        cache = _Cache(folder / f"design-{id(design)}-{index}.bin", len(design.column_names),
                       entropy=offset is not None)
        skeleton, sums = None, {}
        try:
            for frame in frames(True, offset):
                x = np.asarray(patsy.build_design_matrices([design], frame, NA_action="raise")[0], dtype=np.float64)
                if not np.all(np.isfinite(x)):
                    raise ValueError("a cell's covariates are not finite: check the traces (validate_traces)")
                outcome = frame["n_rej" if fam.outcome == "rejection" else "n_acc"].to_numpy(np.float64)
                codes = pd.Categorical(frame["request_id"].astype(str), categories=request_ids).codes
                if (codes < 0).any():
                    raise RuntimeError("a cell's request is not among the requests counted: report this as a bug")
                trials = frame["n"].to_numpy(np.float64)
                cache.write(x, outcome, trials, codes,
                            None if offset is None else frame["target_entropy_nats"].to_numpy(np.float64))
                sums["n"] = sums.get("n", 0.0) + float(np.sum(trials))
                for name in [c for c in _STEADY_STATE if c in frame.columns]:
                    sums[name] = sums.get(name, 0.0) + float(np.sum(frame[name].to_numpy(np.float64) * trials))
                if skeleton is None:
                    h = None if offset is None else frame["target_entropy_nats"].to_numpy(np.float64)[:200]
                    skeleton = (x[:200], outcome[:200], trials[:200], h)
        except BaseException:
            cache.unlink()
            raise
        cache.close()
        return design, cache, skeleton, sums

    def irls(cache: _Cache, names: list):
        fam_obj = fitmod._family_obj(fam.link)
        beta = None
        if start_params is not None:
            beta = np.asarray(start_params, dtype=float)
        elif fam.link == "log":  # as _fit_glm: log-binomial starts with mu < 1 (a0 = 0.9, slope -0.5 per nat)
            beta = np.zeros(len(names))
            beta[names.index("Intercept")] = np.log(0.9)
            beta[names.index(fam.slope)] = -0.5
        # statsmodels' rule (tol 1e-8 on the deviance, absolute), so that the estimate is the iterate fit_law
        # stops at; on many cells that change can sit below the deviance's round-off, so the fit also stops
        # once the largest relative step is below ``tol`` (the iterates have then reached the maximum)
        history, converged, iteration, step = [], False, 0, np.inf
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            for iteration in range(max_iter + 1):
                dev, xtwx, xtwz = _irls_pass(cache, fam_obj, beta)
                history.append(dev)
                if iteration and (abs(history[-1] - history[-2]) <= 1e-8 or step <= tol):
                    converged = True
                    break
                if iteration == max_iter:
                    break
                try:
                    new = np.linalg.solve(xtwx, xtwz)
                except np.linalg.LinAlgError:
                    raise ValueError(f"{fam.name}: the design is singular on these cells (a term without variation, "
                                     "e.g. one drafted depth or one category); fit a simpler family") from None
                step = np.inf if beta is None else float(np.max(np.abs(new - beta) / (1.0 + np.abs(beta))))
                beta = new
        return beta, converged, iteration, history

    # one fit, or one per offset c of a profiled log(H + c): the largest log-likelihood among converged fits
    # (none converged: among all), the first of equals, as fit._fit_profile_eps. Where log(H + c) is a plain
    # column of the design, the design is built once and the other offsets replace that column as the cells
    # stream by (``_OffsetCache``); else each offset builds its own and only the best one is kept on disk
    offsets = fitmod.EPS_GRID if fam.profile_eps else (None,)
    best, base = None, None

    def drop(cache) -> None:  # a design no longer needed (the base design stays until the end)
        if base is None or cache is not base[1]:
            cache.unlink()

    try:
        for index, offset in enumerate(offsets):
            if base is None:
                design, cache, skeleton, sums = build(offset, index)
                j = _plain_column(design.column_names, "log_entropy") if fam.profile_eps else None
                if j is not None:
                    base = (design, cache, skeleton, sums, j)
            else:
                design, root, (x0, y0, n0, h0), sums, j = base
                cache = _OffsetCache(root, j, offset)
                x0 = x0.copy()
                x0[:, j] = cache.column(h0)
                skeleton = (x0, y0, n0, h0)
            try:
                beta, converged, iteration, history = irls(cache, design.column_names)
                rank = None
                if fam.profile_eps:
                    llf = _llf_pass(cache, fam.link, beta)
                    rank = (converged and bool(np.isfinite(llf)), llf if np.isfinite(llf) else -np.inf)
            except BaseException:
                drop(cache)
                raise
            if best is None or rank > best["rank"]:
                if best is not None:
                    drop(best["cache"])
                best = dict(rank=rank, offset=offset, design=design, cache=cache, skeleton=skeleton, sums=sums,
                            beta=beta, converged=converged, iteration=iteration, history=history)
            else:
                drop(cache)
        design, cache, beta = best["design"], best["cache"], best["beta"]
        converged, iteration, history = best["converged"], best["iteration"], best["history"]
        names, k, n_cells = design.column_names, len(design.column_names), int(sum(best["cache"].sizes))
        if fam.profile_eps:
            common["eps"] = float(best["offset"])
            notes.append(f"offset c of log(H + c) fitted over {fitmod.EPS_GRID} by profile likelihood: "
                         f"c = {common['eps']:g} (its uncertainty is not in the intervals)")
        if not converged:
            notes.append("the GLM did not converge; treat the estimates with suspicion")
        parts = _sandwich_pass(cache, fam.link, beta, n_requests)
    finally:
        if best is not None:
            best["cache"].unlink()
        if base is not None:
            base[1].unlink()
    sums = best["sums"]
    covariate_means = {c: sums[c] / sums["n"] for c in _STEADY_STATE if c in sums} if fam.means else {}
    if fam.needs_target_top1:  # the steady state's target-miss curve, from the same per-entropy-bin sums as in memory
        bin_sums = con.sql(
            f"SELECT bin_target_entropy_nats AS bin, SUM(n) AS n, SUM(n * GREATEST(target_entropy_nats, 0.0E0)) AS "
            f"sum_h, SUM(n * LN({_miss_sql(_MISS_RAW)} + {_literal(atrisk.EPS_PROB)})) AS sum_miss "
            f"FROM ({source}) GROUP BY 1").df().set_index("bin")
        common["miss_curve"] = fitmod.target_miss_curve(bin_sums)

    # the CR1 sandwich of statsmodels' cov_cluster: H^-1 (sum_g s_g s_g') H^-1 G/(G-1) (N-1)/(N-K)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        try:
            bread = np.linalg.inv(parts["hessian"])
            normalized = np.linalg.inv(parts["information"])
        except np.linalg.LinAlgError:
            bread = normalized = np.full((k, k), np.nan)
        meat = parts["scores"].T @ parts["scores"]
        cluster = bread @ meat @ bread * (n_requests / (n_requests - 1.0)) * ((n_cells - 1.0) / (n_cells - k))
    x0, y0, n0, _ = best["skeleton"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DomainWarning)
        model = sm.GLM(np.column_stack([y0, n0 - y0]), pd.DataFrame(x0, columns=names),
                       family=fitmod._family_obj(fam.link))
    model.formula = f"{lhs} ~ {rhs}"  # predict(frame) builds the design from the full data's design info
    model.data.model_spec = design
    result = GLMResults(model, beta, normalized_cov_params=normalized, scale=1.0)
    result.nobs, result.df_model, result.df_resid = n_cells, k - 1, n_cells - k
    result.converged, result.fit_history = converged, {"iteration": iteration, "deviance": history}
    result._cache.update(llf=parts["llf"], deviance=parts["deviance"])
    if cov_type == "cluster":
        result.cov_type = "cluster"
        result.cov_kwds = {"groups": "request_id", "use_correction": True, "df_correction": True,
                           "description": "CR1 by request, streamed out of core"}
        result.cov_params_default = cluster
        result.use_t = True
        result.df_resid_inference = n_requests - 1
    result = GLMResultsWrapper(result)
    fits = f"{len(offsets)} fits (one per offset c), " if fam.profile_eps else ""
    notes.append(f"fitted out of core: {n_cells:,} cells streamed, {fits}{iteration} IRLS passes (statsmodels' IRLS "
                 "and CR1 sandwich on the same cells; the cells themselves are not kept)")
    if not parts["finite"]:
        notes.append("perfect separation: a fitted probability is exactly 0 or 1, so some terms are not identified "
                     "(their estimates run off towards infinity, cluster-robust errors are NaN); record more "
                     "requests or fit a simpler family")
    return fitmod.FittedLaw(result=result, counts=None, covariate_means=covariate_means, **common)


def fit_law_out_of_core(traces, family: str = "law_exp", by: str | None = None, *, depth: str = "factor",
                        width_log10: float = 0.05, eps: float = atrisk.EPS_NATS, cov_type: str = "cluster",
                        alpha: float = 0.05, min_requests_per_category: int = 5, drop_small_categories: bool = False,
                        drafters: Sequence[str] | None = None, by_arm: bool = False, on_invalid: str = "raise",
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int | None = None,
                        memory_limit: str | None = None, temp_directory: str | None = None,
                        batch_cells: int = STREAM_BATCH_CELLS, tol: float = 1e-10, max_iter: int = 100,
                        start_params=None):
    """``fit_law(load_traces(traces), family, by)`` for runs larger than memory, with memory bounded by a batch
    of cells and the number of requests, never by the number of token rows or cells.

    1. the at-risk cells: the query of ``at_risk_sql`` run by DuckDB over groups of shards, each group's cells
       written to a Parquet file in a temporary folder (``temp_directory``), pooled where two groups share a
       cell key (as ``aggregate_at_risk_sql``);
    2. ``fit_law``'s checks on one row per request (the same sums, request and category counts);
    3. the design matrix built batch by batch by patsy from the family's formula (``incr_dbuilder``: every
       level known up front) and kept on disk with the counts and request codes;
    4. statsmodels' IRLS (``GLM._fit_irls``: the same start, weights and working response), one pass over the
       cells per iteration accumulating X'WX and X'Wz, until the largest relative step is below ``tol``;
    5. one pass at the estimate through statsmodels' own ``GLM.score_obs`` / ``hessian`` on each batch: the
       observed Hessian, the scores summed per request, and the CR1 covariance of ``cov_cluster``
       (``H^-1 S H^-1 G/(G-1) (N-1)/(N-K)``, S the sum over requests of the outer products of their score
       sums), t(G - 1) inference.

    Returns the ``FittedLaw`` (``LawSet`` with ``by``) of ``fit_law``: the same summary, predictions and printout;
    estimates and standard errors equal within 1e-6 (``tests/test_outofcore.py``, ``bench/fleet.py``). Its
    ``result`` is a statsmodels ``GLMResults`` whose params, covariance, llf, deviance and nobs are those of the
    whole fit; its ``model`` holds the design info and the first cells only (observation-level attributes such
    as ``resid`` are not available out of core), and the law keeps no count table (``counts`` is None, so the
    P1 line of the printout, which refits with category terms, is left out: run ``fit_law_out_of_core`` with
    ``with_category_terms(family)`` for it). Families: every GLM family whose covariates the query computes,
    the primary ``law_exp_obs_ceil`` included: decode-time covariates (``law_exp_obs``, ``law_exp_lag``,
    ``law_exp_runmean``, ``law_exp_pos``: their cell means from windows over each request's output, their logs
    taken of the cell means as ``fit_law`` does, log D left out where one depth was drafted; the training means
    that ``steady_state`` reads are kept in ``covariate_means``) and a profiled offset (``profile_eps``:
    ``law_exp_ceil``, ``law_exp_obs_ceil``: steps 3-4 once per offset c of ``fit.EPS_GRID`` on log(H + c) of the
    cells' mean entropy, plus a log-likelihood pass; the largest log-likelihood among converged fits wins, as
    ``fit._fit_profile_eps``, and step 5 runs for it; the law's ``eps`` is that c). ``law_iso`` and
    ``law_exp_draftent`` (the drafter's entropy, not in the query) are refused with what to use instead.
    ``batch_cells``: cells per batch; ``chunk_bytes``, ``threads``, ``memory_limit``, ``temp_directory``: DuckDB
    (as ``aggregate_at_risk_sql``). ``by_arm``: the cells' ``drafter_id`` is the run's arm label (as
    ``analysis.make_view``: two arms of one drafter id, e.g. its chain and DDTree runs, stay apart, and
    ``by="drafter_id"`` fits one law per arm); otherwise such a mix is refused.
    """
    from entropy_law.law.fit import DEPTH_TERMS, LawSet

    fam = get_family(family)
    _streamable(fam)
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    if depth not in DEPTH_TERMS:
        raise ValueError(f"depth must be one of {list(DEPTH_TERMS)}")
    if cov_type not in ("cluster", "nonrobust"):
        raise ValueError("cov_type must be 'cluster' or 'nonrobust'")
    if by is not None:
        by = {"drafter": "drafter_id"}.get(by, by)
        if by not in ("drafter_id", "category"):
            raise ValueError(f"by={by!r}: out of core a law is fitted per 'drafter_id' or per 'category'")
    bins = tuple(fam.bin_columns)
    keys = (*_KEYS, *fam.extra_keys)
    means = _means_for(fam, "family", with_rounds=True)
    for m in ("log_entropy",) if fam.name == "law_exp_mundlak" else ():
        if m not in means:
            means.append(m)
    options = dict(depth=depth, cov_type=cov_type, alpha=alpha, eps=eps,
                   min_requests_per_category=min_requests_per_category, drop_small_categories=drop_small_categories,
                   batch_cells=batch_cells, tol=tol, max_iter=max_iter, start_params=start_params)
    with tempfile.TemporaryDirectory(prefix="entropy-law-cells-", dir=temp_directory) as tmp:
        folder = Path(tmp)
        con = _connect(threads, memory_limit, temp_directory)
        try:
            files = _write_cells(con, traces, bins, keys, means, width_log10=width_log10, eps=eps, drafters=drafters,
                                 chunk_bytes=chunk_bytes, folder=folder, by_arm=by_arm)
            source, notes = _cell_source(con, files, bins, keys, means, on_invalid)
            if by is None:
                return _fit_streamed(con, source, fam, folder=folder, notes=notes, **options)
            values = [r[0] for r in con.sql(f"SELECT DISTINCT {by} FROM ({source}) ORDER BY 1").fetchall()]
            laws = {v: _fit_streamed(con, f"SELECT * FROM ({source}) WHERE {by} = {_sql_str(v)}", fam, folder=folder,
                                     notes=list(notes), **options) for v in values}
            return LawSet(by=by, laws=laws)
        finally:
            con.close()


# ------------------------------------------------------------------------------ in memory or out of core

# what fit_law needs in memory per token row: 7.94 GB peak RSS for 9,038,348 rows (bench/results/fleet.txt); the
# full report holds more (bootstrap, LOCO), so this is a lower bound of what an in-memory analysis needs
IN_MEMORY_BYTES_PER_TOKEN_ROW = 880


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux ``MemAvailable``; else free physical pages);
    None where neither is known."""
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
    """Refuse (``ValueError``, saying what to do) an in-memory ``what`` on runs whose token rows need more memory
    than is available (at least ``IN_MEMORY_BYTES_PER_TOKEN_ROW`` per row, counted from the Parquet footers, no
    data read), instead of being killed for memory half way. ``traces``: a path or a ``TraceSet``;
    ``available``: bytes (default ``available_memory()``; unknown: no check). Returns the token rows."""
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


# ------------------------------------------------------------------------ summaries for the out-of-core report

# per drafter id x category of one group of shards: sums only (added over the groups by ``category_summary_sql``);
# the decode rounds (round_index > 0) as ``TraceAnalysis.results_table`` counts them; the requests table gives the
# category of each request and its count (a request lies in one shard)
SUMMARY_SQL = """
WITH req AS (
  SELECT q.run_id, q.request_id, q.category, runs.drafter_id
  FROM requests AS q JOIN runs ON q.run_id = runs.run_id
),
n AS (
  SELECT drafter_id, category, COUNT(*) AS requests FROM req GROUP BY drafter_id, category
),
rnd AS (
  SELECT req.drafter_id, req.category, COUNT(*) AS rounds, SUM(r.committed) AS tokens,
         SUM(CASE WHEN r.tree_nodes > 0 THEN 1 ELSE 0 END) AS drafting_rounds,
         SUM(CASE WHEN r.tree_nodes > 0 THEN r.accepted ELSE 0 END) AS accepted
  FROM rounds AS r JOIN req ON r.run_id = req.run_id AND r.request_id = req.request_id
  WHERE r.round_index > 0
  GROUP BY req.drafter_id, req.category
),
tok AS (
  SELECT req.drafter_id, req.category,
         SUM(CASE WHEN isfinite(t.target_entropy_nats) THEN 1 ELSE 0 END) AS entropy_tokens,
         SUM(CASE WHEN isfinite(t.target_entropy_nats) THEN t.target_entropy_nats ELSE 0 END) AS entropy_sum,
         SUM(CASE WHEN t.depth = 1 AND t.role IN ('accepted', 'correction') THEN 1 ELSE 0 END) AS d1_trials,
         SUM(CASE WHEN t.depth = 1 AND t.role = 'accepted' THEN 1 ELSE 0 END) AS d1_accepted
  FROM tokens AS t JOIN req ON t.run_id = req.run_id AND t.request_id = req.request_id
  GROUP BY req.drafter_id, req.category
)
SELECT n.drafter_id, n.category, n.requests, rnd.rounds, rnd.tokens, rnd.drafting_rounds, rnd.accepted,
       tok.entropy_tokens, tok.entropy_sum, tok.d1_trials, tok.d1_accepted
FROM n
LEFT JOIN rnd ON n.drafter_id = rnd.drafter_id AND n.category = rnd.category
LEFT JOIN tok ON n.drafter_id = tok.drafter_id AND n.category = tok.category
"""

# depth-1 at-risk trials per drafter id x category x log-spaced entropy bin of one group of shards (sums only)
CURVE_SQL = """
SELECT runs.drafter_id, q.category,
       {bin} AS bin,
       COUNT(*) AS n, SUM(CASE WHEN t.role = 'accepted' THEN 1 ELSE 0 END) AS accepted,
       SUM(GREATEST(t.target_entropy_nats, 0)) AS entropy_sum
FROM tokens AS t
JOIN requests AS q ON t.run_id = q.run_id AND t.request_id = q.request_id
JOIN runs ON t.run_id = runs.run_id
WHERE t.depth = 1 AND t.role IN ('accepted', 'correction') AND isfinite(t.target_entropy_nats)
      AND t.target_entropy_nats >= {negative}
GROUP BY runs.drafter_id, q.category, bin
"""


def _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory, queries: dict) -> dict:
    """Each query of ``queries`` (name -> SQL over ``tokens``, ``rounds``, ``requests``, ``runs``) run on every
    group of shards; name -> the groups' result rows stacked (pandas)."""
    import pyarrow as pa

    shards = _shards(traces, drafters, by_arm)
    con = _connect(threads, memory_limit, temp_directory)
    out = {name: [] for name in queries}
    try:
        for _ in _views_per_group(con, shards, chunk_bytes, ("tokens", "rounds", "requests")):
            for name, sql in queries.items():
                out[name].append(_fetch_arrow(con.sql(sql)))
    finally:
        con.close()
    def plain(table):  # DuckDB's SUM of integers is a HUGEINT (Arrow decimal128): as float64 for pandas
        return table.cast(pa.schema([pa.field(f.name, pa.float64()) if pa.types.is_decimal(f.type) else f
                                     for f in table.schema]))

    return {name: pa.concat_tables([plain(t) for t in parts]).to_pandas() if parts else pd.DataFrame()
            for name, parts in out.items()}


def category_summary_sql(traces, *, drafters: Sequence[str] | None = None, by_arm: bool = False,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                         threads: int | None = None, memory_limit: str | None = None,
                         temp_directory: str | None = None) -> pd.DataFrame:
    """Per drafter id x category, out of core (DuckDB over groups of shards, sums added over the groups):
    ``requests``, decode ``rounds`` (round index > 0, as ``TraceAnalysis.results_table``), committed
    ``tokens``, ``drafting_rounds`` (tree_nodes > 0), ``tokens_per_round``, ``mean_accepted`` (accepted drafts
    per drafting round), ``mean_entropy_nats`` (over the arm's output tokens with a finite entropy; NaN where
    none has one, e.g. an imported run before ``entropy-law entropy``), ``entropy_tokens``, and the depth-1
    at-risk ``d1_trials`` and ``d1_acceptance``. ``traces``: a run directory, a folder of runs or a ``TraceSet``
    (its runs); ``by_arm``: keyed by arm label instead of drafter id (see ``fit_law_out_of_core``), else the
    arms are checked as in ``aggregate_at_risk_sql``."""
    frame = _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory,
                        {"summary": SUMMARY_SQL})["summary"]
    return _summary_frame(frame)


def _summary_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``category_summary_sql``'s table from the stacked per-group rows of ``SUMMARY_SQL``."""
    columns = ["requests", "rounds", "tokens", "drafting_rounds", "accepted", "entropy_tokens", "entropy_sum",
               "d1_trials", "d1_accepted"]
    if frame.empty:
        raise ValueError("no requests in these traces")
    frame = frame.groupby(["drafter_id", "category"], as_index=False)[columns].sum(min_count=1)
    frame[columns] = frame[columns].fillna(0)
    counts = [c for c in columns if c != "entropy_sum"]
    frame[counts] = frame[counts].round().astype("int64")
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["tokens_per_round"] = frame["tokens"] / frame["rounds"].where(frame["rounds"] > 0)
        frame["mean_accepted"] = frame["accepted"] / frame["drafting_rounds"].where(frame["drafting_rounds"] > 0)
        frame["mean_entropy_nats"] = frame["entropy_sum"] / frame["entropy_tokens"].where(frame["entropy_tokens"] > 0)
        frame["d1_acceptance"] = frame["d1_accepted"] / frame["d1_trials"].where(frame["d1_trials"] > 0)
    order = ["drafter_id", "category", "requests", "rounds", "tokens", "drafting_rounds", "tokens_per_round",
             "mean_accepted", "mean_entropy_nats", "entropy_tokens", "d1_trials", "d1_acceptance"]
    return frame[order].sort_values(["drafter_id", "category"]).reset_index(drop=True)


def acceptance_curve_sql(traces, *, width_log10: float = 0.25, eps: float = atrisk.EPS_NATS,
                         drafters: Sequence[str] | None = None, by_arm: bool = False,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int | None = None,
                         memory_limit: str | None = None, temp_directory: str | None = None) -> pd.DataFrame:
    """Depth-1 acceptance per drafter id x category x log-spaced bin of the target entropy, out of core: the
    bin floor((log10(H + eps) - log10(eps)) / width_log10) of every at-risk depth-1 trial (role accepted or
    correction; H finite, fp32 round-off below 0 counted as 0, as ``atrisk``), with ``n``, ``accepted``,
    ``rate``, its Wilson 95% ``ci_low`` / ``ci_high`` and the bin's mean ``entropy_nats`` (the columns of
    ``plots.figures.binned_acceptance_table``, whose bins are quantiles instead)."""
    frame = _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory,
                        {"curve": _curve_sql(width_log10, eps)})["curve"]
    return _curve_frame(frame)


def _curve_sql(width_log10: float, eps: float) -> str:
    if not width_log10 > 0:
        raise ValueError(f"width_log10 must be > 0, got {width_log10}")
    return CURVE_SQL.format(bin=_log_bin("GREATEST(t.target_entropy_nats, 0)", eps, width_log10),
                            negative=_literal(-atrisk.NEGATIVE_TOLERANCE))


def _curve_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``acceptance_curve_sql``'s table from the stacked per-group rows of ``CURVE_SQL``."""
    from entropy_law.law.stats import wilson_interval

    columns = ["drafter_id", "category", "bin", "n", "accepted", "rate", "ci_low", "ci_high", "entropy_nats"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame = frame.groupby(["drafter_id", "category", "bin"], as_index=False)[["n", "accepted", "entropy_sum"]].sum()
    frame[["n", "accepted"]] = frame[["n", "accepted"]].round().astype("int64")
    frame["rate"] = frame["accepted"] / frame["n"]
    frame["ci_low"], frame["ci_high"] = wilson_interval(frame["accepted"], frame["n"])
    frame["entropy_nats"] = frame["entropy_sum"] / frame["n"]
    return frame[columns].sort_values(["drafter_id", "category", "bin"]).reset_index(drop=True)


def report_summaries_sql(traces, *, width_log10: float = 0.25, eps: float = atrisk.EPS_NATS,
                         drafters: Sequence[str] | None = None, by_arm: bool = False,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int | None = None,
                         memory_limit: str | None = None,
                         temp_directory: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(category_summary_sql(...), acceptance_curve_sql(...))`` from one pass over the shards: both queries
    run on each group while its views are open (what the out-of-core report needs, one read of the fleet)."""
    parts = _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory,
                        {"summary": SUMMARY_SQL, "curve": _curve_sql(width_log10, eps)})
    return _summary_frame(parts["summary"]), _curve_frame(parts["curve"])


__all__ = ["acceptance_curve_sql", "aggregate_at_risk_sql", "at_risk_sql", "category_summary_sql",
           "check_fits_in_memory", "finish_cells", "fit_law_out_of_core",
           "report_summaries_sql"]
