"""The snapshot topic is compacted in fact, not only in name: a scan stays short.

Readers and claiming owners scan a whole snapshot partition for the newest complete
snapshot of each partition (:mod:`txnstream.buffer.snapshot_store`). Kafka never
compacts a partition's active segment, and by default a segment rolls only after 7 days
or 1 GiB: without a shorter roll every snapshot ever written in that time is read again
by every scan.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.integration.buffer.conftest import wait_until
from txnstream import TopicNames, TopicPartition
from txnstream.admin_topics import COMPACTED_TOPIC_ROLL_MS, ensure_topics
from txnstream.buffer.offset_runs import OffsetRuns
from txnstream.buffer.snapshot import TransactionBufferSnapshot
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.config import Config
from txnstream.errors import ConfigError

pytestmark = pytest.mark.integration

REWRITES = 600
"""Snapshots written per partition before the wait: what an unbounded scan reads again."""
COMPACTED_WITHIN_S = 240.0
"""Roll (segment.ms after the segment's first record, on the next append), the log
cleaner's backoff (15 s by default) and one cleaning, with room for a loaded machine."""


class Counter:
    """A scan sink that only counts the records it is fed."""

    def __init__(self) -> None:
        self.records = 0

    def add(self, key: bytes | None, value: bytes | None, where: str) -> None:
        self.records += 1


def snapshot(tp: TopicPartition, position: int) -> TransactionBufferSnapshot:
    return TransactionBufferSnapshot(tp.topic, tp.partition, position, position, (), (),
                                     OffsetRuns.from_runs([]), (), ())


def test_a_slots_scan_stays_bounded_while_its_snapshots_are_rewritten(own_config: Config):
    store = TransactionBufferSnapshotStore(own_config)
    tp = TopicPartition(f"data-{uuid.uuid4().hex[:8]}", 0)

    def known() -> bool:  # the topic was just created: metadata may lag behind
        try:
            return store.partition_of(tp) >= 0
        except ConfigError:
            return False

    wait_until(known, 30, "snapshot topic in metadata")
    slot = store.partition_of(tp)
    try:
        for i in range(REWRITES):
            store.publish(snapshot(tp, i), tp)
        store.flush(30)

        def scanned() -> int:
            c = Counter()
            store.scan(slot, c)  # type: ignore[arg-type]
            return c.records

        assert scanned() >= REWRITES  # the scan reads them all now
        # Live keys: 2 key sets of 1 segment, and the legacy key's tombstone. The roll is
        # decided on append: a snapshot a second, as a partition that keeps changing gets.
        bound = 3 + 2 * (COMPACTED_TOPIC_ROLL_MS // 1000)
        deadline = time.monotonic() + COMPACTED_WITHIN_S
        position = REWRITES
        last = scanned()
        while last > bound and time.monotonic() < deadline:
            store.publish(snapshot(tp, position), tp)
            store.flush(10)
            position += 1
            time.sleep(1.0)
            last = scanned()
        assert last <= bound, (f"a scan of slot {slot} still reads {last} records after "
                               f"{COMPACTED_WITHIN_S:.0f} s; compacted, it reads at most {bound}")
        found = store.find(tp)
        assert found.best is not None and found.best.position == position - 1
    finally:
        store.close()


def test_an_existing_snapshot_topic_gets_the_roll_that_lets_it_compact(config: Config):
    cfg = config.with_(topics=TopicNames(f"__u{uuid.uuid4().hex[:6]}"))
    admin = AdminClient(cfg.admin())
    name = cfg.topics.buffer_snapshots
    # as `txnstream init` made it before: compacted, with Kafka's default roll
    for f in admin.create_topics([NewTopic(name, cfg.num_buffer_slots, 1,
                                           config={"cleanup.policy": "compact"})]).values():
        f.result(30)
    try:
        reports = {r.name: r for r in ensure_topics(cfg)}
        assert reports[name].status == "updated", reports[name]
        assert "segment.ms" in reports[name].detail

        def roll() -> str:
            res = ConfigResource(ConfigResource.Type.TOPIC, name)
            return admin.describe_configs([res])[res].result(30)["segment.ms"].value

        wait_until(lambda: roll() == str(COMPACTED_TOPIC_ROLL_MS), 30, "segment.ms applied")
        again = {r.name: r for r in ensure_topics(cfg)}
        assert again[name].status == "exists", again[name]
    finally:
        for f in admin.delete_topics(cfg.topics.all(), operation_timeout=30).values():
            try:
                f.result(30)
            except Exception:  # some were never created
                pass
