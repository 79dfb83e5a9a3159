"""A reader starts anywhere on a transactional partition at a cost independent of its length.

(a) ``initial_position="latest"`` on a transactional partition of 1,000,000 records
    (plain records written fast with a raw confluent-kafka producer, between txnstream
    transactions at the start and at the end, so the partition is transactional) starts
    about as fast as on an empty transactional partition: timed from ``subscribe`` to the
    first delivered record of a txn committed after subscribing (a ticker commits one
    every few tens of ms from just after ``subscribe``). It delivers nothing older.
(b) A reader starting at ``"earliest"`` on a partition whose buffer snapshot exists
    reads it through the served state: a new buffer owner restores the snapshot and
    folds nothing again, and the reader delivers exactly the committed and plain
    records, in order.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import KafkaException

from bench.start_latest import high_watermark, ticker, wait_folded, write_plain_fast
from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream import Client, TopicPartition
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.buffer.worker import BufferWorker
from txnstream.errors import TxnStreamError

pytestmark = pytest.mark.integration

LONG_RECORDS = 1_000_000
FIRST_RECORD_TIMEOUT_S = 60.0


# ------------------------------------------------------------------ helpers


def start_latest(client: Client, topic: str, tag: str) -> tuple[float, list[bytes], list[int]]:
    """Subscribe at "latest"; seconds to the first record of a txn committed after that.

    Returns (seconds, every value delivered, seqs the ticker committed). The ticker
    starts right after ``subscribe`` returns; once a record came it is stopped and the
    reader reads until the last committed tick.
    """
    producer = client.create_producer(topic)
    stop = threading.Event()
    committed: list[int] = []
    errors: list = []
    t0 = time.monotonic()
    consumer = client.subscribe(topic, subscription=f"latest-{tag}-{uuid.uuid4().hex[:6]}",
                                initial_position="latest")
    tick = threading.Thread(target=ticker, args=(client, producer, tag, stop, committed,
                                                 errors), name=f"ticker-{tag}")
    tick.start()
    got: list[bytes] = []
    try:
        while not got and time.monotonic() - t0 < FIRST_RECORD_TIMEOUT_S and not errors:
            got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=0.1))
        first_s = time.monotonic() - t0
        assert got, f"{tag}: nothing delivered {FIRST_RECORD_TIMEOUT_S:.0f}s after subscribing"
        stop.set()
        tick.join(30)
        assert not errors, f"ticker failed: {errors!r}"
        last = f"{tag}:{committed[-1]}".encode()
        deadline = time.monotonic() + 30
        while last not in got and time.monotonic() < deadline:
            got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=0.5))
        got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=1.0))
    finally:
        stop.set()
        tick.join(30)
        consumer.close()
        producer.flush()
    return first_s, got, committed


def check_only_new(tag: str, got: list[bytes], committed: list[int]) -> None:
    """Only ticks (committed after subscribing), each once, none missing after the first."""
    prefix = f"{tag}:".encode()
    older = [v for v in got if not v.startswith(prefix)]
    assert not older, f"{tag}: {len(older)} records older than the subscription delivered, " \
                      f"e.g. {older[:5]}"
    seqs = [int(v[len(prefix):]) for v in got]
    assert seqs == list(range(seqs[0], committed[-1] + 1)), \
        f"{tag}: ticks delivered {seqs}, committed up to {committed[-1]}"


# ------------------------------------------------------------------ (a)


def test_latest_on_long_transactional_partition_starts_as_fast_as_on_empty(
        config, worker_procs, client, proc_reaper):
    proc_reaper.track(worker_procs.start("w"))
    wait_until(lambda: _tcs_served(client, config.num_coordinators), 90, "coordinators served")

    empty_topic, long_topic = make_topic(config, 1, "empty"), make_topic(config, 1, "long")
    empty_tp, long_tp = TopicPartition(empty_topic, 0), TopicPartition(long_topic, 0)
    # Empty but transactional: a txn registered the partition and wrote no record.
    txn = client.new_transaction()
    txn.register_partitions([empty_tp])
    txn.commit()
    # Long: txns (committed, aborted) around 1M plain records.
    t_write = time.monotonic()
    p = client.create_producer(long_topic)
    with client.transaction() as txn:
        p.send(b"old-committed-start", partition=0, txn=txn)
    aborted = client.new_transaction()
    p.send(b"old-aborted-start", partition=0, txn=aborted)
    aborted.abort()
    write_plain_fast(config, long_topic, LONG_RECORDS)
    with client.transaction() as txn:
        p.send(b"old-committed-end", partition=0, txn=txn)
    aborted = client.new_transaction()
    p.send(b"old-aborted-end", partition=0, txn=aborted)
    aborted.abort()
    p.flush()
    write_s = time.monotonic() - t_write
    high = high_watermark(config, long_topic)
    assert high >= LONG_RECORDS + 6
    t_fold = time.monotonic()
    wait_folded(client, long_tp, high, 120)
    fold_wait_s = time.monotonic() - t_fold
    wait_folded(client, empty_tp, high_watermark(config, empty_topic), 30)

    # A throw-away first round pays every one-off cost (metadata, connections).
    warm_s, got, committed = start_latest(client, empty_topic, "warm")
    check_only_new("warm", got, committed)
    long_s, got, committed = start_latest(client, long_topic, "long")
    check_only_new("long", got, committed)
    empty_s, got, committed = start_latest(client, empty_topic, "empty")
    check_only_new("empty", got, committed)
    print(f"\nlatest start, subscribe -> first record of a new txn: empty partition "
          f"{empty_s * 1000:.0f} ms (first round {warm_s * 1000:.0f} ms), partition of "
          f"{high:,} records {long_s * 1000:.0f} ms (written in {write_s:.1f}s, folded "
          f"{fold_wait_s:.1f}s after)")
    assert long_s < 2 * empty_s + 2.0, \
        f"latest start on {high:,} records took {long_s:.2f}s vs {empty_s:.2f}s on an empty one"


def _tcs_served(client: Client, n: int) -> bool:
    try:
        return len(client.admin.coordinator_stats()) == n
    except (TxnStreamError, KafkaException):  # topics just created: no leader yet
        return False


# ------------------------------------------------------------------ (b)


def test_earliest_reads_through_snapshot_without_refold(config, tc_worker, client,
                                                        monkeypatch):
    folded: dict[TopicPartition, int] = {}
    fold_entries = TransactionBuffer.fold_entries

    def counting(self, entries):  # type: ignore[no-untyped-def]
        n = fold_entries(self, entries)
        folded[self.tp] = folded.get(self.tp, 0) + n
        return n

    monkeypatch.setattr(TransactionBuffer, "fold_entries", counting)
    topic = make_topic(config, 1, "snap")
    tp = TopicPartition(topic, 0)
    p = client.create_producer(topic)
    want: list[bytes] = []
    for i in range(300):
        if i % 3 == 2:
            txn = client.new_transaction()
            for j in range(5):
                p.send(f"a{i}.{j}".encode(), partition=0, txn=txn)
            txn.abort()
        else:
            with client.transaction() as txn:
                for j in range(5):
                    p.send(f"c{i}.{j}".encode(), partition=0, txn=txn)
            want += [f"c{i}.{j}".encode() for j in range(5)]
        p.send(f"p{i}".encode(), partition=0)
        want.append(f"p{i}".encode())
    p.flush()
    high = high_watermark(config, topic)

    first = BufferWorker(config, [topic], snapshot_interval_s=1).start()
    try:
        wait_folded(client, tp, high, 60)
        store = TransactionBufferSnapshotStore(config)
        wait_until(lambda: (s := store.latest(tp)) is not None and s.position >= high - 1, 30,
                   "a snapshot covering the partition")
    finally:
        first.stop()
    assert folded.get(tp) == high, (folded.get(tp), high)

    # A new owner: it restores the snapshot; a reader from the earliest reads everything.
    folded.clear()
    second = BufferWorker(config, [topic], snapshot_interval_s=1).start()
    try:
        wait_until(lambda: tp in second.served, 60, "the new owner serving the partition")
        consumer = client.subscribe(topic, subscription=f"early-{uuid.uuid4().hex[:6]}",
                                    initial_position="earliest")
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + 60
            while len(got) < len(want) and time.monotonic() < deadline:
                for m in consumer.receive_batch(1000, timeout_s=0.5):
                    got.append(m.value)
                    consumer.acknowledge(m)
            got.extend(m.value for m in consumer.receive_batch(1000, timeout_s=1.0))
        finally:
            consumer.close()
        diff = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                    min(len(got), len(want)))
        assert got == want, (f"delivered {len(got)}, want {len(want)}; first difference at "
                             f"{diff}: {got[diff:diff + 3]} vs {want[diff:diff + 3]}")
        assert folded.get(tp, 0) == 0, \
            f"the new owner folded {folded[tp]} records again instead of restoring the snapshot"
        assert second.served[tp].buf.last_offset >= high - 1
    finally:
        second.stop()
