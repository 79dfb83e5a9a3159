"""A stream whose topic is recreated with a log that does not end below it (issue 34 item 9).

Kafka's source keys offsets by topic name alone: it notices a recreated topic only when
the new log ends below the query (``test_topic_changes.py``). A new log that has passed
the query's offset is read from there, its first records never delivered, and under
``failOnDataLoss`` nothing fails. The buffer owners number each partition's logs, and
the source notes that number beside its offsets (:mod:`txnstream_spark.log_epochs`).

Old code: a running query went on over the new log from the old offset; a query
restarted from its checkpoint did the same (new-4..new-7 delivered of 8, no error, with
``failOnDataLoss`` true or false); an ``AvailableNow`` query whose topic came back with 3 of its 5
partitions during its first batch finished without an error.
"""

from __future__ import annotations

import time

import pytest
from pyspark.errors import StreamingQueryException

from tests.integration.coordinator.conftest import create_topic_again, delete_topic
from tests.spark.conftest import make_topic, run_available_now, stream_values, wait_until
from tests.spark.test_spark import opts
from tests.spark.test_topic_changes import commit_values
from txnstream import Client, TopicPartition

pytestmark = pytest.mark.spark

OLD = [f"old{i}".encode() for i in range(4)]
NEW = [f"new{i}".encode() for i in range(8)]  # a longer log than the old one


def recreate(config, worker, topic: str, partitions: int = 1) -> None:
    """Delete ``topic``, create it again; return once its owner serves the new log.

    Records written before the owner found the new log may be judged by the old log's
    state (docs/buffer.md, Known limits): not what these tests are about.
    """
    delete_topic(config, topic)
    create_topic_again(config, topic, partitions)
    tp = TopicPartition(topic, 0)
    wait_until(lambda: (s := worker.buffers.served.get(tp)) is not None
               and s.buf.log_epoch >= 1, 60, "the buffer owner serving the new log")


def test_a_running_query_over_a_topic_recreated_with_a_longer_log_reads_all_of_it(
        spark, config, worker, client, tmp_path):
    """With ``failOnDataLoss=false`` (with ``true`` a running query fails already when
    it sees the topic gone between its deletion and creation, as Kafka's does)."""
    topic = make_topic(config, 1)
    commit_values(client, topic, OLD, 0)
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, subscribe=topic,
                      failOnDataLoss="false", startingOffsets="earliest")
    try:
        wait_until(lambda: seen == OLD, 60, "the old log's records")
        recreate(config, worker, topic)
        with Client(config=config) as fresh:
            commit_values(fresh, topic, NEW, 0)

        def all_new() -> bool:
            if (error := q.exception()) is not None:
                raise AssertionError(f"the query failed: {str(error)[-1500:]}")
            return seen[len(OLD):] == NEW

        try:
            wait_until(all_new, 90, "every record of the new log")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; seen {seen}") from None
        time.sleep(2)  # nothing else comes
        assert seen == OLD + NEW
    finally:
        q.stop()


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_query_restarted_over_a_topic_recreated_with_a_longer_log(
        spark, config, worker, client, tmp_path, fail_on_data_loss):
    topic = make_topic(config, 1)
    commit_values(client, topic, OLD, 0)
    seen: list[bytes] = []

    def run_once() -> BaseException | None:
        return run_available_now(spark, config, tmp_path, seen, subscribe=topic,
                                 failOnDataLoss=fail_on_data_loss, startingOffsets="earliest")

    assert run_once() is None
    assert seen == OLD
    recreate(config, worker, topic)
    with Client(config=config) as fresh:
        commit_values(fresh, topic, NEW, 0)
    error = run_once()
    if fail_on_data_loss == "true":
        assert error is not None, f"the query went on over a recreated topic: {seen}"
        assert f"{topic}-0 was deleted and created again since offset" in str(error), \
            str(error)[-1500:]
        assert seen == OLD
    else:
        assert error is None, error
        assert seen == OLD + NEW, "the new log was not read from its start"


def test_available_now_whose_topic_comes_back_with_fewer_partitions_fails(
        spark, config, worker, client, tmp_path):
    """Kafka never takes partitions away: fewer means the topic was deleted and created
    again. Kafka's source fails the query under ``failOnDataLoss``."""
    topic = make_topic(config, 5)
    for p in range(5):
        commit_values(client, topic, [f"p{p}-{i}".encode() for i in range(3)], p)
    seen: list[bytes] = []
    batches: list[int] = []

    def batch(df, batch_id):  # on the driver: the first batch recreates the topic
        seen.extend(bytes(r.value) for r in df.select("value").collect())
        batches.append(batch_id)
        if len(batches) == 1:
            recreate(config, worker, topic, partitions=3)

    q = (spark.readStream.format("txnstream")
         .options(**opts(config, subscribe=topic, startingOffsets="earliest",
                         maxRecordsPerTrigger="5"))
         .load().writeStream.foreachBatch(batch)
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    try:
        with pytest.raises(StreamingQueryException) as exc:
            q.awaitTermination(120)
        msg = str(exc.value)
        assert "these partitions no longer exist" in msg and f"{topic}-4" in msg, msg[-1500:]
    finally:
        q.stop()
