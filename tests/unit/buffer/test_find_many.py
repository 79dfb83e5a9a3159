"""One scan of a snapshot partition finds each partition's newest snapshot as a scan per
partition did (issue 37: a reader of a wide topic scanned the state partition once per
data partition, 256 scans of 4 partitions for a 256-partition topic).

:meth:`TransactionBufferSnapshotStore.find_many` feeds a partition's records once to a
:class:`SlotScan` limited to the partitions asked for; :meth:`find` fed each partition's
records to its own :class:`LatestSnapshotFinder`. Both are pure folds: compared here on
generated records (registrations, segmented snapshots of several partitions with
prefix-sharing names, cut-short writes, tombstones, garbage), no broker.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.buffer import TransactionBuffer, take_snapshot
from txnstream.buffer.snapshot import SEGMENT_OVERHEAD_BYTES, split_snapshot
from txnstream.buffer.snapshot_store import (
    LatestSnapshotFinder,
    SlotScan,
    registration_key,
    segment_key,
)
from txnstream.types import TopicPartition

TPS = [TopicPartition("t", p) for p in (0, 1, 10, 11)] + [TopicPartition("t-1", 0)]


def _records(seed: int, n: int) -> list[tuple[bytes | None, bytes | None]]:
    rng = random.Random(seed)
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        tp = rng.choice(TPS)
        what = rng.random()
        if what < 0.2:
            out.append((registration_key(tp), b"r"))
        elif what < 0.8:
            buf = TransactionBuffer(tp)
            buf.fold(rng.randrange(1_000), None)
            size = rng.choice([SEGMENT_OVERHEAD_BYTES + 40, 4096])  # many segments, or one
            segs = split_snapshot(take_snapshot(buf), f"s{i}", max_bytes=size)
            slot = rng.randrange(2)
            recs = [(segment_key(tp, slot, s.index), s.encode()) for s in segs]
            if rng.random() < 0.2:
                recs = recs[:-1]  # a write cut short
            out.extend(recs)
        elif what < 0.9:
            out.append((segment_key(tp, rng.randrange(2), 0), None))  # a tombstone
        else:
            out.append((f"{tp}/junk".encode(), b"\x00garbage"))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 60), asked=st.sets(st.sampled_from(TPS)))
def test_one_scan_for_many_partitions_finds_what_one_scan_each_did(seed, n, asked):
    records = _records(seed, n)
    scan = SlotScan(only=set(asked))
    for i, (key, value) in enumerate(records):
        scan.add(key, value, f"snap[0]@{i}")
    assert set(scan.finders) <= set(asked)
    for tp in asked:
        alone = LatestSnapshotFinder(tp)
        for i, (key, value) in enumerate(records):
            alone.add(key, value, f"snap[0]@{i}")
        together = scan.finders.get(tp) or LatestSnapshotFinder(tp)
        assert (together.best, together.registered) == (alone.best, alone.registered), tp
