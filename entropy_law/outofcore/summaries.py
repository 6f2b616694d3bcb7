"""What the out-of-core report shows beside the law, in SQL: per-category summaries and the depth-1 acceptance
curve, each run by DuckDB over groups of shards and summed over them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from entropy_law.law import atrisk
from entropy_law.outofcore.driver import DEFAULT_CHUNK_BYTES, _connect, _fetch_arrow, _shards, _views_per_group
from entropy_law.outofcore.sql import _literal, _log_bin


# The queries are SQL that DuckDB and Spark SQL read alike (``outofcore.spark``): a finite entropy is
# ``-inf < H < inf`` (NaN sorts above +inf in both engines, NULL compares to nothing).
# sums per drafter id x category of one group of shards; decode rounds (round_index > 0) as ``results_table``
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
         SUM(CASE WHEN t.target_entropy_nats > CAST('-Infinity' AS DOUBLE)
                   AND t.target_entropy_nats < CAST('Infinity' AS DOUBLE) THEN 1 ELSE 0 END) AS entropy_tokens,
         SUM(CASE WHEN t.target_entropy_nats > CAST('-Infinity' AS DOUBLE)
                   AND t.target_entropy_nats < CAST('Infinity' AS DOUBLE) THEN t.target_entropy_nats ELSE 0 END) AS entropy_sum,
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
WHERE t.depth = 1 AND t.role IN ('accepted', 'correction')
      AND t.target_entropy_nats > CAST('-Infinity' AS DOUBLE) AND t.target_entropy_nats < CAST('Infinity' AS DOUBLE)
      AND t.target_entropy_nats >= {negative}
GROUP BY runs.drafter_id, q.category, bin
"""


def _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory, queries: dict) -> dict:
    """Each query of ``queries`` (name -> SQL) run on every group of shards, the results stacked."""
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
    """Per drafter id x category, out of core: ``requests``, ``rounds``, ``tokens``, ``drafting_rounds``,
    ``tokens_per_round``, ``mean_accepted``, ``mean_entropy_nats``, ``entropy_tokens``, ``d1_trials``,
    ``d1_acceptance``."""
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
    """Depth-1 acceptance per drafter x category x log entropy bin, out of core (``binned_acceptance_table``)."""
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
    """``(category_summary_sql(...), acceptance_curve_sql(...))`` from one pass over the shards."""
    parts = _run_groups(traces, drafters, by_arm, chunk_bytes, threads, memory_limit, temp_directory,
                        {"summary": SUMMARY_SQL, "curve": _curve_sql(width_log10, eps)})
    return _summary_frame(parts["summary"]), _curve_frame(parts["curve"])
