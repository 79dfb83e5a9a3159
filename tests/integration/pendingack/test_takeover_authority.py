"""Who a takeover may abort (issue 20 #6): fenced owners' txns only, and only if allowed.

* a txn that holds acks only on partitions its member still owns is not touched when
  another member takes a different partition over;
* a member whose principal differs from the txn's (and is no admin) may not abort it:
  the coordinator refuses, the input stays held until the txn's timeout, as before;
* an admin principal aborts it at once.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.coordinator.test_trust import clients, secured  # noqa: F401
from tests.integration.pendingack.conftest import make_topic, wait_until
from txnstream.types import TxnStatus

pytestmark = [pytest.mark.integration, pytest.mark.fault]

SESSION = {"session.timeout.ms": 6000}
ZOMBIE = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000}
"""Stops polling: leaves the group after 6 s, its txn left open (a dead process)."""
TXN_TIMEOUT_S = 12


def test_taking_one_partition_leaves_the_txn_on_the_other_alone(config, worker, client):
    topic = make_topic(config, 2)
    p = client.create_producer(topic)
    for i in range(10):
        p.send(f"m{i}".encode(), partition=i % 2)
    p.flush()
    sub = f"live-{uuid.uuid4().hex[:6]}"
    a = client.subscribe(topic, subscription=sub, **SESSION)
    got = {}
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        m = a.receive(timeout_s=1)
        if m is not None:
            got.setdefault(m.partition, m)
    t = {part: client.new_transaction(timeout_s=60) for part in got}
    for part, m in got.items():
        a.acknowledge(m, txn=t[part])
        t[part].flush()
    b = client.subscribe(topic, subscription=sub, **SESSION)
    wait_until(lambda: (a.receive(timeout_s=0.2), b.receive(timeout_s=0.2))
               and len(b._readers) == 1 and len(a._readers) == 1, 60, "a rebalance 1:1")
    moved = next(iter(b._readers)).partition
    kept = next(iter(a._readers)).partition
    assert client.admin.get_transaction(t[moved].id).status is TxnStatus.ABORTED, (
        "the txn holding acks on the partition taken over is aborted")
    t[kept].commit()                 # its member still owns that partition: untouched
    assert client.admin.get_transaction(t[kept].id).status is TxnStatus.COMMITTED
    a.close()
    b.close()


def _held_input_comes_back_after(clients, who: str) -> float:  # noqa: F811
    """Seconds from the takeover's first delivery until the dead txn's input came back."""
    topic = make_topic(clients("alice").config, 1)
    alice = clients("alice")
    p = alice.create_producer(topic)
    for i in range(5):
        p.send(f"m{i}".encode(), partition=0)
    p.flush()
    sub = f"who-{uuid.uuid4().hex[:6]}"
    dead = alice.subscribe(topic, subscription=sub, **ZOMBIE)
    m0 = dead.receive(timeout_s=20)
    assert m0 is not None and m0.offset == 0
    txn = alice.new_transaction(timeout_s=TXN_TIMEOUT_S)
    dead.acknowledge(m0, txn=txn)
    txn.flush()                      # acked, never committed; `dead` polls no more
    other = clients(who)
    c = other.subscribe(topic, subscription=sub, **SESSION)
    first = c.receive(timeout_s=40)
    assert first is not None
    t0 = time.monotonic()
    seen = [first.offset]
    while 0 not in seen and time.monotonic() - t0 < 5 * TXN_TIMEOUT_S:
        m = c.receive(timeout_s=1)
        if m is not None:
            seen.append(m.offset)
    c.close()
    assert 0 in seen, "the dead txn's input never came back"
    return seen.index(0), time.monotonic() - t0


def test_another_principal_cannot_abort_the_dead_txn_an_admin_can(clients):  # noqa: F811
    pos, _ = _held_input_comes_back_after(clients, "txnstream")   # the admin
    assert pos == 0, f"the admin's takeover delivered input 0 at position {pos}"
    pos, waited = _held_input_comes_back_after(clients, "bob")
    assert pos > 0, "bob may not abort alice's txn: input 0 waits for its timeout"
    assert waited > 3, f"input 0 came back after {waited:.1f}s, before the txn timed out"
