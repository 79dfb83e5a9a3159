"""bench.spark_floor, the Spark source rows' floors: every row once, batch and streaming.

A floor that lost or doubled rows would make the bench's argument from it wrong (a first
version lost every row after each partition's first Arrow batch).
"""

from __future__ import annotations

import pytest

from bench.spark_floor import BATCH_ROWS, FloorDataSource
from tests.spark.conftest import wait_until

pytestmark = pytest.mark.spark

ROWS = 2 * BATCH_ROWS + 7  # a partial last batch in each of the two partitions


def test_the_memory_floor_reads_every_row_once(spark, tmp_path):
    spark.dataSource.register(FloorDataSource)
    opts = {"rows": str(ROWS), "mode": "memory", "partitions": "2"}
    r = spark.read.format("txnstream_floor").options(**opts).load().selectExpr(
        "count(*) AS n", "count(DISTINCT partition, offset) AS d",
        "min(length(value)) AS lo", "max(length(value)) AS hi").collect()[0]
    assert (r.n, r.d, r.lo, r.hi) == (ROWS, ROWS, 100, 100)
    q = (spark.readStream.format("txnstream_floor").options(**opts).load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    wait_until(lambda: not q.isActive, 30, "the floor's query to end")
    assert q.exception() is None
    assert sum(p.numInputRows for p in q.recentProgress) == ROWS
