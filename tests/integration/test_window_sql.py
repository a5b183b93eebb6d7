"""The Spark jobs' window floor (``window_start_sql``) is the agent's and the reconciler's
(``window_start``), run in a real Spark: the same window for every time, a time before 1970
too (Spark's ``div`` truncates toward zero; the floor does not)."""

from __future__ import annotations

import pytest

from docket_common.window import DEFAULT_WINDOW_MS, window_start, window_start_sql

TIMES = [-1_200_001, -600_001, -600_000, -599_999, -1, 0, 1, 599_999, 600_000,
         1_763_766_599_999, 1_763_766_600_000]


def test_the_sql_floor_is_the_python_floor(tmp_path):
    pyspark = pytest.importorskip("pyspark.sql")
    spark = (pyspark.SparkSession.builder.appName("docket-window-test").master("local[1]")
             .config("spark.ui.enabled", "false")
             .config("spark.local.dir", str(tmp_path))
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        df = spark.createDataFrame([(t,) for t in TIMES], "ms LONG")
        for w in (DEFAULT_WINDOW_MS, 60_000, 1_000):
            got = [r[0] for r in df.selectExpr(window_start_sql("ms", w)).collect()]
            assert got == [window_start(t, w) for t in TIMES], w
        truncated = [r[0] for r in df.selectExpr(
            f"div(ms, {DEFAULT_WINDOW_MS}) * {DEFAULT_WINDOW_MS}").collect()]
        assert truncated != [window_start(t) for t in TIMES]     # what the floor is for
    finally:
        spark.stop()
