"""The consumer's bounded hold: what it could not hold is re-read, never skipped."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.consumer.conftest import make_topic

pytestmark = pytest.mark.integration


def marker_written(config, topic: str, end: int, timeout_s: float = 10.0) -> None:
    """Wait until partition 0 of ``topic`` ends at ``end``: the txn's COMMIT marker is in.

    These tests place plain records after the marker, so they wait for it before
    writing them, whenever ``commit()`` answers (see ``markers_written``).
    """
    import time

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(config.consumer(f"wm-{uuid.uuid4().hex[:6]}"))
    try:
        deadline = time.monotonic() + timeout_s
        while c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1] < end:
            assert time.monotonic() < deadline, f"no COMMIT marker at {topic}-0@{end - 1}"
            time.sleep(0.02)
    finally:
        c.close()


def drain(consumer, want, timeout_s=3.0):
    out = []
    while len(out) < want:
        m = consumer.receive(timeout_s=timeout_s)
        if m is None:
            break
        out.append(m)
    return out


def test_overflowed_txn_committed_in_the_same_batch_as_later_records_is_delivered_whole(
        config, worker, client):
    """Offsets 0..9 (one txn, past the hold bound), its COMMIT marker at 10, plain 11..14.

    All arrive in one ``consume()`` batch. The old reader sought back to 0 at the marker
    but went on ingesting the batch: it released 11..14, moved past the re-read range and
    skipped 0..9, then committed its cursor at 11 so a restart did not bring them back.
    """
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    for i in range(10):
        producer.send(f"t{i}".encode() + b"x" * 1000, txn=txn, partition=0)
    txn.commit()
    marker_written(config, topic, 11)
    for i in range(11, 15):
        producer.send(f"p{i}".encode(), partition=0)
    producer.flush()

    sub = f"hold-{uuid.uuid4().hex[:6]}"
    consumer = client.subscribe(topic, subscription=sub)
    got = drain(consumer, 14)
    offsets = [m.offset for m in got]
    assert offsets == [*range(10), *range(11, 15)], f"delivered {offsets}"
    for m in got:
        consumer.acknowledge(m)
    consumer.close()

    again = client.subscribe(topic, subscription=sub)
    assert drain(again, 1, timeout_s=3.0) == [], "nothing is left after acking everything"
    again.close()


def test_cursor_never_passes_records_not_yet_delivered(config, worker, client):
    """A restart after a partial read resumes at the first undelivered record."""
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=60)
    for _ in range(10):
        producer.send(b"y" * 1000, txn=txn, partition=0)
    txn.commit()
    marker_written(config, topic, 11)
    for _ in range(4):
        producer.send(b"plain", partition=0)
    producer.flush()

    sub = f"hold-{uuid.uuid4().hex[:6]}"
    consumer = client.subscribe(topic, subscription=sub)
    first = drain(consumer, 3)
    assert [m.offset for m in first] == [0, 1, 2]
    for m in first:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, subscription=sub)
    rest = drain(again, 11)
    again.close()
    assert [m.offset for m in rest] == [*range(3, 10), *range(11, 15)]
