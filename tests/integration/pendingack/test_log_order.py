"""A replay of the pending-ack log gives the state its live owner had, also right after an end.

A txn's end is answered once its decision is durable, before the coordinator's marks
reach the pending-ack log (Kafka's order). An owner that applied the outcome to its
state at that reply, and acked again at once, logged an ack that the log's order then
contradicted: the next txn's cumulative ack above the first's, or its ack of records the
first's abort gave back, landed before the first's mark, and a replay dropped it as a
conflict. A new owner then delivered those records again although the txn that acked
them had committed: an exactly-once processor killed in that window had its successor
redo a whole checkpoint (``500 outputs duplicated``, a full suite run in stop 53).
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic, receive_n, wait_until
from txnstream.coordinator.log_entry import SubscriptionRef

pytestmark = pytest.mark.integration

ROUNDS = 12
PER_ROUND = 4
MARKS_LATE_S = 0.05
"""How long after its reply the worker writes a decided txn's markers and marks here:
as a worker descheduled between the two does on a loaded machine."""


@pytest.fixture
def late_marks(monkeypatch):
    """The in-process worker's finalizer writes every txn's marks ``MARKS_LATE_S`` late."""
    from txnstream.coordinator.finalizer import TxnFinalizer

    produce = TxnFinalizer._produce_missing

    def late(self, *args, **kwargs):
        time.sleep(MARKS_LATE_S)
        return produce(self, *args, **kwargs)

    monkeypatch.setattr(TxnFinalizer, "_produce_missing", late)


def _topic_of(client, config, records: int) -> str:
    topic = make_topic(config, 1)
    p = client.create_producer(topic)
    for i in range(records):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()
    return topic


def _assert_replayed_acked(client, tp, subscription: str, cursor: int) -> None:
    """The state a new owner would rebuild, once every end's mark is in the log: every
    record below ``cursor`` acked, nothing pending."""
    stats = None

    def settled() -> bool:
        nonlocal stats
        stats = client.admin.pending_ack_stats(tp, subscription)
        return stats.pending_txns == 0 and stats.cursor >= cursor

    try:
        wait_until(settled, 20, f"the replayed cursor of {tp} to reach {cursor}")
    except AssertionError:
        pass  # the assertion below names what the replay holds instead
    assert stats is not None and stats.cursor == cursor and stats.pending_offsets == 0 \
        and stats.cumulative_pending is None, stats


def test_cumulative_acks_right_after_each_commit_survive_a_replay(config, worker, client,
                                                                   late_marks):
    """Txn after txn, each acking the next records cumulatively as soon as the previous
    commit returned (registered before, as the exactly-once processor does): the log
    must hold each as acked, in its order."""
    topic = _topic_of(client, config, ROUNDS * PER_ROUND)
    sub = f"order-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    try:
        msgs = receive_n(c, ROUNDS * PER_ROUND)
        batches = [msgs[k * PER_ROUND:(k + 1) * PER_ROUND] for k in range(ROUNDS)]
        txn = client.new_transaction()
        c.acknowledge_batch(batches[0], txn=txn)
        for batch in batches[1:]:
            # the processor's way: the next txn acks its first inputs while the one
            # before is committing (individually: a cumulative ack is pending below) ...
            following = client.new_transaction()
            c.acknowledge_batch(batch[:1], txn=following)
            txn.commit()
            # ... and the next ones as soon as that commit returned (cumulatively)
            c.acknowledge_batch(batch[1:], txn=following)
            txn = following
        txn.commit()
        _assert_replayed_acked(client, msgs[0].tp, sub, ROUNDS * PER_ROUND)
    finally:
        c.close()
    c2 = client.subscribe(topic, subscription=sub)
    try:
        assert c2.receive(timeout_s=3) is None  # every record was acked by a commit
    finally:
        c2.close()


def test_records_an_abort_gave_back_and_a_commit_acked_survive_a_replay(config, worker,
                                                                         client, late_marks):
    """Acked in a txn that aborts, received again at once and acked in one that commits
    (the exactly-once processor's way after a failed checkpoint): a replay must find
    them acked by the commit, not given back by the abort's later mark."""
    topic = _topic_of(client, config, ROUNDS * PER_ROUND)
    sub = f"again-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    try:
        for _ in range(ROUNDS):
            batch = receive_n(c, PER_ROUND)
            failed = client.new_transaction()
            c.acknowledge_batch(batch, txn=failed)
            txn = client.new_transaction()
            txn.register_subscriptions([SubscriptionRef(topic, 0, sub)])  # as a processor's
            failed.abort()
            again = receive_n(c, PER_ROUND)
            assert [m.offset for m in again] == [m.offset for m in batch]
            c.acknowledge_batch(again, txn=txn)
            txn.commit()
        _assert_replayed_acked(client, batch[0].tp, sub, ROUNDS * PER_ROUND)
    finally:
        c.close()
