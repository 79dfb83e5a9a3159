"""A reader looks for the snapshots of many waiting partitions with one scan per slot.

A reader subscribed right after a txn registered every partition of a wide topic finds
them transactional but not served yet (the buffer owner is still claiming them): each
waits for its first snapshot, looked for again every ``RESCAN_INTERVAL_S``. Each
partition was looked for on its own, a scan of its snapshot partition each: at 1,024
partitions the reader spent its time rescanning and delivered its first record 9.2 s
after ``subscribe`` (1.8 s with a scan per snapshot partition; py-spy: 1,465 of 3,994
samples of its thread in ``_rescan``). ``bench.scale``'s steady load met it as an 11 s
lag at the start that took 20 s to catch up (issue 37).
"""

from __future__ import annotations

import collections
import uuid

import pytest

from tests.integration.consumer.conftest import make_topic
from txnstream import TopicPartition
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

pytestmark = pytest.mark.integration

PARTITIONS = 256


def test_waiting_partitions_are_looked_for_with_one_scan_per_snapshot_partition(
        config, client, worker, monkeypatch):
    scans: collections.Counter[int] = collections.Counter()
    scan = TransactionBufferSnapshotStore.scan

    def counted(store, *args, **kwargs):
        scans[id(store)] += 1
        return scan(store, *args, **kwargs)

    monkeypatch.setattr(TransactionBufferSnapshotStore, "scan", counted)
    topic = make_topic(config, PARTITIONS)
    txn = client.new_transaction()  # every partition transactional
    txn.register_partitions([TopicPartition(topic, p) for p in range(PARTITIONS)])
    client.create_producer(topic).send(b"last", txn=txn, partition=PARTITIONS - 1)
    txn.commit()
    consumer = client.subscribe(topic, subscription=f"wide-{uuid.uuid4().hex[:6]}")
    try:
        m = consumer.receive(timeout_s=120)
        by_reader = scans[id(consumer._follower._store)]
    finally:
        consumer.close()
    assert m is not None and m.value == b"last", "the committed record was not delivered"
    assert by_reader < PARTITIONS, (
        f"the reader scanned snapshot partitions {by_reader} times for {PARTITIONS} data "
        "partitions: once per waiting data partition, not once per snapshot partition")
