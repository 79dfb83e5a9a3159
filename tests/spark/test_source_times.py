"""Offsets by time and admission control, as ``format("kafka")`` has them (issue 23).

* ``startingTimestamp``, ``startingOffsetsByTimestamp``, ``endingTimestamp`` and
  ``endingOffsetsByTimestamp`` start (or end) each partition at its first offset whose
  record time is at or after the given time; from there the read is committed-only as
  any other (aborted records and markers at or after that time are skipped).
* No record that late: a start fails with Kafka's text, or starts at the latest under
  ``startingOffsetsByTimestampStrategy=latest``; an end is the latest.
* ``minOffsetsPerTrigger`` holds a micro-batch back until that many offsets are ahead or
  ``maxTriggerDelay`` has passed; ``Trigger.AvailableNow`` reads everything regardless.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.spark.conftest import make_topic, stream_values, wait_until
from tests.spark.test_source_parity import error_of, read_values

pytestmark = pytest.mark.spark


def commit(client, topic: str, values: list[bytes], partition: int | None = None) -> None:
    """One committed txn holding ``values``."""
    p = client.create_producer(topic)
    with client.transaction() as t:
        for v in values:
            p.send(v, txn=t, partition=partition)


def abort(client, topic: str, values: list[bytes], partition: int | None = None) -> None:
    p = client.create_producer(topic)
    t = client.new_transaction()
    for v in values:
        p.send(v, txn=t, partition=partition)
    p.flush_transaction(t)
    t.abort()


def now_between() -> int:
    """A time in ms strictly after every record written before and before every one after."""
    time.sleep(0.05)
    at = int(time.time() * 1000)
    time.sleep(0.05)
    return at


# ---------------------------------------------------------------- batch


def test_batch_starting_timestamp_reads_the_committed_records_from_then_on(
        spark, config, worker, client):
    topic = make_topic(config, 2)
    commit(client, topic, [b"old0", b"old1"], 0)
    commit(client, topic, [b"old2"], 1)
    at = now_between()
    commit(client, topic, [b"new0"], 0)
    commit(client, topic, [b"new1"], 1)
    abort(client, topic, [b"aborted"], 0)
    commit(client, topic, [b"new2"], 1)
    assert read_values(spark, config, subscribe=topic, startingTimestamp=str(at)) == \
        [b"new0", b"new1", b"new2"]


def test_batch_offsets_by_timestamp_per_partition_bound_both_ends(
        spark, config, worker, client):
    topic = make_topic(config, 2)
    commit(client, topic, [b"a0"], 0)
    commit(client, topic, [b"b0"], 1)
    t1 = now_between()
    commit(client, topic, [b"a1"], 0)
    abort(client, topic, [b"a-aborted"], 0)
    commit(client, topic, [b"b1"], 1)
    t2 = now_between()
    commit(client, topic, [b"a2"], 0)
    commit(client, topic, [b"b2"], 1)
    got = read_values(spark, config, subscribe=topic,
                      startingOffsetsByTimestamp=json.dumps({topic: {"0": t1, "1": 0}}),
                      endingOffsetsByTimestamp=json.dumps({topic: {"0": t2, "1": t2}}))
    assert got == [b"a1", b"b0", b"b1"]
    # an end later than every record is the committed end (Kafka: the latest)
    got = read_values(spark, config, subscribe=topic, startingTimestamp=str(t1),
                      endingTimestamp=str(int(time.time() * 1000) + 3_600_000))
    assert got == [b"a1", b"a2", b"b1", b"b2"]


def test_a_start_time_after_every_record_fails_with_kafkas_text_or_reads_nothing_under_latest(
        spark, config, worker, client):
    topic = make_topic(config, 1)
    commit(client, topic, [b"x"])
    future = str(int(time.time() * 1000) + 3_600_000)
    msg = error_of(lambda: read_values(spark, config, subscribe=topic, startingTimestamp=future))
    assert (f"option 'startingTimestamp': No offset matched from request of topic-partition "
            f"{topic}-0 and timestamp {future}.") in msg, msg[-1500:]
    assert read_values(spark, config, subscribe=topic, startingTimestamp=future,
                       startingOffsetsByTimestampStrategy="latest") == []


def test_offsets_by_timestamp_naming_only_some_partitions_are_refused(spark, config):
    topic = make_topic(config, 2)
    msg = error_of(lambda: read_values(spark, config, subscribe=topic,
                                       startingOffsetsByTimestamp=json.dumps({topic: {"1": 5}})))
    assert ("option 'startingOffsetsByTimestamp' must give a timestamp for every partition "
            "of the subscribed topics") in msg and f"missing: {topic}-0" in msg, msg[-1500:]


def test_a_start_time_whose_first_record_is_in_an_open_txn_reads_nothing_yet(
        spark, config, worker, client):
    topic = make_topic(config, 1)
    commit(client, topic, [b"before"])
    at = now_between()
    p = client.create_producer(topic)
    open_txn = client.new_transaction()
    p.send(b"open", txn=open_txn)
    p.flush_transaction(open_txn)
    try:
        assert read_values(spark, config, subscribe=topic, startingTimestamp=str(at)) == []
    finally:
        open_txn.abort()


# ---------------------------------------------------------------- streams


def test_stream_starting_timestamp_reads_from_that_time(spark, config, worker, client,
                                                         tmp_path):
    topic = make_topic(config, 1)  # a start time with no record after it fails (Kafka)
    commit(client, topic, [b"old0", b"old1"])
    at = now_between()
    commit(client, topic, [b"new0"])
    abort(client, topic, [b"aborted"])
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, trigger={"availableNow": True},
                subscribe=topic, startingTimestamp=str(at))
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    assert seen == [b"new0"]


def test_stream_under_the_latest_strategy_starts_at_the_end_and_reads_what_comes(
        spark, config, worker, client, tmp_path):
    topic = make_topic(config, 1)
    commit(client, topic, [b"old"])
    future = str(int(time.time() * 1000) + 3_600_000)
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, subscribe=topic, startingTimestamp=future,
                startingOffsetsByTimestampStrategy="latest")
    try:
        wait_until(lambda: q.lastProgress is not None, 60, "the query's first trigger")
        commit(client, topic, [b"later"])
        wait_until(lambda: seen == [b"later"], 60, f"the later record (seen {seen})")
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


@pytest.mark.parametrize("option,value", [("endingTimestamp", "5"),
                                          ("endingOffsetsByTimestamp", '{"t": {"0": 5}}')])
def test_stream_refuses_an_ending_time_as_kafka_does(spark, config, tmp_path, option, value):
    topic = make_topic(config, 1)

    def start():
        q = stream_values(spark, config, tmp_path, [], trigger={"availableNow": True},
                    subscribe=topic, **{option: value})
        q.awaitTermination(60)
        q.stop()

    msg = error_of(start)
    assert f"option '{option}': ending timestamp not valid in streaming queries" in msg, \
        msg[-1500:]


def test_min_offsets_per_trigger_holds_a_micro_batch_until_enough_is_committed(
        spark, config, worker, client, tmp_path):
    topic = make_topic(config, 1)
    seen: list[bytes] = []
    sizes: list[int] = []
    q = stream_values(spark, config, tmp_path, seen, sizes, subscribe=topic,
                minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    try:
        wait_until(lambda: q.lastProgress is not None, 60, "the query's first trigger")
        first = [f"a{i}".encode() for i in range(4)]
        commit(client, topic, first)  # 4 records + 1 marker: 5 offsets ahead
        time.sleep(4)  # 20 triggers
        assert seen == [], "a micro-batch ran with fewer offsets than minOffsetsPerTrigger"
        second = [f"b{i}".encode() for i in range(4)]
        commit(client, topic, second)  # 10 offsets ahead
        wait_until(lambda: len(seen) == 8, 60, f"the 8 records (seen {seen})")
        assert seen == first + second and sizes == [8]
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


def test_max_trigger_delay_lets_a_small_micro_batch_through(spark, config, worker, client,
                                                            tmp_path):
    topic = make_topic(config, 1)
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, subscribe=topic, minOffsetsPerTrigger="1000",
                maxTriggerDelay="5s")
    try:
        wait_until(lambda: q.lastProgress is not None, 60, "the query's first trigger")
        commit(client, topic, [b"x", b"y"])
        committed = time.monotonic()
        wait_until(lambda: seen == [b"x", b"y"], 60, f"the 2 records (seen {seen})")
        # the delay runs from the first micro-batch, which was let through at start
        assert time.monotonic() - committed > 1.0, "delivered before maxTriggerDelay"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()


def test_available_now_reads_everything_whatever_min_offsets_per_trigger_says(
        spark, config, worker, client, tmp_path):
    topic = make_topic(config, 1)
    commit(client, topic, [b"p", b"q", b"r"])
    seen: list[bytes] = []
    q = stream_values(spark, config, tmp_path, seen, trigger={"availableNow": True},
                subscribe=topic, minOffsetsPerTrigger="1000", maxTriggerDelay="1h",
                startingOffsets="earliest")
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    assert seen == [b"p", b"q", b"r"]
