"""Pending-ack fencing: a paused (zombie) owner and a new owner never both take a message."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.pendingack.conftest import fill, make_topic, receive_n
from txnstream.errors import TxnStreamError
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind
from txnstream.pendingack.store import PendingAckStore

pytestmark = pytest.mark.integration


def test_zombie_cumulative_ack_after_a_newer_owner_cannot_commit(config, worker, client):
    """(a) A txn holding only a *cumulative* pending ack is fenced by a newer OWNER.

    The zombie acks after the new owner's OWNER record: its ack is invalid in the log, so
    the new owner delivers those messages again; the zombie's txn must not commit.
    """
    topic = make_topic(config, 1)
    fill(client, topic, 5)
    sub = f"z-{uuid.uuid4().hex[:6]}"
    zombie = client.subscribe(topic, subscription=sub)
    msgs = receive_n(zombie, 5)
    tp = msgs[0].tp

    newer = PendingAckStore(config, sub, "newer-owner")
    handle = newer.replay(tp)
    newer.claim(handle, cursor=0)

    txn = client.new_transaction(timeout_s=30)
    zombie.acknowledge_cumulative(msgs[4], txn=txn)   # logged after the newer OWNER
    with pytest.raises(TxnStreamError):
        txn.commit()
    assert txn.status.value == "ABORTED"

    check = PendingAckStore(config, sub, "checker")
    state = check.replay(tp)
    assert all(state.is_deliverable(m.offset) for m in msgs), \
        "the zombie's ack is not valid in the log: the new owner delivers these"
    newer.close()
    check.close()
    zombie.close()


def test_ack_landing_between_replay_and_owner_is_known_to_the_new_owner(config, worker,
                                                                       client):
    """(b) A zombie ack logged after the new owner's replay end but before its OWNER.

    That ack is valid in the log (it precedes the OWNER), and the zombie's read-back sees
    no OWNER before it, so the zombie commits. The new owner must therefore know it: it
    holds the message back until that txn ends instead of delivering it again.
    """
    topic = make_topic(config, 1)
    fill(client, topic, 3)
    sub = f"z-{uuid.uuid4().hex[:6]}"
    tp_topic = topic
    zombie_store = PendingAckStore(config, sub, "zombie")
    from txnstream.types import TopicPartition

    tp = TopicPartition(tp_topic, 0)
    zh = zombie_store.replay(tp)
    zombie_store.claim(zh, cursor=0)

    newer = PendingAckStore(config, sub, "newer-owner")
    nh = newer.replay(tp)                                # replays to the end H

    txn = client.new_transaction(timeout_s=30)          # the zombie's ack lands at H
    zh.ack_individual([1], txn.id)
    zombie_store.append(PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, sub, tp.topic, 0,
                                       txn.id, (1,), zh.generation, "zombie"))
    zombie_store.flush_txn(txn.id)

    newer.claim(nh, cursor=0)                            # OWNER after it
    assert nh.pending_txn(1) == txn.id, "the new owner must hold offset 1 back"
    assert not nh.is_deliverable(1)
    txn.abort()
    zombie_store.close()
    newer.close()
