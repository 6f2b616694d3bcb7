"""The out-of-core path: the law of trace folders larger than memory, by DuckDB over the Parquet shards.

Known here, one module each: ``sql`` (the aggregated at-risk table of ``entropy_law.law.atrisk`` written down as
one SQL query, ``at_risk_sql``), ``driver`` (DuckDB runs it over groups of finished shards, memory holding one
group's rows: ``aggregate_at_risk_sql``, ``finish_cells``), ``streamed`` (``fit_law_out_of_core``: IRLS and the
CR1 sandwich in passes over the cells on disk, the same ``FittedLaw`` as ``fit_law``), ``memory`` (whether an
in-memory fit fits: ``check_fits_in_memory``) and ``summaries`` (the out-of-core report's per-category summaries
and acceptance curve in SQL), and ``spark`` (the same SQL text run by Spark SQL: ``aggregate_at_risk_spark``,
``report_summaries_spark``; pyspark, the ``[spark]`` extra, is imported when a session starts).

Not known here: the law families, their formulas and checks (``entropy_law.law``, which this room reuses and
which never imports it), how traces are written (``entropy_law.traces``). Never imports torch, decoding,
drafters, jobs or plotting; DuckDB is imported when a query runs.
"""

from entropy_law.outofcore.driver import aggregate_at_risk_sql, finish_cells
from entropy_law.outofcore.memory import IN_MEMORY_BYTES_PER_TOKEN_ROW, available_memory, check_fits_in_memory
from entropy_law.outofcore.sql import at_risk_sql
from entropy_law.outofcore.streamed import OutOfCoreError, fit_law_out_of_core
from entropy_law.outofcore.summaries import acceptance_curve_sql, category_summary_sql, report_summaries_sql

__all__ = [
    "IN_MEMORY_BYTES_PER_TOKEN_ROW",
    "OutOfCoreError",
    "acceptance_curve_sql",
    "aggregate_at_risk_sql",
    "at_risk_sql",
    "available_memory",
    "category_summary_sql",
    "check_fits_in_memory",
    "finish_cells",
    "fit_law_out_of_core",
    "report_summaries_sql",
]
