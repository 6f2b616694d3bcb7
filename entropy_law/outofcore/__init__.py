"""The out-of-core path: the law of trace folders larger than memory, by DuckDB over the Parquet shards.

``sql`` (the at-risk aggregate as one SQL query), ``driver`` (runs it over groups of shards), ``streamed``
(``fit_law_out_of_core``), ``memory`` (``check_fits_in_memory``), ``summaries`` (the report's summaries in SQL) and
``spark`` (the same SQL on Spark). Never imports torch; DuckDB and pyspark are imported when used.
"""

from entropy_law.outofcore.driver import aggregate_at_risk_sql, finish_cells
from entropy_law.outofcore.memory import IN_MEMORY_BYTES_PER_TOKEN_ROW, available_memory, check_fits_in_memory
from entropy_law.outofcore.sql import at_risk_sql
from entropy_law.outofcore.streamed import OutOfCoreError, fit_law_out_of_core
from entropy_law.outofcore.summaries import acceptance_curve_sql, category_summary_sql, report_summaries_sql

__all__ = ["IN_MEMORY_BYTES_PER_TOKEN_ROW", "OutOfCoreError", "acceptance_curve_sql", "aggregate_at_risk_sql",
           "at_risk_sql", "available_memory", "category_summary_sql", "check_fits_in_memory", "finish_cells",
           "fit_law_out_of_core", "report_summaries_sql"]
