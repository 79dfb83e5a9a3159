"""A reader waiting for a commit delivers it when the commit's delta comes (issue 37).

A committed-only consumer reads two Kafka consumers: its data partitions and its
follower's buffer-state partitions, where a commit shows up as a delta. It waited on one
of them at a time: on the data consumer, unless every partition it reads was waiting for
served state. So with one partition waiting for a commit and the others idle, the delta
sat unread until the data poll's slice ended (``consumer.POLL_SLICE_S``, 100 ms): 51 ms of
produce-to-delivery p50 at 4 partitions in ``bench.scale``, 9 ms with the wait on both.

The test makes the slice 2 s, so a reader that waits it out is told apart from one that
wakes, whatever the machine's load.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import pytest

from tests.integration.consumer.conftest import make_topic
from txnstream import consumer as consumer_module
from txnstream.kafka.librdkafka import native_librdkafka

pytestmark = pytest.mark.integration

SLICE_S = 2.0
COMMITS = 8


def test_a_commit_to_one_partition_is_delivered_without_waiting_out_the_data_poll(
        config, client, worker, monkeypatch):
    assert native_librdkafka() is not None, "txnstream._native did not build or load"
    monkeypatch.setattr(consumer_module, "POLL_SLICE_S", SLICE_S)
    topic = make_topic(config, 4)
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, subscription=f"wake-{uuid.uuid4().hex[:6]}")
    try:
        first = client.new_transaction()  # every partition served, none waiting
        for p in range(4):
            producer.send(f"first-{p}".encode(), txn=first, partition=p)
        first.commit()
        got = []
        while len(got) < 4:
            m = consumer.receive(timeout_s=30)
            assert m is not None, f"the first commit was delivered in part: {got}"
            got.append(m.value)
            consumer.acknowledge(m)
        waits = []
        for i in range(COMMITS):
            committed: list[float] = []

            def commit_one(i: int = i, committed: list[float] = committed) -> None:
                time.sleep(0.2)  # the reader is inside receive(), waiting
                txn = client.new_transaction()
                producer.send(f"v{i}".encode(), txn=txn, partition=0)  # partitions 1-3 idle
                txn.commit()
                committed.append(time.monotonic())

            writer = threading.Thread(target=commit_one)
            writer.start()
            m = consumer.receive(timeout_s=30)
            got_at = time.monotonic()
            writer.join()
            assert m is not None and m.value == f"v{i}".encode(), f"commit {i} not delivered"
            waits.append(got_at - committed[0])
            consumer.acknowledge(m)
    finally:
        consumer.close()
    assert statistics.median(waits) < SLICE_S / 4, (
        f"commits were delivered {[round(w, 3) for w in waits]} s after commit() returned: "
        f"the reader waited out its {SLICE_S} s data poll while the commit's delta came")


def test_without_the_native_wake_the_same_commits_are_delivered(config, client, worker,
                                                                 monkeypatch):
    """The fallback (one consumer at a time) is slower to see a commit, never wrong."""
    monkeypatch.setenv("TXNSTREAM_NATIVE", "0")
    topic = make_topic(config, 4)
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, subscription=f"wake-{uuid.uuid4().hex[:6]}")
    try:
        assert not consumer._wake.active, "TXNSTREAM_NATIVE=0 and the wake is native"
        sent = []
        for i in range(5):
            txn = client.new_transaction()
            for p in range(4):
                producer.send(f"v{i}-{p}".encode(), txn=txn, partition=p)
                sent.append(f"v{i}-{p}".encode())
            txn.commit()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += [m.value for m in consumer.receive_batch(100, timeout_s=1)]
    finally:
        consumer.close()
    assert sorted(got) == sorted(sent), "the fallback delivered other records than committed"
