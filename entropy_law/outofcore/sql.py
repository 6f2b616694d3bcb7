"""The aggregated at-risk table of many runs written down as ONE SQL query.

Known here: the aggregation of ``atrisk.aggregate_at_risk`` (counts per drafter x category x request x depth
x log-spaced covariate bin, with within-cell covariate means) as one query over three tables, ``tokens`` and
``rounds`` (the trace files, format v1) and ``runs`` (``run_id -> drafter_id``, from each ``run.json``), in the
SQL that DuckDB and Spark SQL share (``at_risk_sql``; ``docs/out-of-core.md``). Every window of the query (the
cumulative entropy of a round; the decode-time covariates of ``atrisk.sequence_covariates`` over a request's
whole output: the previous position's entropy, the running-mean entropy, the position) lies in one request.
Which rows are at risk, the covariates and their checks are those of ``atrisk`` (a test compares both paths
cell by cell).

Not known here: how the query is run (``outofcore.driver``), the law families (``entropy_law.law.fit``). No
torch, no DuckDB: the query is text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from entropy_law.law import atrisk


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
    ``position``). The query's steps, one function each: ``_sequence_ctes``, ``_at_risk_cte``, ``_checked_cte``,
    ``_covariates_cte``, ``_binned_cte`` and ``_cells_select``.
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
    needs = _QueryNeeds(
        miss=_MISS_BIN in bin_columns or _MISS_LOG in means,
        rounds=drafted_depth_key or "log_drafted_depth" in means,
        cum="cum_entropy_nats" in bin_columns or bool({"cum_entropy_nats", "log1p_cum_entropy"} & set(means)),
        lag="lag_entropy_nats" in bin_columns or bool({"lag_entropy_nats", "log_lag_entropy"} & set(means)),
        run="run_mean_entropy_nats" in bin_columns
        or bool({"run_mean_entropy_nats", "log_run_mean_entropy"} & set(means)),
        pos="position" in bin_columns or "log1p_position" in means)
    ctes, source = _sequence_ctes(needs)
    steps = [*ctes, _at_risk_cte(needs, source), _checked_cte(needs), _covariates_cte(needs),
             _binned_cte(means, bin_columns, eps, width_log10)]
    return "WITH " + ",\n".join(steps) + "\n" + _cells_select(means, bin_columns, drafted_depth_key)


@dataclass(frozen=True)
class _QueryNeeds:
    """What the asked-for means and bins need of the query: the target's miss, the rounds join, the cumulative
    entropy of a round, and the decode-time covariates (previous entropy, running mean, position)."""

    miss: bool
    rounds: bool
    cum: bool
    lag: bool
    run: bool
    pos: bool

    @property
    def sequence(self) -> bool:
        return self.lag or self.run or self.pos


_HI, _NEG_INF = "CAST('Infinity' AS DOUBLE)", "CAST('-Infinity' AS DOUBLE)"


def _sequence_ctes(needs: _QueryNeeds) -> tuple[list[str], str]:
    """Step 0, ``(CTEs, the table the at-risk rows are read from)``: the decode-time covariates of
    atrisk.sequence_covariates, from each request's whole output (every token row, all roles, ordered by
    position): H at the previous position (at the first: its own H), the running mean of H (sum / count of rows
    so far), the position. As atrisk._add_sequence_covariates, H is max(H, 0); a NaN or NULL H is NULL here
    (pandas' NaN): skipped by the running sum, replaced by the row's own H as the previous entropy."""
    if not needs.sequence:
        return [], "tokens"
    h_seq = "CAST(target_entropy_nats AS DOUBLE)"
    window = ("OVER (PARTITION BY run_id, request_id ORDER BY position\n"
              "            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)")
    entropy_sequence = f"""entropy_sequence AS (
    SELECT run_id, request_id, category, round_index, position, depth, role, target_entropy_nats,
        target_renyi2_nats, target_top1_prob, target_logit_gap,
        CASE WHEN {h_seq} IS NULL OR ISNAN({h_seq}) THEN NULL ELSE GREATEST({h_seq}, 0.0E0) END AS h_seq
    FROM tokens
)"""
    sequence_windows = f"""sequence_windows AS (
    SELECT *,
        COALESCE(LAG(h_seq) OVER (PARTITION BY run_id, request_id ORDER BY position), h_seq) AS lag_h,
        SUM(h_seq) {window} AS sum_h,
        COUNT(*) {window} AS n_h
    FROM entropy_sequence
)"""
    return [entropy_sequence, sequence_windows], "sequence_windows"


def _at_risk_cte(needs: _QueryNeeds, source: str) -> str:
    """Step 1: the at-risk rows (accepted and correction tokens) with the round's drafted depth where needed."""
    drafted = ",\n        d.tree_depth AS drafted_depth" if needs.rounds else ""
    if needs.sequence:
        drafted += (",\n        CAST(t.position AS DOUBLE) AS pos,\n        t.lag_h,\n"
                    "        t.sum_h / CAST(t.n_h AS DOUBLE) AS run_mean_h")
    join_rounds = ("\n    JOIN rounds AS d\n      ON d.run_id = t.run_id AND d.request_id = t.request_id"
                   " AND d.round_index = t.round_index" if needs.rounds else "")
    return f"""at_risk AS (
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


def _checked_cte(needs: _QueryNeeds) -> str:
    """The row check of validate_covariates. NaN fails every comparison in both engines, so the range checks also
    refuse NaN (and NULL); a decode-time covariate that is not finite (an infinite entropy earlier in the output)
    makes the row invalid too."""
    lo, hi = _literal(-atrisk.NEGATIVE_TOLERANCE), _HI
    sequence_check = ""
    if needs.sequence:
        sequence_check = (f"\n         AND lag_h >= 0.0E0 AND lag_h < {hi}"
                          f"\n         AND run_mean_h >= 0.0E0 AND run_mean_h < {hi}")
    return f"""checked AS (
    SELECT *,
        (h >= {lo} AND h < {hi}
         AND h2 >= {lo} AND h2 < {hi}
         AND gap >= {lo} AND gap < {hi}
         AND p1 > {_NEG_INF} AND p1 < {hi}{sequence_check}) AS valid
    FROM at_risk
)"""


def _covariates_cte(needs: _QueryNeeds) -> str:
    """Step 2, the covariates: entropies and gaps in [-1e-5, 0) are fp32 round-off, set to 0 (as
    validate_covariates); NULL in rows that fail the check."""
    cols = ["drafter_id", "category", "request_id", "depth", "accepted", "valid"]
    if needs.rounds:
        cols.append("drafted_depth")
    value = {"target_entropy_nats": "GREATEST(h, 0.0E0)", "target_renyi2_nats": "GREATEST(h2, 0.0E0)",
             "target_top1_prob": "p1", "target_logit_gap": "GREATEST(gap, 0.0E0)"}
    for name in atrisk.COVARIATES:
        cols.append(f"CASE WHEN valid THEN {value[name]} END AS {name}")
    if needs.cum:  # sum of H over the round's earlier at-risk depths: the inclusive running sum minus H
        cols.append("CASE WHEN valid THEN SUM(CASE WHEN valid THEN GREATEST(h, 0.0E0) ELSE 0.0E0 END) OVER (\n"
                    "            PARTITION BY run_id, request_id, round_index ORDER BY depth\n"
                    "            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - GREATEST(h, 0.0E0) END"
                    " AS cum_entropy_nats")
    if needs.lag:
        cols.append("CASE WHEN valid THEN lag_h END AS lag_entropy_nats")
    if needs.run:
        cols.append("CASE WHEN valid THEN run_mean_h END AS run_mean_entropy_nats")
    if needs.pos:
        cols.append("CASE WHEN valid THEN pos END AS position")
    if needs.miss:  # the target's mass off its greedy token, 1 - p1 in [0, 1] (atrisk._add_target_miss)
        cols.append(f"CASE WHEN valid THEN {_miss_sql('p1')} END AS {_MISS_BIN}")
    return "covariates AS (\n    SELECT " + ",\n        ".join(cols) + "\n    FROM checked\n)"


def _binned_cte(means: list, bin_columns: Sequence[str], eps: float, width_log10: float) -> str:
    """Step 3: the derived (log) columns and the bins."""
    e = _literal(eps)
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
    return "binned AS (\n    SELECT " + ",\n        ".join(derived) + "\n    FROM covariates\n)"


def _cells_select(means: list, bin_columns: Sequence[str], drafted_depth_key: bool) -> str:
    """Step 4: one row per cell."""
    keys = [*_KEYS, *(["drafted_depth"] if drafted_depth_key else []), *[f"bin_{c}" for c in bin_columns]]
    out = [*keys, "SUM(accepted) AS n_acc", "COUNT(*) AS n"]
    out += [f"AVG({m}) AS {m}" for m in means]
    out.append("COUNT(*) - SUM(accepted) AS n_rej")
    return "SELECT " + ",\n       ".join(out) + "\nFROM binned\nGROUP BY " + ", ".join(keys)
