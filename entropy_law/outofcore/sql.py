"""``atrisk.aggregate_at_risk`` as ONE SQL query over ``tokens``, ``rounds`` and ``runs``, in the SQL that DuckDB and
Spark share (``docs/out-of-core.md``); rows, covariates and checks are those of ``atrisk``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from entropy_law.law import atrisk


_LOG_OF = {"log_entropy": "target_entropy_nats", "log_renyi2": "target_renyi2_nats",
           "log_logit_gap": "target_logit_gap"}
_KEYS = tuple(atrisk.KEY_COLUMNS)  # drafter_id, category, request_id, depth
# the decode-time covariates the query computes, the columns binned among them, and the raw column of each log
_SEQUENCE_MEANS = ("lag_entropy_nats", "log_lag_entropy", "run_mean_entropy_nats", "log_run_mean_entropy",
                   "log1p_position")
_SEQUENCE_BINS = ("lag_entropy_nats", "run_mean_entropy_nats", "position")
_RAW_OF_LOG = {"log_lag_entropy": "lag_entropy_nats", "log_run_mean_entropy": "run_mean_entropy_nats"}
# the target's top-1 miss 1 - p1 (a bin column), its log, and the raw mean a fit takes the log of
_MISS_BIN = "target_miss_prob"
_MISS_LOG = "log_target_miss"
_MISS_RAW = "target_top1_prob"


def _literal(value: float) -> str:
    """A DOUBLE literal both DuckDB and Spark SQL read as the same IEEE double (``0.001E0``, ``1e-05``)."""
    text = repr(float(value))
    return text if "e" in text or "inf" in text or "nan" in text else f"{text}E0"


def _means_for(family, means: str, with_rounds: bool) -> list[str]:
    """The covariate means kept: ``"all"``, or ``"family"`` (those its fit reads, raw means for logs)."""
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
    """The target's miss probability 1 - p1, clipped to [0, 1], of the SQL expression ``p1``."""
    return f"LEAST(GREATEST(1.0E0 - {p1}, 0.0E0), 1.0E0)"


def _log_bin(column: str, eps: float, width_log10: float) -> str:
    """The log-spaced bin of ``column`` in SQL: floor((log10(x + eps) - log10(eps)) / width_log10)."""
    return (f"CAST(FLOOR((LOG10({column} + {_literal(eps)}) - ({_literal(np.log10(eps))})) / "
            f"{_literal(width_log10)}) AS BIGINT)")


def at_risk_sql(*, bin_columns: Sequence[str] = ("target_entropy_nats",), width_log10: float = 0.05,
                eps: float = atrisk.EPS_NATS, means: Sequence[str] | None = None,
                drafted_depth_key: bool = False) -> str:
    """The aggregation as one SQL query over ``tokens``, ``rounds`` and ``runs``: one row per cell, the keys (and
    ``drafted_depth`` with ``drafted_depth_key``), ``bin_<column>`` per ``bin_columns`` (NULL where the covariates are
    invalid), ``n_acc``, ``n``, ``n_rej`` and the mean of each of ``means`` (default: ``atrisk.COVARIATES`` and
    ``atrisk.DERIVED``)."""
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
    """What the asked-for means and bins need of the query."""

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
    """``(CTEs, table the at-risk rows read)``: ``atrisk.sequence_covariates`` as windows over each request's output, on
    max(H, 0)."""
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
    """The row check of validate_covariates (NaN and NULL fail every range check)."""
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
    """Step 2, the covariates (negatives set to 0, as validate_covariates; NULL in rows that fail the check)."""
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
    windows = ((needs.lag, "lag_h", "lag_entropy_nats"), (needs.run, "run_mean_h", "run_mean_entropy_nats"),
               (needs.pos, "pos", "position"), (needs.miss, _miss_sql("p1"), _MISS_BIN))
    for needed, value, name in windows:
        if needed:
            cols.append(f"CASE WHEN valid THEN {value} END AS {name}")
    return "covariates AS (\n    SELECT " + ",\n        ".join(cols) + "\n    FROM checked\n)"


def _binned_cte(means: list, bin_columns: Sequence[str], eps: float, width_log10: float) -> str:
    """Step 3: the derived (log) columns and the bins."""
    e = _literal(eps)
    derived = ["*"]
    for name, column in _LOG_OF.items():
        if name in means:
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
