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

from tests.integration.consumer.conftest import fill, make_topic, receive_n

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
