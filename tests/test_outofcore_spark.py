"""The out-of-core aggregation and the report's summaries on Spark (pyspark, local mode) equal DuckDB's.

The same query text runs on both engines (``entropy_law.outofcore.sql`` / ``summaries``); on one tiny simulated
fleet (several shards per run) the cells' counts are identical, their float means within 1e-12 relative, the laws
fitted on either table within 1e-9, and the report's summaries equal. One Spark session for the module. Skipped
only where pyspark is not installed (the ``[spark]`` extra).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("duckdb")
pytest.importorskip("pyspark")

from entropy_law.analysis.simulate import TreeSpec, simulate_traces  # noqa: E402
from entropy_law.law.fit import PRIMARY_FAMILY, fit_law  # noqa: E402
from entropy_law.outofcore import aggregate_at_risk_sql, report_summaries_sql  # noqa: E402
from entropy_law.outofcore.spark import aggregate_at_risk_spark, local_session, report_summaries_spark  # noqa: E402
from entropy_law.traces.validation import TraceValidationError  # noqa: E402
from test_outofcore import write_runs  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    """``local_session`` on a JVM started with the client compiler only and one GC thread: on a few tiny queries the
    JIT's optimising compiler and the parallel GC threads are most of the JVM's CPU (the driver's environment is
    restored once the JVM runs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_SUBMIT_ARGS",
                     "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell")
        session = local_session(1, driver_memory="1g", shuffle_partitions=1)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    sim = simulate_traces(seed=5, n_requests_per_category=5, tokens_per_request=(50, 120), block_size=6,
                          tree=TreeSpec(depth=4, nodes=10), block_depths={"probs": [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]},
                          category_effects={"qa": 0.3})
    return write_runs(tmp_path_factory.mktemp("spark-fleet"), sim)


def split(frame: pd.DataFrame):
    counts = [c for c in frame.columns if c in ("n_acc", "n", "n_rej") or c.startswith("bin_")
              or c in frame.attrs.get("keys", ())]
    return frame[counts].reset_index(drop=True), frame.drop(columns=counts).to_numpy(float)


@pytest.mark.parametrize("family", [PRIMARY_FAMILY, "law_exp_cum"])  # windows, rounds join, miss; cumulative H
def test_spark_cells_and_law_equal_duckdbs(spark, fleet, family):
    duck = aggregate_at_risk_sql(fleet, family, drafters=["sim-block"], chunk_bytes=20_000, threads=1)
    cluster = aggregate_at_risk_spark(fleet, family, spark=spark, drafters=["sim-block"])
    assert list(cluster.columns) == list(duck.columns) and cluster.attrs == duck.attrs
    duck_counts, duck_means = split(duck)
    cluster_counts, cluster_means = split(cluster)
    pd.testing.assert_frame_equal(cluster_counts, duck_counts, check_dtype=False)
    assert duck_counts["n"].sum() > 1000
    np.testing.assert_allclose(cluster_means, duck_means, rtol=1e-12, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = fit_law(duck, family).coefficients, fit_law(cluster, family).coefficients
    np.testing.assert_allclose(b["estimate"].to_numpy(), a["estimate"].to_numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b["std_err"].to_numpy(), a["std_err"].to_numpy(), rtol=1e-9, atol=1e-12)


def test_spark_report_summaries_equal_duckdbs(spark, fleet):
    duck_summary, duck_curve = report_summaries_sql(fleet)
    summary, curve = report_summaries_spark(fleet, spark=spark)
    for ours, theirs in ((summary, duck_summary), (curve, duck_curve)):
        floats = [c for c in theirs.columns if theirs[c].dtype == float]
        pd.testing.assert_frame_equal(ours.drop(columns=floats), theirs.drop(columns=floats), check_dtype=False)
        np.testing.assert_allclose(ours[floats].to_numpy(float), theirs[floats].to_numpy(float), rtol=1e-12)
    assert set(summary["drafter_id"]) == {"sim-block", "sim-tree"} and (summary["requests"] > 0).all()


def test_spark_reads_through_the_shard_checks(spark, fleet, tmp_path):
    import shutil

    damaged = tmp_path / "fleet"
    shutil.copytree(fleet, damaged)
    shard = sorted(damaged.rglob("tokens.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # a torn shard: refused before any row is read, as on DuckDB
    with pytest.raises((TraceValidationError, ValueError)) as err:
        aggregate_at_risk_spark(damaged, "law_exp", spark=spark, drafters=["sim-block"])
    assert str(shard.parent) in str(err.value) or shard.parent.name in str(err.value)
