"""A real local Spark (local[2], two attempts per task) and a coordinator worker."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.integration.coordinator.conftest import (  # noqa: F401
    client,
    make_topic,
    wait_until,
    worker,
)

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from txnstream_spark.datasource import TxnStreamDataSource

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # The checkout on PYTHONPATH for the Python workers Spark starts (they unpickle test
    # helpers by module), for the JVM's environment only: it is copied when the JVM is
    # launched, so it is taken back after. Left set, it leaked into every subprocess
    # this test process started later (a pip run saw the checkout's egg-info).
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + (os.pathsep + before if before else "")
    try:
        session = (SparkSession.builder.master("local[2,2]").appName("txnstream-tests")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.executorEnv.PYTHONPATH", root)
                   .getOrCreate())
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    session.dataSource.register(TxnStreamDataSource)
    try:
        yield session
    finally:
        session.stop()


def drain(config, topic: str, idle_s: float = 15, expect: int | None = None,
          settle_s: float = 3) -> list[bytes]:
    """Every value of ``topic``, committed-only, until nothing arrives for ``idle_s``.

    With ``expect`` (the writer is done, all its txns decided): once that many values came,
    until nothing more arrives for ``settle_s`` (a duplicate is committed data at a later
    offset, delivered as fast as the rest), ``idle_s`` only bounding each wait before it.
    """
    import uuid

    from txnstream import Client

    out: list[bytes] = []
    with Client(config=config) as reader:
        c = reader.subscribe(topic, subscription=f"chk-{uuid.uuid4().hex[:6]}")
        while (m := c.receive(timeout_s=idle_s if expect is None or len(out) < expect
                              else settle_s)) is not None:
            out.append(m.value)
            c.acknowledge(m)
        c.close()
    return out


def stream_values(spark, config, tmp_path, seen: list[bytes], sizes: list[int] | None = None,
                  trigger: dict | None = None, **options):
    """A started ``readStream.format("txnstream")`` query whose micro-batches' values go
    to ``seen`` (and, if given, each non-empty batch's size to ``sizes``)."""
    from tests.spark.test_spark import opts

    def batch(df, _id):
        got = [bytes(r.value) for r in df.select("value").collect()]
        seen.extend(got)
        if sizes is not None and got:
            sizes.append(len(got))

    return (spark.readStream.format("txnstream").options(**opts(config, **options)).load()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(**(trigger or {"processingTime": "200 milliseconds"})).start())


def run_available_now(spark, config, tmp_path, seen: list[bytes], **options):
    """One ``Trigger.AvailableNow`` run of :func:`stream_values` on ``tmp_path``'s
    checkpoint: the query's error (None if it finished cleanly)."""
    from pyspark.errors import StreamingQueryException

    q = stream_values(spark, config, tmp_path, seen, trigger={"availableNow": True},
                      **options)
    try:
        finished = q.awaitTermination(120)
    except StreamingQueryException as exc:
        return exc
    assert finished, "the query hung"
    return q.exception()
