"""A buffer owner starts serving a partition without waiting out its own parked fetch.

Each partition it starts serving needs its log start and end. Asked of the owner's data
consumer, the answer waited behind that consumer's fetch parked on the broker (up to
its ``fetch.wait.max.ms``, 100 ms): a txn's first commit on a new 4-partition topic took
0.4-0.7 s (its partitions and its inputs' registered one after another), and a slot of
many partitions was claimed one fetch wait per partition.
"""

from __future__ import annotations

import statistics
import time

import pytest

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream import TopicPartition
from txnstream.buffer import worker as buffer_worker
from txnstream.buffer.scan import PACED_FETCH
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

pytestmark = pytest.mark.integration

PARTITIONS = 12


def test_an_owner_starts_serving_each_new_partition_without_a_fetch_wait(config, monkeypatch):
    starts: list[float] = []
    serve = buffer_worker.BufferWorker._serve_all

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return serve(self, *args, **kwargs)
        finally:
            starts.append(time.perf_counter() - t0)

    monkeypatch.setattr(buffer_worker.BufferWorker, "_serve_all", timed)
    busy, wide = make_topic(config, 1), make_topic(config, PARTITIONS)
    store = TransactionBufferSnapshotStore(config)
    bw = buffer_worker.BufferWorker(config, [busy, wide], snapshot_interval_s=1).start()
    try:
        # one partition served first: from then on the owner's data fetch is parked
        assert store.register([TopicPartition(busy, 0)], timeout_s=10)
        wait_until(lambda: TopicPartition(busy, 0) in bw.served, 30, "the first partition served")
        starts.clear()
        for p in range(PARTITIONS):  # one after another, as a txn's sends register them
            time.sleep(0.15)
            tp = TopicPartition(wide, p)
            assert store.register([tp], timeout_s=10)
            wait_until(lambda tp=tp: tp in bw.served, 30, f"{tp} served", every=0.01)
    finally:
        bw.stop()
    wait_ms = PACED_FETCH["fetch.wait.max.ms"]
    took_ms = sorted(round(s * 1000, 1) for s in starts)
    assert len(took_ms) >= PARTITIONS
    assert statistics.median(took_ms) < wait_ms / 4, (
        f"starting to serve a partition took {took_ms} ms: a wait behind the owner's "
        f"fetch ({wait_ms} ms) each")
