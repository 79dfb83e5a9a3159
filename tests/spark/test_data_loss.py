"""``failOnDataLoss`` as Kafka's source means it (issue 23), on real Spark and a real broker.

Records deleted from the log (``delete_records``, as retention would) before a query
read them: with ``failOnDataLoss=true`` (the default) the query fails naming the
partition and the lost offsets; with ``false`` it goes on from the log start and says
what it skipped. The old source read on from the log start silently either way.
"""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from tests.integration.coordinator.conftest import markers_written
from tests.spark.conftest import make_topic
from tests.spark.test_spark import opts

pytestmark = pytest.mark.spark


def committed_topic(config, client, n: int) -> str:
    """A 1-partition topic of ``n`` one-record committed txns: record i at offset 2i."""
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(n):
        with client.transaction() as t:
            p.send(f"v{i}".encode(), txn=t, partition=0)
        markers_written(client, t.id)
    return topic


def delete_below(config, topic: str, offset: int) -> None:
    admin = AdminClient(config.admin())
    (fut,) = admin.delete_records([KafkaTP(topic, 0, offset)]).values()
    assert fut.result(30).low_watermark == offset


def read(spark, config, topic: str, **extra) -> list[bytes]:
    df = spark.read.format("txnstream").options(**opts(
        config, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 0}}}}', **extra)).load()
    return sorted(bytes(r.value) for r in df.select("value").collect())


def test_lost_records_fail_the_read_naming_them(spark, config, worker, client):
    topic = committed_topic(config, client, 6)
    delete_below(config, topic, 4)  # v0 and v1 (offsets 0 and 2) are gone
    with pytest.raises(Exception) as exc:
        read(spark, config, topic)
    msg = str(exc.value)
    assert f"{topic}-0" in msg and "offsets 0..3" in msg and "failOnDataLoss" in msg, \
        msg[-1500:]


def test_with_fail_on_data_loss_false_the_read_goes_on_from_the_log_start(
        spark, config, worker, client):
    topic = committed_topic(config, client, 6)
    delete_below(config, topic, 4)
    assert read(spark, config, topic, failOnDataLoss="false") == [
        b"v2", b"v3", b"v4", b"v5"]
