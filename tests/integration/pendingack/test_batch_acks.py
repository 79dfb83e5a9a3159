"""Batched exactly-once (issues 13, 36): one pending-ack record per partition per batch.

Counted in the real pending-ack log, as Kafka's ``send_offsets_to_transaction``
commits one offset per partition; a checkpoint's txn holds its batches' records.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from tests.integration.pendingack.conftest import make_topic, read_all, receive_n, wait_until
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind, is_checkpoint
from txnstream.processor import ExactlyOnceProcessor

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 30
ACKS = (PendingAckKind.ACK_INDIVIDUAL, PendingAckKind.ACK_CUMULATIVE)


def acks_logged(config, subscription: str) -> list[PendingAckEntry]:
    out = []
    for m in read_all(config, config.topics.pending_ack):
        if is_checkpoint(m.headers()):
            continue
        e = PendingAckEntry.decode(m.value())
        if e.subscription == subscription and e.kind in ACKS:
            out.append(e)
    return out


def _processor(config, client, sub: str) -> ExactlyOnceProcessor:
    """A processor (batches of up to 1000) over PARTITIONS x PER_PARTITION new inputs."""
    src, dst = make_topic(config, PARTITIONS, "in"), make_topic(config, PARTITIONS, "out")
    p = client.create_producer(src)
    for part in range(PARTITIONS):
        for i in range(PER_PARTITION):
            p.send(f"v{part}-{i}".encode(), partition=part)
    p.flush()
    return ExactlyOnceProcessor(client, src, sub, dst,
                                lambda m: (m.key, (m.value or b"").upper()),
                                batch_size=1000, batch_interval_s=1.0)


def _process_all(proc: ExactlyOnceProcessor) -> None:
    """Batches until every input is committed, none aborted; then closes ``proc``."""
    try:
        deadline = time.monotonic() + 60
        while proc.stats.inputs < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            proc.run_batch()
        assert proc.stats.inputs == PARTITIONS * PER_PARTITION
        assert proc.stats.aborted_batches == 0
    finally:
        proc.close()


def test_processor_batch_logs_one_cumulative_ack_per_partition(config, worker, client):
    sub = f"batch-{uuid.uuid4().hex[:6]}"
    proc = _processor(config, client, sub)
    _process_all(proc)
    entries = acks_logged(config, sub)
    per_txn_tp = Counter((e.txn_id, e.tp) for e in entries)
    per_txn = Counter(e.txn_id for e in entries)
    # at most one record per partition for each of a txn's batches, never one per input
    assert per_txn_tp and max(per_txn_tp.values()) <= proc.stats.batches, per_txn_tp
    assert sum(per_txn.values()) <= proc.stats.batches * PARTITIONS, per_txn
    assert len(per_txn) == proc.stats.checkpoints
    # each partition's inputs were its next records: every record is cumulative, and
    # each one of a partition goes further than the one before
    assert {e.kind for e in entries} == {PendingAckKind.ACK_CUMULATIVE}, entries
    for part in range(PARTITIONS):
        ends = [e.offsets[-1] for e in entries if e.tp.partition == part]
        assert ends == sorted(set(ends)) and ends[-1] == PER_PARTITION - 1, (part, ends)
    assert len(entries) < PARTITIONS * PER_PARTITION / 2  # not one per input


def test_acknowledge_batch_with_a_gap_logs_one_individual_ack(config, worker, client):
    """Records out of order or with a gap: one individual record lists their offsets;
    the record left out stays unacked (it comes back to the next consumer)."""
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(6):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()
    sub = f"gap-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    msgs = receive_n(c, 6)
    with client.transaction() as txn:
        c.acknowledge_batch([msgs[4], msgs[0], msgs[1], msgs[3], msgs[5]], txn=txn)
    wait_until(lambda: (c.receive(timeout_s=0.2), c.pending_ack_stats(msgs[0].tp).cursor)[1]
               == 2, 20, "the cursor to move past the committed acks")
    c.close()
    entries = acks_logged(config, sub)
    assert [(e.kind, e.offsets) for e in entries] == [
        (PendingAckKind.ACK_INDIVIDUAL, (0, 1, 3, 4, 5))]
    c2 = client.subscribe(topic, subscription=sub)
    assert [m.value for m in receive_n(c2, 1)] == [b"m2"]
    assert c2.receive(timeout_s=2) is None
    c2.close()


def test_acknowledge_batch_of_next_records_is_one_cumulative_ack(config, worker, client):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    for i in range(8):
        p.send(f"m{i}".encode(), partition=i % 2)
    p.flush()
    sub = f"next-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    msgs = receive_n(c, 8)
    with client.transaction() as txn:
        c.acknowledge_batch(msgs, txn=txn)
    c.close()
    entries = acks_logged(config, sub)
    assert sorted((e.kind, e.partition, e.offsets) for e in entries) == [
        (PendingAckKind.ACK_CUMULATIVE, 0, (3,)), (PendingAckKind.ACK_CUMULATIVE, 1, (3,))]
    c2 = client.subscribe(topic, subscription=sub)
    assert c2.receive(timeout_s=3) is None
    c2.close()


def _count_registrations(client, monkeypatch) -> list[tuple[str, tuple]]:
    """Every ADD_SUBSCRIPTIONS the client sends: (the sending thread's name, its refs)."""
    import threading

    from txnstream.coordinator.protocol import TcOp

    sent: list[tuple[str, tuple]] = []
    request = client.tc.request

    def counting(op, *args, **kw):
        if op is TcOp.ADD_SUBSCRIPTIONS:
            sent.append((threading.current_thread().name, kw["subscriptions"]))
        return request(op, *args, **kw)

    monkeypatch.setattr(client.tc, "request", counting)
    return sent


def test_acknowledge_batch_over_four_partitions_registers_them_in_one_request(
        config, worker, client, monkeypatch):
    topic = make_topic(config, PARTITIONS)
    p = client.create_producer(topic)
    for i in range(4 * PARTITIONS):
        p.send(f"m{i}".encode(), partition=i % PARTITIONS)
    p.flush()
    c = client.subscribe(topic, subscription=f"reg-{uuid.uuid4().hex[:6]}")
    msgs = receive_n(c, 4 * PARTITIONS)
    sent = _count_registrations(client, monkeypatch)
    with client.transaction() as txn:
        c.acknowledge_batch(msgs, txn=txn)
    c.close()
    assert len(sent) == 1, sent
    assert sorted(ref.partition for ref in sent[0][1]) == list(range(PARTITIONS))


def test_processor_registers_its_acks_in_the_background_while_the_batch_fills(
        config, worker, client, monkeypatch):
    """The batch's ack waits for no registration round trip of its own."""
    import threading

    proc = _processor(config, client, f"bg-{uuid.uuid4().hex[:6]}")
    sent = _count_registrations(client, monkeypatch)
    _process_all(proc)
    me = threading.current_thread().name
    assert sent and not [s for s in sent if s[0] == me], sent
    per_batch = len({ref.partition for _, refs in sent for ref in refs})
    assert per_batch == PARTITIONS
