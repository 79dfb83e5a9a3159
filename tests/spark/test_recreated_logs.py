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


def test_an_end_taken_while_the_view_is_dropped_keeps_the_log_it_is_of(
        config, worker, client):
    """``latestOffset`` notes beside each end the log it is of; it read that from the
    served views. While the follower has dropped a partition's view for its new log's
    (the owner restarted it on a recreated topic; WAITING for the new log's snapshot),
    the old code noted nothing for it: Spark ran an empty micro-batch to that un-noted
    end, and once the new log was served nothing said the query's offset was of the old
    one. A new log that had passed it was read from there, its first records never
    delivered (CI on 350ddbb: ``test_a_running_query_over_a_topic_recreated_with_a_
    longer_log_reads_all_of_it`` saw new4..new7 of new0..new7). An end still on the log
    its start was on keeps that log's epoch; the next range starts at the new log's start.
    """
    from pyspark.sql.datasource import ReadAllAvailable

    from txnstream.buffer.served import BufferStateKind, BufferStateRecord
    from txnstream_spark.log_epochs import split
    from txnstream_spark.source import TxnStreamStreamReader

    topic = make_topic(config, 1)
    tp = TopicPartition(topic, 0)
    commit_values(client, topic, OLD, 0)
    reader = TxnStreamStreamReader(opts(config, subscribe=topic, failOnDataLoss="false",
                                        startingOffsets="earliest"))
    try:
        def latest(start, at: int) -> dict:  # once the served state reaches ``at``
            deadline = time.monotonic() + 60
            while (split(end := reader.latestOffset(start, ReadAllAvailable()))[0][topic]["0"]
                   != at and time.monotonic() < deadline):
                time.sleep(0.2)
            return end

        first = latest(reader.initialOffset(), 8)
        assert split(first) == ({topic: {"0": 8}}, {tp: 0}), first
        # the owner restarted tp on a new log: the follower read its first DELTA and
        # dropped the view, waiting for the new log's snapshot
        follower = reader._planner.follower  # noqa: SLF001
        view = follower.views[tp]
        follower._restart(tp, view, BufferStateRecord(  # noqa: SLF001
            BufferStateKind.DELTA, "owner", view.generation, topic, 0, log_epoch=1))
        waiting = reader.latestOffset(first, ReadAllAvailable())
        assert split(waiting)[1] == {tp: 0}, \
            f"an end of the old log noted without its log epoch: {waiting}"
        recreate(config, worker, topic)
        with Client(config=config) as fresh:
            commit_values(fresh, topic, NEW, 0)  # 16 offsets: past the query's 8
        now = latest(waiting, 16)
        assert split(now) == ({topic: {"0": 16}}, {tp: 1}), now
        ranges = reader.partitions(waiting, now)
        assert [(p.start, p.end) for p in ranges] == [(0, 16)], \
            "the new log was not read from its start"
    finally:
        reader.stop()
