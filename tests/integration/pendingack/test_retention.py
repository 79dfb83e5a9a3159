"""Pending acks across the log's retention (issue 20 #5).

Before, a partition whose OWNER records and checkpoints retention had removed started
its generations at 0 again, so a paused zombie holding a higher generation was not
fenced by the new owner and both processed an input. Generations now come from the
pending-ack log's offsets, which retention never resets.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from tests.integration.pendingack.conftest import fill, make_topic
from txnstream.errors import TxnStreamError

pytestmark = [pytest.mark.integration, pytest.mark.fault]

SESSION = {"session.timeout.ms": 6000}
ZOMBIE = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000}
"""A member that stops polling leaves the group after 6 s, with its state intact: a
process paused in the middle of a batch, as a SIGSTOP would leave it."""


def expire_log(config, topic: str, part: int) -> None:
    """What a quiet week does: retention removes every record of the log partition."""
    from confluent_kafka import Consumer

    c = Consumer(config.consumer(f"hw-{uuid.uuid4().hex[:6]}"))
    try:
        _, high = c.get_watermark_offsets(KafkaTP(topic, part), timeout=10)
    finally:
        c.close()
    admin = AdminClient(config.admin())
    for f in admin.delete_records([KafkaTP(topic, part, high)]).values():
        f.result(30)


def test_zombie_with_a_higher_generation_is_fenced_after_retention_removed_its_owner(
        config, worker, client):
    topic = make_topic(config, 1)
    fill(client, topic, 20)
    sub = f"ret-{uuid.uuid4().hex[:6]}"
    for _ in range(3):                   # earlier owners: the generation grows
        c = client.subscribe(topic, subscription=sub, **SESSION)
        assert c.receive(timeout_s=15) is not None
        c.close()
    z = client.subscribe(topic, subscription=sub, **ZOMBIE)
    m0 = z.receive(timeout_s=15)
    assert m0 is not None and m0.offset == 0
    tp = m0.tp
    handle = z._readers[tp].handle
    assert handle is not None
    zgen = handle.generation
    expire_log(config, config.topics.pending_ack, z._acks.log_partition(tp))

    n = client.subscribe(topic, subscription=sub, **SESSION)  # z stops polling meanwhile
    again = n.receive(timeout_s=40)
    assert again is not None, "the new owner got nothing"
    nh = n._readers[tp].handle
    assert nh is not None
    ngen = nh.generation

    txn = client.new_transaction(timeout_s=30)    # the zombie wakes and ends its batch
    z.acknowledge(m0, txn=txn)
    try:
        txn.commit()
        zombie_committed = True
    except TxnStreamError:
        zombie_committed = False
    z.close()
    assert not (zombie_committed and again.offset == 0), (
        f"input 0 processed twice: the zombie (generation {zgen}) committed its ack and "
        f"the new owner (generation {ngen}, after retention) delivered it again")
    assert ngen > zgen, f"generation went back from {zgen} to {ngen}"
    n.close()
