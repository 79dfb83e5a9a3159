"""Transactional acks on a real broker: commit applies, abort redelivers, conflicts."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.pendingack.conftest import make_topic, wait_until
from txnstream.errors import InvalidTxnStatusError, TransactionConflictError, TxnStreamError

pytestmark = pytest.mark.integration


def fill(client, topic, n):
    p = client.create_producer(topic)
    for i in range(n):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()


def subscribed(config, client, n):
    """A fresh topic holding ``n`` plain records, and a consumer of a fresh subscription."""
    topic = make_topic(config, 1)
    fill(client, topic, n)
    return topic, client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")


def receive_all(consumer, n, timeout_s=8):
    out = []
    while len(out) < n:
        m = consumer.receive(timeout_s=timeout_s)
        if m is None:
            break
        out.append(m)
    return out


def test_commit_applies_acks_restarted_consumer_does_not_see_them(config, worker, client):
    topic = make_topic(config, 1)
    fill(client, topic, 6)
    sub = f"s-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub)
    msgs = receive_all(c, 6)
    assert [m.value for m in msgs] == [f"m{i}".encode() for i in range(6)]
    with client.transaction() as txn:
        for m in msgs[:4]:
            c.acknowledge(m, txn=txn)
    wait_until(lambda: (c.receive(timeout_s=0.2), c.pending_ack_stats(msgs[0].tp).cursor)[1]
               == 4, 20, "the cursor to move past the committed acks")
    c.close()
    c2 = client.subscribe(topic, subscription=sub)
    rest = receive_all(c2, 2, timeout_s=6)
    c2.close()
    assert [m.value for m in rest] == [b"m4", b"m5"]


def test_abort_redelivers(config, worker, client):
    _, c = subscribed(config, client, 3)
    msgs = receive_all(c, 3)
    txn = client.new_transaction()
    c.acknowledge_cumulative(msgs[2], txn=txn)
    assert receive_all(c, 1, timeout_s=1) == []
    txn.abort()
    again = receive_all(c, 3, timeout_s=10)
    c.close()
    assert sorted(m.value for m in again) == [b"m0", b"m1", b"m2"]


def test_a_cumulative_ack_in_a_txn_never_covers_inputs_an_abort_gave_back(
        config, worker, client):
    """Soak seed 5's loss (RELIABILITY.md): txn A acked inputs 0-1 cumulatively and
    aborted while the caller had already taken 2-3; A's abort queued 0-1 again. B's
    cumulative ack of 3 would ack 0-1 too, never processed: it conflicts instead,
    naming them, and B can only abort. Once received again they ack as usual."""
    topic, c = subscribed(config, client, 4)
    first = receive_all(c, 2)
    a = client.new_transaction()
    c.acknowledge_cumulative(first[1], txn=a)
    later = receive_all(c, 2)
    assert [m.offset for m in later] == [2, 3]
    a.abort()  # its acks undone: 0 and 1 are queued again, not received yet
    b = client.new_transaction()
    with pytest.raises(TransactionConflictError) as exc:
        c.acknowledge_cumulative(later[1], txn=b)
    msg = str(exc.value)
    assert f"{topic}" in msg and "[0, 1]" in msg and "not received again" in msg, msg
    with pytest.raises(TxnStreamError):
        b.commit()  # abort-only: the commit aborts it
    again = receive_all(c, 2)
    assert [m.offset for m in again] == [0, 1]
    with client.transaction() as t:
        c.acknowledge_cumulative(later[1], txn=t)  # 0-3 all received: one ack takes them
    wait_until(lambda: (c.receive(timeout_s=0.2), c.pending_ack_stats(later[1].tp).cursor)[1]
               == 4, 20, "the cumulative ack applied")
    c.close()


def test_conflict_fails_only_the_second_transaction(config, worker, client):
    topic = make_topic(config, 1)
    fill(client, topic, 2)
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    msgs = receive_all(c, 2)
    first, second = client.new_transaction(), client.new_transaction()
    c.acknowledge(msgs[0], txn=first)
    with pytest.raises(TransactionConflictError) as exc:
        c.acknowledge(msgs[0], txn=second)
    assert str(first.id) in str(exc.value) and "offset" in str(exc.value)
    with pytest.raises(TxnStreamError):
        second.commit()                     # abort-only now: commit aborts it
    first.commit()
    wait_until(lambda: (c.receive(timeout_s=0.2), c.pending_ack_stats(msgs[0].tp).cursor)[1]
               == 1, 20, "first txn's ack applied")
    with pytest.raises(TransactionConflictError):
        c.acknowledge(msgs[0], txn=client.new_transaction())   # already acked
    c.close()


def test_bad_acks_get_clear_errors_and_change_nothing(config, worker, client):
    topic = make_topic(config, 1)
    other = make_topic(config, 1)
    fill(client, topic, 1)
    fill(client, other, 1)
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
    c_other = client.subscribe(other, subscription=f"s-{uuid.uuid4().hex[:6]}")
    msg = receive_all(c, 1)[0]
    foreign = receive_all(c_other, 1)[0]
    with pytest.raises(TxnStreamError, match="not assigned"):
        c.acknowledge(foreign)
    import dataclasses

    with pytest.raises(TxnStreamError, match="not a message delivered"):
        c.acknowledge(dataclasses.replace(msg, offset=msg.offset + 5))
    ended = client.new_transaction()
    ended.commit()
    with pytest.raises(InvalidTxnStatusError, match=str(ended.id).replace("(", r"\(")
                       .replace(")", r"\)")):
        c.acknowledge(msg, txn=ended)
    stats = c.pending_ack_stats(msg.tp)
    assert stats.pending_offsets == 0 and stats.cursor == 0
    c.close()
    c_other.close()
