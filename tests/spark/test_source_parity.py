"""The source answers as ``format("kafka")``'s does at its edges (issue tracker), on real Spark.

Empty reads return no rows; offsets JSON takes -2 (earliest) and -1 (latest) per
partition and is refused where Kafka refuses it, with Kafka's text and the option's
name; ``maxOffsetsPerTrigger`` limits a micro-batch; rows carry ``timestampType``;
Kafka source options the source does not support are refused, naming them; a batch
DataFrame resolves ``latest`` each time it is read, not once.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.spark.conftest import make_topic, wait_until
from tests.spark.test_spark import opts

pytestmark = pytest.mark.spark


def fill_plain(config, topic: str, per_partition: dict[int, int]) -> dict[int, list[bytes]]:
    """Plain records (no txn), ``per_partition[p]`` of them in partition ``p``."""
    from confluent_kafka import Producer

    raw = Producer(config.producer())
    out: dict[int, list[bytes]] = {}
    for p, n in per_partition.items():
        out[p] = [f"p{p}-{i}".encode() for i in range(n)]
        for v in out[p]:
            raw.produce(topic, v, partition=p)
    raw.flush(10)
    return out


def read_values(spark, config, **options) -> list[bytes]:
    rows = spark.read.format("txnstream").options(**opts(config, **options)).load() \
        .select("value").collect()
    return sorted(bytes(r.value) for r in rows)


def error_of(action) -> str:
    with pytest.raises(Exception) as exc:
        action()
    return str(exc.value)


# ---------------------------------------------------------------- 1. empty reads


def test_a_batch_read_of_an_empty_topic_returns_no_rows(spark, config):
    topic = make_topic(config, 2)
    df = spark.read.format("txnstream").options(**opts(config, subscribe=topic)).load()
    assert df.collect() == []
    assert df.count() == 0


def test_a_batch_read_of_a_topic_holding_only_an_open_txn_returns_no_rows(
        spark, config, worker, client):
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    open_txn = client.new_transaction()
    p.send(b"open", txn=open_txn)
    p.flush_transaction(open_txn)
    try:
        assert read_values(spark, config, subscribe=topic) == []
    finally:
        open_txn.abort()


# ---------------------------------------------------------------- 2. offsets JSON


def test_stream_starting_offsets_json_takes_minus_two_and_minus_one(spark, config, tmp_path):
    topic = make_topic(config, 2)
    rows = fill_plain(config, topic, {0: 4, 1: 3})
    seen: list[bytes] = []
    q = (spark.readStream.format("txnstream")
         .options(**opts(config, subscribe=topic,
                         startingOffsets=json.dumps({topic: {"0": -2, "1": -1}}))).load()
         .writeStream.foreachBatch(
             lambda df, _id: seen.extend(bytes(r.value) for r in df.select("value").collect()))
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    assert sorted(seen) == sorted(rows[0])  # partition 1 starts at its end


def test_batch_ending_offsets_minus_one_reads_to_the_committed_end(spark, config):
    topic = make_topic(config, 2)
    rows = fill_plain(config, topic, {0: 4, 1: 3})
    got = read_values(spark, config, subscribe=topic,
                      startingOffsets=json.dumps({topic: {"0": -2, "1": 1}}),
                      endingOffsets=json.dumps({topic: {"0": -1, "1": -1}}))
    assert got == sorted(rows[0] + rows[1][1:])


@pytest.mark.parametrize("option,value,text", [
    ("endingOffsets", "earliest", "ending offset can't be earliest for batch queries"),
    ("endingOffsets", {"0": -2}, "ending offset for {t}-0 can't be earliest for batch queries"),
    ("startingOffsets", "latest", "starting offset can't be latest for batch queries"),
    ("startingOffsets", {"0": -1}, "startingOffsets for {t}-0 can't be latest for batch queries"),
])
def test_batch_offsets_kafka_refuses_are_refused_with_its_text(spark, config, option, value,
                                                               text):
    topic = make_topic(config, 1)
    given = value if isinstance(value, str) else json.dumps({topic: value})
    msg = error_of(lambda: read_values(spark, config, subscribe=topic, **{option: given}))
    assert text.format(t=topic) in msg, msg[-1500:]
    assert f"option '{option}'" in msg, msg[-1500:]


def test_a_start_above_the_end_is_refused_naming_the_partition_and_both_offsets(spark, config):
    topic = make_topic(config, 1)
    fill_plain(config, topic, {0: 8})
    msg = error_of(lambda: read_values(
        spark, config, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 5}}),
        endingOffsets=json.dumps({topic: {"0": 3}})))
    assert f"{topic}-0 starts at offset 5, after its ending offset 3" in msg, msg[-1500:]


@pytest.mark.parametrize("option", ["startingOffsets", "endingOffsets"])
def test_offsets_json_naming_only_some_partitions_is_refused_naming_the_missing(
        spark, config, option):
    topic = make_topic(config, 3)
    msg = error_of(lambda: read_values(spark, config, subscribe=topic,
                                       **{option: json.dumps({topic: {"1": 0}})}))
    assert (f"option '{option}' must give an offset for every partition of the subscribed "
            f"topics (-2: earliest, -1: latest), as Kafka's source requires; missing: "
            f"{topic}-0, {topic}-2") in msg, msg[-1500:]


def test_stream_refuses_ending_offsets_as_kafka_does(spark, config, tmp_path):
    topic = make_topic(config, 1)

    def start():
        q = (spark.readStream.format("txnstream")
             .options(**opts(config, subscribe=topic, endingOffsets="latest")).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
        q.awaitTermination(60)
        q.stop()

    msg = error_of(start)
    assert "option 'endingOffsets': ending offset not valid in streaming queries" in msg, \
        msg[-1500:]


def test_stream_of_a_missing_topic_fails_at_its_start_naming_the_topic(spark, config,
                                                                     tmp_path):
    missing = f"missing-{uuid.uuid4().hex[:6]}"

    def start():
        q = (spark.readStream.format("txnstream")
             .options(**opts(config, subscribe=missing)).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
        q.awaitTermination(60)
        q.stop()

    msg = error_of(start)
    assert f"option 'subscribe': topic {missing!r} does not exist" in msg, msg[-1500:]


# ---------------------------------------------------------------- 3. options


@pytest.mark.parametrize("option", ["maxOffsetsPerTrigger", "maxRecordsPerTrigger"])
def test_max_offsets_per_trigger_limits_each_micro_batch(spark, config, tmp_path, option):
    topic = make_topic(config, 1)
    rows = fill_plain(config, topic, {0: 10})
    sizes: list[int] = []
    seen: list[bytes] = []

    def batch(df, _id):
        got = [bytes(r.value) for r in df.select("value").collect()]
        sizes.append(len(got))
        seen.extend(got)

    q = (spark.readStream.format("txnstream")
         .options(**opts(config, subscribe=topic, startingOffsets="earliest", **{option: "3"}))
         .load()
         .writeStream.foreachBatch(batch)
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    assert [s for s in sizes if s] == [3, 3, 3, 1]
    assert seen == rows[0]


def test_max_offsets_per_trigger_is_shared_in_proportion_to_the_backlog_as_kafka_does():
    """Kafka's ``rateLimit``: each partition's share of the limit follows what it has
    ahead; a share under one offset rounds up (no partition starves), others round down."""
    from txnstream_spark.source import _rate_limit

    start = {"t": {"0": 0, "1": 5, "2": 7}}
    ends = {"t": {"0": 100, "1": 6, "2": 7}}
    assert _rate_limit(start, ends, 10) == {"t": {"0": 9, "1": 6, "2": 7}}
    assert _rate_limit(start, ends, 1000) == ends  # under the limit: everything


def test_max_offsets_and_max_records_per_trigger_together_are_refused(spark, config):
    topic = make_topic(config, 1)
    msg = error_of(lambda: spark.readStream.format("txnstream").options(**opts(
        config, subscribe=topic, maxOffsetsPerTrigger="3", maxRecordsPerTrigger="3")).load())
    assert ("give one of the options 'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger' "
            "(its alias), not both") in msg, msg[-1500:]


def test_rows_carry_kafkas_timestamp_type_after_the_timestamp(spark, config, worker, client):
    from tests.integration.coordinator.conftest import set_topic_config

    create, append = make_topic(config, 1), make_topic(config, 1)
    set_topic_config(config, append, {"message.timestamp.type": "LogAppendTime"})
    for topic in (create, append):
        p = client.create_producer(topic)
        with client.transaction() as txn:
            p.send(b"v", txn=txn)
    got = {}
    for topic in (create, append):
        df = spark.read.format("txnstream").options(**opts(config, subscribe=topic)).load()
        assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                              "timestampType", "headers", "txn_id"]
        assert dict(df.dtypes)["timestampType"] == "int"
        got[topic] = [r.timestampType for r in df.collect()]
    assert got == {create: [0], append: [1]}  # Kafka's: 0 CreateTime, 1 LogAppendTime


@pytest.mark.parametrize("option,value", [
    ("assign", '{"t": [0]}'),
    ("subscribePattern", "data-.*"),
    ("kafka.group.id", "g"),
    ("groupIdPrefix", "g"),
    ("fetchOffset.numRetries", "3"),
    ("kafkaConsumer.pollTimeoutMs", "512"),
    ("includeHeaders", "false"),
    ("failOnDataLoss", "maybe"),
    ("kafka.auto.offset.reset", "earliest"),
    ("kafka.isolation.level", "read_uncommitted"),
    ("noSuchOption", "1"),
])
def test_kafka_options_the_source_does_not_support_are_refused_naming_them(
        spark, config, option, value):
    topic = make_topic(config, 1)
    msg = error_of(lambda: read_values(spark, config, subscribe=topic, **{option: value}))
    # Spark lower-cases option keys: an unknown one can only be named so
    assert f"option '{option}'".lower() in msg.lower(), msg[-1500:]


@pytest.mark.parametrize("option,value", [("includeHeaders", "true"),
                                          ("failOnDataLoss", "true"),
                                          ("failOnDataLoss", "false"),
                                          ("kafka.isolation.level", "read_committed")])
def test_kafka_options_the_source_takes_as_it_does_are_accepted(spark, config, option, value):
    topic = make_topic(config, 1)
    rows = fill_plain(config, topic, {0: 2})
    assert read_values(spark, config, subscribe=topic, **{option: value}) == rows[0]


# ---------------------------------------------------------------- 4. latest binds late


def test_the_same_dataframe_read_again_sees_rows_committed_since(spark, config, worker, client):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    with client.transaction() as txn:
        for i in range(4):
            p.send(f"a{i}".encode(), txn=txn)
    df = spark.read.format("txnstream").options(**opts(config, subscribe=topic)).load() \
        .select("value")
    assert sorted(bytes(r.value) for r in df.collect()) == [b"a0", b"a1", b"a2", b"a3"]
    with client.transaction() as txn:
        for i in range(3):
            p.send(f"b{i}".encode(), txn=txn)
    aborted = client.new_transaction()
    p.send(b"aborted", txn=aborted)
    aborted.abort()
    assert sorted(bytes(r.value) for r in df.collect()) == \
        [b"a0", b"a1", b"a2", b"a3", b"b0", b"b1", b"b2"]
    assert df.count() == 7


def test_a_stream_without_starting_offsets_starts_at_the_latest_as_kafkas_does(
        spark, config, worker, client, tmp_path):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    with client.transaction() as txn:
        p.send(b"before", txn=txn)
    seen: list[bytes] = []
    q = (spark.readStream.format("txnstream").options(**opts(config, subscribe=topic)).load()
         .writeStream.foreachBatch(
             lambda df, _id: seen.extend(bytes(r.value) for r in df.select("value").collect()))
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: q.lastProgress is not None, 60, "the query's first trigger")
        with client.transaction() as txn:
            p.send(b"after", txn=txn)
        wait_until(lambda: seen == [b"after"], 60, f"the record committed after the start "
                   f"(seen {seen})")
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
