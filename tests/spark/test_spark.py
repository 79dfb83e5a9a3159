"""The txnstream data source on a real local Spark and the real broker."""

from __future__ import annotations

import uuid

import pytest

from tests.spark.conftest import make_topic

pytestmark = pytest.mark.spark


def opts(config, **extra):
    o = {"kafka.bootstrap.servers": config.bootstrap_servers,
         "txnstream.prefix": config.topics.prefix}
    o.update(extra)
    return o


def write_mix(client, topic, n_txns, seed=0):
    """Committed and aborted txns; returns the committed values."""
    import random

    rng = random.Random(seed)
    p = client.create_producer(topic)
    committed = set()
    for t in range(n_txns):
        txn = client.new_transaction()
        vals = [f"s{seed}-t{t}-{i}".encode() for i in range(rng.randint(1, 5))]
        for v in vals:
            p.send(v, txn=txn)
        if rng.random() < 0.3:
            txn.abort()
        else:
            txn.commit()
            committed.update(vals)
    return committed


def test_batch_read_is_committed_only_and_hides_open_txns(spark, config, worker, client):
    topic = make_topic(config, 2)
    committed = write_mix(client, topic, 30)
    p = client.create_producer(topic)
    open_txn = client.new_transaction()
    p.send(b"open-1", txn=open_txn, partition=0)
    p.flush_transaction(open_txn)
    rows = spark.read.format("txnstream").options(**opts(config, subscribe=topic)).load() \
        .select("value", "txn_id").collect()
    values = [bytes(r.value) for r in rows]
    assert len(values) == len(set(values))
    assert set(values) == committed
    assert all(r.txn_id for r in rows)
    open_txn.commit()
    later = {bytes(r.value) for r in spark.read.format("txnstream")
             .options(**opts(config, subscribe=topic)).load().select("value").collect()}
    assert later == committed | {b"open-1"}


def test_stream_restart_from_checkpoint_resumes_without_loss_or_repeat(
        spark, config, worker, client, tmp_path):
    topic = make_topic(config, 2)
    first = write_mix(client, topic, 20, seed=1)
    seen: list[bytes] = []

    def run_once():
        q = (spark.readStream.format("txnstream")
             .options(**opts(config, subscribe=topic, maxRecordsPerTrigger="15")).load()
             .writeStream.foreachBatch(
                 lambda df, _id: seen.extend(bytes(r.value) for r in df.select("value").collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()

    run_once()
    second = write_mix(client, topic, 20, seed=2)
    run_once()
    assert len(seen) == len(set(seen)), "a record was delivered twice across the restart"
    assert set(seen) == first | second


def test_sink_exactly_once_with_a_task_failing_on_its_first_attempt(
        spark, config, worker, client, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    src, dst = make_topic(config, 2), make_topic(config, 2)
    committed = write_mix(client, src, 40, seed=3)

    def flaky(v):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.attemptNumber() == 0 and ctx.partitionId() == 0:
            raise RuntimeError("first attempt fails on purpose")
        return bytes(v).upper()

    upper = F.udf(flaky, BinaryType())
    q = (spark.readStream.format("txnstream").options(**opts(config, subscribe=src)).load()
         .select(upper("value").alias("value"))
         .writeStream.format("txnstream")
         .options(**opts(config, topic=dst, **{"txnstream.txnTimeoutSeconds": "30"}))
         .option("checkpointLocation", str(tmp_path / "sink"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    out = [bytes(r.value) for r in spark.read.format("txnstream")
           .options(**opts(config, subscribe=dst)).load().select("value").collect()]
    assert len(out) == len(set(out)), "duplicates in the sink's output"
    assert set(out) == {v.upper() for v in committed}


def test_batch_write_commits_once(spark, config, worker, client):
    dst = make_topic(config, 1)
    df = spark.range(50).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    out = sorted(int(bytes(r.value)) for r in spark.read.format("txnstream")
                 .options(**opts(config, subscribe=dst)).load().select("value").collect())
    assert out == list(range(50))


@pytest.mark.parametrize("options,needle", [
    ({"subscribe": "x"}, "kafka.bootstrap.servers"),
    ({"subscribe": f"missing-{uuid.uuid4().hex[:6]}", "_boot": 1}, "does not exist"),
    ({"subscribe": "T", "startingOffsets": "{not json", "_boot": 1}, "startingOffsets"),
])
def test_bad_options_name_the_option(spark, config, worker, options, needle):
    o = dict(options)
    if o.pop("_boot", None):
        o.update(opts(config))
    if o.get("subscribe") == "T":
        o["subscribe"] = make_topic(config, 1)
    with pytest.raises(Exception) as exc:
        spark.read.format("txnstream").options(**o).load().collect()
    assert needle in str(exc.value)
