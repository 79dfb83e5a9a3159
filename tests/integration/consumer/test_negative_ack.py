"""Negative acks (Pulsar's ``negativeAcknowledge``): a nacked record comes back once, and
never after it has been acked.

Found by the nemesis (CI, seed 11): a processor's batch straddled a rebalance, its acks
were refused, and it nacked the batch; the partition's new reader fetched the same
records again, so each was queued twice. A txn acked and committed one copy; the other
copy came back after the nack delay, every txn that acked it conflicted ("has been
acked"), the processor nacked it again, and the partition's cursor stayed below it for
good. Pulsar's broker redelivers only positions still unacked, and its client tracks a
nacked message once.
"""

from __future__ import annotations

import uuid

import pytest

from tests.integration.consumer.conftest import fill, make_topic, receive_n, wait_until

pytestmark = pytest.mark.integration

NACK_DELAY_S = 0.3


def delivered(config, client, n: int):
    """An ``n``-record topic and a consumer that received all of it."""
    topic = make_topic(config, 1)
    fill(client, topic, n)
    c = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}",
                         nack_delay_s=NACK_DELAY_S)
    return c, receive_n(c, n)


def offsets_within(consumer, seconds: float) -> list[int]:
    out = []
    while (m := consumer.receive(timeout_s=seconds)) is not None:
        out.append(m.offset)
    return out


def test_a_nacked_record_comes_back_after_the_delay(config, worker, client):
    c, (m0, _) = delivered(config, client, 2)
    c.negative_acknowledge(m0)
    assert offsets_within(c, NACK_DELAY_S * 5) == [0]
    c.close()


def test_a_record_nacked_twice_comes_back_once(config, worker, client):
    c, (m0, _) = delivered(config, client, 2)
    c.negative_acknowledge(m0)
    c.negative_acknowledge(m0)
    assert offsets_within(c, NACK_DELAY_S * 5) == [0]
    c.close()


def test_a_nacked_record_acked_in_a_committed_txn_is_not_delivered_again(config, worker,
                                                                          client):
    """The nemesis's livelock: a nack queued, the record acked and committed since."""
    c, (m0, m1) = delivered(config, client, 2)
    c.negative_acknowledge(m0)
    txn = client.new_transaction(timeout_s=30)
    c.acknowledge(m0, txn=txn)
    c.acknowledge(m1, txn=txn)
    txn.commit()
    assert offsets_within(c, NACK_DELAY_S * 5) == [], "an acked record was delivered again"
    assert c.pending_ack_stats(m0.tp).cursor == 2
    c.close()


def test_a_nacked_record_acked_plainly_is_not_delivered_again(config, worker, client):
    c, (m0, _) = delivered(config, client, 2)
    c.negative_acknowledge(m0)
    c.acknowledge(m0)
    assert offsets_within(c, NACK_DELAY_S * 5) == []
    c.close()


def test_a_nacked_record_acked_in_a_txn_comes_back_once_if_that_txn_aborts(config, worker,
                                                                           client):
    """Held by the open txn, the nack does not deliver it; the abort does, once."""
    c, (m0, _) = delivered(config, client, 2)
    c.negative_acknowledge(m0)
    txn = client.new_transaction(timeout_s=30)
    c.acknowledge(m0, txn=txn)
    assert offsets_within(c, NACK_DELAY_S * 4) == [], "delivered while its txn holds it"
    txn.abort()
    assert offsets_within(c, NACK_DELAY_S * 5) == [0]
    c.close()


def test_a_nack_of_a_record_whose_partition_moved_away_is_a_no_op(config, worker, client):
    """Found by the hostile soak of stop 54 (seed 42): a two-phase writer's ack was
    refused because another member had claimed the partition, it nacked the record as
    its error path does, and the nack raised ("not assigned to this consumer") and ended
    the process. Pulsar's ``negativeAcknowledge`` never fails: a record of a partition
    this consumer no longer owns is the new owner's to deliver, and it does (unacked)."""
    topic = make_topic(config, 2)
    fill(client, topic, 4, partitions=2)
    sub = f"moved-{uuid.uuid4().hex[:6]}"
    a = client.subscribe(topic, subscription=sub, nack_delay_s=NACK_DELAY_S)
    b = None
    try:
        got = receive_n(a, 4)
        b = client.subscribe(topic, subscription=sub, nack_delay_s=NACK_DELAY_S)
        at_b: list[bytes] = []

        def split() -> bool:
            a.receive(timeout_s=0.2)
            if (m := b.receive(timeout_s=0.2)) is not None:
                at_b.append(m.value)
            return len(a._readers) == 1 and len(b._readers) == 1

        wait_until(split, 60, "a rebalance 1:1")
        moved = next(iter(b._readers))
        gone = [m for m in got if m.tp == moved]
        for m in gone:
            a.negative_acknowledge(m)  # no error: the partition is b's now
        while len(at_b) < len(gone) and (m := b.receive(timeout_s=8)) is not None:
            at_b.append(m.value)
        assert sorted(at_b) == sorted(m.value for m in gone), "the new owner delivers them"
    finally:
        a.close()
        if b is not None:
            b.close()
