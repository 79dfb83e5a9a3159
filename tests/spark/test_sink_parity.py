"""The sink answers as ``format("kafka")``'s does at its edges (issue 23), on real Spark.

Kafka's sink writes a ``headers`` column as the records' headers and a ``partition``
column as their partition; the ``topic`` option overrides a ``topic`` column; save modes
other than append and error-if-exists are refused. Each row's placement and headers are
read back from the broker with a committed-only reader.
"""

from __future__ import annotations

import uuid

import pytest

from tests.spark.conftest import make_topic
from tests.spark.test_spark import opts
from txnstream import Client

pytestmark = pytest.mark.spark


def read_back(config, topic: str, n: int, timeout_s: float = 30) -> list:
    """The first ``n`` committed records of ``topic`` (Message objects), or fewer at timeout."""
    import time

    out = []
    deadline = time.monotonic() + timeout_s
    with Client(config=config) as reader:
        c = reader.subscribe(topic, subscription=f"chk-{uuid.uuid4().hex[:6]}")
        while len(out) < n and time.monotonic() < deadline:
            m = c.receive(timeout_s=1)
            if m is not None:
                out.append(m)
                c.acknowledge(m)
        c.close()
    return out


def test_the_headers_column_is_written_as_the_records_headers(spark, config, worker):
    dst = make_topic(config, 1)
    df = spark.sql(
        "select cast(id as string) as value, "
        "case when id = 0 then array() "
        "     when id = 1 then null "
        "     else array(named_struct('key', 'h', 'value', cast(concat('v', id) as binary)),"
        "                named_struct('key', 'h', 'value', cast(null as binary))) end "
        "  as headers from range(3)")
    df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    got = {m.value: m.headers for m in read_back(config, dst, 3)}
    # A null header value is written as a header without a value, as Kafka's sink does.
    assert got == {b"0": (), b"1": (), b"2": (("h", b"v2"), ("h", None))}, got


def test_a_reserved_header_name_is_refused_naming_it_and_nothing_is_written(
        spark, config, worker):
    dst = make_topic(config, 1)
    df = spark.sql("select cast(id as string) as value, "
                   "array(named_struct('key', 'txn.id', 'value', cast('x' as binary))) "
                   "as headers from range(3)")
    with pytest.raises(Exception) as exc:
        df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    assert "'txn.id'" in str(exc.value) and "reserved" in str(exc.value)
    assert read_back(config, dst, 1, timeout_s=8) == []


def test_the_partition_column_places_each_row_and_null_means_the_partitioner(
        spark, config, worker):
    dst = make_topic(config, 3)
    df = spark.sql("select cast(id as string) as key, cast(id as string) as value, "
                   "case when id < 9 then cast(id % 3 as int) end as partition "
                   "from range(12)")
    df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    got = {int(m.value): m.partition for m in read_back(config, dst, 12)}
    from txnstream.kafka.partitioning import murmur2_partition

    want = {i: i % 3 if i < 9 else murmur2_partition(str(i).encode(), 3) for i in range(12)}
    assert got == want


def test_a_partition_the_topic_does_not_have_is_refused_naming_it(spark, config, worker):
    dst = make_topic(config, 2)
    df = spark.sql("select cast(id as string) as value, cast(id * 2 as int) as partition "
                   "from range(3)")
    with pytest.raises(Exception) as exc:
        df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    assert "partition 4" in str(exc.value) and dst in str(exc.value)
    assert read_back(config, dst, 1, timeout_s=8) == []


def test_the_topic_option_overrides_the_topic_column(spark, config, worker):
    dst, other = make_topic(config, 1), make_topic(config, 1)
    df = spark.sql(f"select cast(id as string) as value, '{other}' as topic from range(4)")
    df.write.format("txnstream").options(**opts(config, topic=dst)).mode("append").save()
    assert sorted(m.value for m in read_back(config, dst, 4)) == [b"0", b"1", b"2", b"3"]
    assert read_back(config, other, 1, timeout_s=5) == []


@pytest.mark.parametrize("mode", ["overwrite"])
def test_save_modes_other_than_append_are_refused_as_kafka_does(spark, config, worker, mode):
    dst = make_topic(config, 1)
    with pytest.raises(Exception) as exc:
        spark.range(3).selectExpr("cast(id as string) as value").write.format("txnstream") \
            .options(**opts(config, topic=dst)).mode(mode).save()
    assert "Overwrite" in str(exc.value) and "Append" in str(exc.value)
    assert read_back(config, dst, 1, timeout_s=5) == []


@pytest.mark.parametrize("column,sql", [
    ("headers", "array(named_struct('key', 1, 'value', cast('x' as binary)))"),
    ("headers", "'not-an-array'"),
    ("partition", "'zero'"),
])
def test_a_sink_column_of_the_wrong_type_names_it(spark, config, worker, column, sql):
    dst = make_topic(config, 1)
    with pytest.raises(Exception) as exc:
        spark.sql(f"select 'v' as value, {sql} as {column}").write.format("txnstream") \
            .options(**opts(config, topic=dst)).mode("append").save()
    assert f"column '{column}'" in str(exc.value)
