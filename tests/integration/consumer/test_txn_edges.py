"""Transaction edges seen by a user: racing sends, unknown outcomes, aborts, redelivery."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.integration.consumer.conftest import fill, make_topic, receive_n, wait_until
from txnstream import Client
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import InvalidTxnStatusError, TxnStreamError

pytestmark = pytest.mark.integration


def committed_values(client, topic, n_expected, timeout_s=5.0):
    c = client.subscribe(topic, subscription=f"check-{uuid.uuid4().hex[:6]}")
    out = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = c.receive(timeout_s=0.5)
        if m is not None:
            out.append(m.value)
        elif len(out) >= n_expected:
            break
    c.close()
    return out


def one_delivered(config, client):
    """A one-record topic and a consumer that received that record."""
    topic = make_topic(config, 1)
    fill(client, topic, 1)
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    (m,) = receive_n(c, 1)
    return c, m


def test_a_send_racing_a_commit_fails_or_is_committed_never_silently_dropped(config, worker,
                                                                            client):
    """Item 7: the send passes the OPEN check, the commit writes its marker, then the
    record lands after it. The send must fail naming the txn, or be part of the txn."""
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=30)
    producer.send(b"first", txn=txn, partition=0)
    producer.flush_transaction(txn)

    checked = threading.Event()
    committed = threading.Event()
    real_register = txn.register_partitions

    def register_then_wait(tps):  # the send thread is past its OPEN check here
        real_register(tps)
        if threading.current_thread().name == "sender":
            checked.set()
            committed.wait(10)

    txn.register_partitions = register_then_wait
    outcome = {}

    def send_late():
        try:
            producer.send(b"late", txn=txn, partition=0)
            producer.flush()
            outcome["sent"] = True
        except InvalidTxnStatusError as exc:
            outcome["error"] = exc

    t = threading.Thread(target=send_late, name="sender")
    t.start()
    assert checked.wait(10)
    txn.commit()
    committed.set()
    t.join(15)
    values = committed_values(client, topic, 1)
    if "error" in outcome:
        assert str(txn.id) in str(outcome["error"])
        assert values == [b"first"]
    else:
        assert values == [b"first", b"late"], f"send reported success, readers got {values}"


def test_a_send_from_another_process_after_the_commit_is_reported_by_its_flush(config, worker,
                                                                               client):
    """Item 7, across processes: a handle attached by TxnID learns at flush() whether the
    record it sent after the commit landed before the txn's markers (then readers deliver
    it) or after them (``RecordsExcludedError``, an ``InvalidTxnStatusError``, naming the
    txn). Since issue 33 the commit is answered at its decision, before its markers, so
    either can happen; the answer must be the readers'."""
    topic = make_topic(config, 1)
    other = Client(config=config)
    try:
        txn = client.new_transaction(timeout_s=30)
        joined = other.attach_transaction(str(txn.id))
        p2 = other.create_producer(topic)
        p2.send(b"in-time", txn=joined, partition=0)
        joined.flush()                       # still OPEN: its record precedes the markers
        txn.commit()
        try:  # refused if the handle was already told of the commit: nothing is sent
            p2.send(b"too-late", txn=joined, partition=0)
            joined.flush()
            told_out = False
        except InvalidTxnStatusError as exc:
            assert str(txn.id) in str(exc)
            told_out = True
        want = [b"in-time"] if told_out else [b"in-time", b"too-late"]
        assert committed_values(client, topic, len(want)) == want
    finally:
        other.close()


def test_commit_without_an_answer_is_unknown_not_aborted(own_config):
    """Item 8: no coordinator answers the END: the outcome is unknown (distinct error,
    status not final); once a coordinator answers, commit() again learns it committed.

    Internal topics of its own: a restarted worker's buffer role restores every partition
    registered in its slots before it serves any, and with the session's shared topics
    (every earlier test's snapshots) one slot's scan took 42 s in a full run."""
    from dataclasses import replace

    config = own_config
    topic = make_topic(config, 1)
    w = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=6000)).start()
    wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
    impatient = Client(config=replace(config, request_timeout_s=4.0))
    client = Client(config=config)
    try:
        txn = impatient.new_transaction(timeout_s=120)
        impatient.create_producer(topic).send(b"r", txn=txn, partition=0)
        w.stop()
        with pytest.raises(TxnStreamError) as err:
            txn.commit()
        assert type(err.value).__name__ == "TransactionOutcomeUnknownError", repr(err.value)
        assert not txn.status.is_final, txn.status
        w2 = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=6000)).start()
        try:
            wait_until(lambda: len(w2.serving()) == config.num_coordinators, 60, "serving")
            txn.commit()
            assert txn.status.value == "COMMITTED"
            # the restarted worker's buffer role claims the topic's slot before any
            # reader sees the commit
            assert committed_values(client, topic, 1, timeout_s=30.0) == [b"r"]
        finally:
            w2.stop()
    finally:
        client.close()
        impatient.close()


def test_a_second_buffer_error_does_not_leak_the_outstanding_count(config, worker, client):
    """Item 9: librdkafka's queue is full twice in a row for one send; its commit must not
    wait for a send that never went out."""
    topic = make_topic(config, 1)
    producer = client.create_producer(topic)
    real = producer._kafka

    class QueueFullTwice:
        def __init__(self):
            self.left = 2

        def produce(self, *a, **kw):
            if self.left:
                self.left -= 1
                raise BufferError("Local: Queue full")
            return real.produce(*a, **kw)

        def __getattr__(self, name):
            return getattr(real, name)

    producer._kafka = QueueFullTwice()
    txn = client.new_transaction(timeout_s=60)
    try:
        producer.send(b"x", txn=txn, partition=0)
        sent = True
    except BufferError:
        sent = False
    t0 = time.monotonic()
    txn.commit()
    assert time.monotonic() - t0 < 10, "commit waited for a send that was never queued"
    assert committed_values(client, topic, 1) == ([b"x"] if sent else [])


def test_acking_again_right_after_abort_returned(config, worker, client):
    """Item 10: abort() returned, so its acks are undone: a new txn may ack the message
    at once, without a receive() in between."""
    c, m = one_delivered(config, client)
    t1 = client.new_transaction(timeout_s=30)
    c.acknowledge(m, txn=t1)
    t1.abort()
    t2 = client.new_transaction(timeout_s=30)
    c.acknowledge(m, txn=t2)          # raised TransactionConflictError before
    t2.commit()
    assert t2.status.value == "COMMITTED"
    assert c.pending_ack_stats(m.tp).cursor == 1, "the commit's ack is applied at once"
    c.close()


def test_abort_waits_for_the_txns_outstanding_sends(config, worker, client):
    topic = make_topic(config, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=30)
    for i in range(500):
        producer.send(b"v" * 100, txn=txn, partition=i % 2)
    txn.abort()
    assert not producer._outstanding, "abort() returned with sends still outstanding"


def test_redelivery_after_abort_is_in_offset_order(config, worker, client):
    """Item 10: 0, 1, 2 acked in a txn that aborts come back before 3, 4 (Pulsar's order)."""
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(5):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    first = receive_n(c, 3)
    wait_until(lambda: len(c._queue.ready) == 2, 10, "3 and 4 fetched")
    txn = client.new_transaction(timeout_s=30)
    for m in first:
        c.acknowledge(m, txn=txn)
    txn.abort()
    rest = receive_n(c, 5)
    c.close()
    assert [m.offset for m in rest] == [0, 1, 2, 3, 4]


def test_plain_individual_acks_survive_a_rebalance(config, worker, client):
    """Item 10 / DESIGN section 7: individually acked offsets above the cursor are kept."""
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(5):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()
    sub = f"s-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    msgs = receive_n(c, 5)
    c.acknowledge(msgs[1])
    c.acknowledge(msgs[3])
    c.close()
    c2 = client.subscribe(topic, subscription=sub)
    again = []
    while (m := c2.receive(timeout_s=4)) is not None:
        again.append(m.offset)
    c2.close()
    assert again == [0, 2, 4]


def test_ack_under_the_consumer_lock_while_a_commit_confirms_acks_does_not_deadlock(
        config, worker, client):
    """Item 10: the consumer takes its lock then the txn's, commit() took them the other
    way round (txn lock, then _confirm_acks takes the consumer lock)."""
    c, m = one_delivered(config, client)
    txn = client.new_transaction(timeout_s=30)
    c.acknowledge(m, txn=txn)
    done = threading.Event()

    def txn_lock_taken():
        if txn._lock.acquire(blocking=False):
            txn._lock.release()
            return False
        return True

    c._lock.acquire()
    try:
        committer = threading.Thread(target=lambda: (txn.commit(), done.set()), daemon=True)
        committer.start()
        wait_until(txn_lock_taken, 10, "commit() to hold the txn lock", every=0.01)
        # what _ack does under the consumer lock when a txn acks a new partition:
        adder = threading.Thread(target=lambda: txn.add_flusher(lambda: None), daemon=True)
        adder.start()
        adder.join(5)
        assert not adder.is_alive(), "a txn call under the consumer lock blocked: deadlock"
    finally:
        c._lock.release()
    assert done.wait(15), "commit never finished"
    c.close()
