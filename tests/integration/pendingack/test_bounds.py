"""Pending-ack state is bounded: replay starts at a checkpoint; per-txn bookkeeping ends."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.pendingack.conftest import fill, make_topic, wait_until

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_a_new_owner_replays_from_the_latest_checkpoint_not_the_log_start(config, worker,
                                                                         client):
    """Before: every assignment replayed the whole pending-ack log (2 records per txn
    forever, with a 120 s deadline). Now the owner checkpoints and a new owner reads the
    log from the latest checkpoint, and gets the same state: individually acked offsets
    above the cursor, and acks still pending in an open txn."""
    topic = make_topic(config, 1)
    fill(client, topic, 1_000)
    sub = f"b-{uuid.uuid4().hex[:6]}"
    c = client.subscribe(topic, subscription=sub, checkpoint_interval_s=0.2)
    got = [c.receive(timeout_s=8) for _ in range(900)]
    assert None not in got
    for i in range(0, 880, 4):          # 220 txns: 440+ records of this key in the log
        with client.transaction() as txn:
            for m in got[i:i + 4]:
                c.acknowledge(m, txn=txn)
    c.acknowledge(got[885])             # a plain ack above the cursor
    open_txn = client.new_transaction(timeout_s=120)
    c.acknowledge(got[882], txn=open_txn)  # pending when the owner leaves
    open_txn.flush()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # let a checkpoint cover all of it
        c.receive(timeout_s=0.3)
    c.close()

    c2 = client.subscribe(topic, subscription=sub)
    first = c2.receive(timeout_s=10)
    replayed = c2._acks.replayed_records
    assert replayed < 100, f"replayed {replayed} pending-ack records: not from a checkpoint"
    seen = [first.offset] if first else []
    while (m := c2.receive(timeout_s=3)) is not None:
        seen.append(m.offset)
    # 880 acked by committed txns; 882 pending in an open txn; 885 plainly acked
    assert seen == [o for o in range(880, 1000) if o not in (882, 885)], seen[:10]
    open_txn.commit()

    def settled():
        assert c2.receive(timeout_s=0.2) is None, "nothing more is delivered"
        return c2.pending_ack_stats(first.tp).pending_offsets == 0

    wait_until(settled, 20, "the open txn's commit to reach the new owner")
    c2.close()


def test_per_txn_bookkeeping_ends_with_the_txn(config, worker, client):
    """Consumer.tracked_txns(), the store's written/failed maps and the producer's per-txn maps
    are emptied when a txn ends: committed, aborted, or aborted at its timeout."""
    src, dst = make_topic(config, 1), make_topic(config, 2)
    fill(client, src, 150)
    c = client.subscribe(src, subscription=f"b-{uuid.uuid4().hex[:6]}")
    producer = client.create_producer(dst)
    for i in range(150):
        m = c.receive(timeout_s=8)
        assert m is not None
        txn = client.new_transaction(timeout_s=1.5 if i % 3 == 2 else 30)
        producer.send(b"out", txn=txn, partition=i % 2)
        producer.send_batch([b"a", b"b"], [0, 1], txn)
        c.acknowledge(m, txn=txn)
        if i % 3 == 0:
            txn.commit()
        elif i % 3 == 1:
            txn.abort()
        else:
            txn.flush()                 # abandoned: the coordinator aborts it at 1.5 s
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (c.tracked_txns() or c._acks.tracked_txns()):
        c.receive(timeout_s=0.5)        # marks of timed-out txns arrive here
    producer.send_batch([b"z"], [0], client.new_transaction(timeout_s=30))  # sweeps
    assert c.tracked_txns() == 0, c.tracked_txns()
    assert c._acks.tracked_txns() == 0
    assert producer.tracked_txns() <= 1
    c.close()
