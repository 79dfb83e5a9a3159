"""A reader at rest writes no checkpoints (issue 37).

An owner checkpointed a partition's pending acks every interval whenever the tail of its
pending-ack log partition had moved. Many subscription partitions share one log
partition, and a checkpoint is itself a record there: each checkpoint moved the tail for
all the others, so a reader that acked nothing rewrote every partition's checkpoint at
every interval, for ever (at 1,024 partitions, about 100 synchronous writes a second on
the reader's thread, most of its CPU in ``bench.scale``). A checkpoint is now due only if
a record other than a checkpoint landed since the last one, and the due ones are written
with one flush.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.pendingack.conftest import fill, make_topic, wait_until
from txnstream import Client
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.pendingack.records import is_checkpoint, key_of
from txnstream.types import TopicPartition

pytestmark = pytest.mark.integration

WIDTH = 16
INTERVAL_S = 0.2


def checkpoints_of(config, subscription: str, topic: str) -> int:
    """The checkpoint records of ``subscription``'s partitions of ``topic`` in the log."""
    keys = {key_of(subscription, TopicPartition(topic, p)) for p in range(WIDTH)}
    c = Consumer(config.consumer(f"count-{uuid.uuid4().hex[:6]}",
                                 **{"enable.auto.commit": False}))
    try:
        meta = c.list_topics(config.topics.pending_ack, timeout=10)
        parts = sorted(meta.topics[config.topics.pending_ack].partitions)
        ends = {p: c.get_watermark_offsets(KafkaTP(config.topics.pending_ack, p),
                                           timeout=10)[1] for p in parts}
        c.assign([KafkaTP(config.topics.pending_ack, p, OFFSET_BEGINNING) for p in parts])
        left, n = {p for p, e in ends.items() if e > 0}, 0
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error() is not None:
                    continue
                if m.key() in keys and is_checkpoint(m.headers()):
                    n += 1
                if m.offset() >= ends[m.partition()] - 1:
                    left.discard(m.partition())
        assert not left, f"pending-ack log partitions {left} not read to their ends"
        return n
    finally:
        c.close()


def test_a_reader_that_acks_nothing_writes_no_checkpoints_at_rest(own_config):
    # a pending-ack log of its own: another test's acks there would make checkpoints due
    config = own_config
    worker = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=6000))
    worker.start()
    client = Client(config=config)
    try:
        wait_until(lambda: len(worker.serving()) == config.num_coordinators, 60,
                   "worker serving")
        topic = make_topic(config, WIDTH)
        fill(client, topic, 4 * WIDTH, WIDTH)
        sub = f"rest-{uuid.uuid4().hex[:6]}"
        c = client.subscribe(topic, subscription=sub, checkpoint_interval_s=INTERVAL_S)
        try:
            got = 0
            deadline = time.monotonic() + 30
            while got < 4 * WIDTH and time.monotonic() < deadline:
                got += len(c.receive_batch(1000, 0.5))
            assert got == 4 * WIDTH
            settle = time.monotonic() + 10 * INTERVAL_S  # the takes' own checkpoints land
            while time.monotonic() < settle:
                c.receive_batch(1000, 0.1)
            before = checkpoints_of(config, sub, topic)
            rest = time.monotonic() + 15 * INTERVAL_S
            while time.monotonic() < rest:
                c.receive_batch(1000, 0.1)
            after = checkpoints_of(config, sub, topic)
        finally:
            c.close()
    finally:
        client.close()
        worker.stop()
    assert before > 0, "the takes checkpointed nothing: the test would see nothing"
    assert after == before, (f"{after - before} checkpoints written in "
                             f"{15 * INTERVAL_S:.0f} s at rest ({WIDTH} partitions, "
                             "nothing acked)")
