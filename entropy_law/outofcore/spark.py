"""The out-of-core aggregation and the report's summaries on Spark: the same SQL text, run by Spark SQL.

The queries of ``outofcore.sql`` (``at_risk_sql``) and ``outofcore.summaries`` (``SUMMARY_SQL``, the acceptance curve)
run as one query each over the selected runs' shards, found and checked as on DuckDB (``driver._shards``) and
registered as the views ``tokens``, ``rounds``, ``requests`` and ``runs`` (every window lies in one request, so Spark
may partition freely); the rows are finished by the DuckDB path's own code (``driver._finish``,
``summaries._summary_frame`` / ``_curve_frame``), so both engines return the same tables. ``local_session`` starts a
local-mode session; on a cluster pass your own (``docs/out-of-core.md``). The streamed fit is DuckDB's
(``fit_law_out_of_core``). pyspark is imported when a session starts (the ``[spark]`` extra)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from entropy_law.law import atrisk
from entropy_law.outofcore.driver import _finish, _query_spec, _shards
from entropy_law.outofcore.sql import at_risk_sql
from entropy_law.outofcore.summaries import SUMMARY_SQL, _curve_frame, _curve_sql, _summary_frame

SPARK_MISSING = "pyspark is not installed: pip install 'entropy-law[spark]' (needs Java 17+)"


def local_session(cores: int = 2, *, driver_memory: str = "4g", shuffle_partitions: int | None = None):
    """A local-mode Spark session on ``cores`` cores (``local[cores]``), UTC, Arrow transfers on; a session already
    running in this process is returned as it is (Spark allows one per JVM)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise ImportError(SPARK_MISSING) from err
    session = (SparkSession.builder.master(f"local[{int(cores)}]").appName("entropy-law")
               .config("spark.driver.memory", driver_memory)
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 4 * int(cores)))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def _register(spark, shards, tables: Sequence[str]) -> None:
    """The views of one query: each of ``tables`` over every selected shard's file, and ``runs``."""
    if not shards.dirs:
        raise ValueError("no finished shard in the selected runs: nothing to aggregate")
    for table in tables:
        files = [str(s / f"{table}.parquet") for s in shards.dirs]
        spark.read.option("mergeSchema", "true").parquet(*files).createOrReplaceTempView(table)
    rows = list(zip(shards.runs["run_id"].astype(str), shards.runs["drafter_id"].astype(str)))
    spark.createDataFrame(rows, "run_id string, drafter_id string").createOrReplaceTempView("runs")


def _arrow(frame):
    """A Spark DataFrame's rows on the driver as a pyarrow Table (``toArrow``, pyspark >= 4; else via pandas)."""
    import pyarrow as pa

    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    return pa.Table.from_pandas(frame.toPandas(), preserve_index=False)


def aggregate_at_risk_spark(traces, family: str | None = None, *, spark, bin_columns: Sequence[str] | None = None,
                            keys: Sequence[str] | None = None, width_log10: float = 0.05,
                            eps: float = atrisk.EPS_NATS, means: str = "all", drafters: Sequence[str] | None = None,
                            by_arm: bool = False, on_invalid: str = "raise") -> pd.DataFrame:
    """``aggregate_at_risk_sql`` run by Spark: the same query text, the same checks, the same table (columns, order
    of cells, ``attrs``), so ``fit_law`` takes it as it is. ``spark``: a ``SparkSession`` (``local_session`` or a
    cluster's); the other arguments as ``aggregate_at_risk_sql``. The trace files must be readable by every
    executor at the paths the driver sees (a shared file system, or object storage mounted alike)."""
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    bins, keys, columns = _query_spec(family, bin_columns, keys, means)
    sql = at_risk_sql(bin_columns=bins, width_log10=width_log10, eps=eps, means=columns,
                      drafted_depth_key="drafted_depth" in keys)
    _register(spark, _shards(traces, drafters, by_arm), ("tokens", "rounds"))
    return _finish([_arrow(spark.sql(sql))], bins, keys, columns, eps=eps, width_log10=width_log10,
                   on_invalid=on_invalid)


def report_summaries_spark(traces, *, spark, width_log10: float = 0.25, eps: float = atrisk.EPS_NATS,
                           drafters: Sequence[str] | None = None,
                           by_arm: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``report_summaries_sql`` run by Spark: ``(category summary, acceptance curve)`` from the same queries."""
    _register(spark, _shards(traces, drafters, by_arm), ("tokens", "rounds", "requests"))
    summary = _arrow(spark.sql(SUMMARY_SQL)).to_pandas()
    curve = _arrow(spark.sql(_curve_sql(width_log10, eps))).to_pandas()
    return _summary_frame(summary), _curve_frame(curve)


__all__ = ["SPARK_MISSING", "aggregate_at_risk_spark", "local_session", "report_summaries_spark"]
