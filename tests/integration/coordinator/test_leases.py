"""Reserved TxnIDs through a real failover (issue 20, item 4).

A client hands out TxnIDs from a reserved block (``RESERVE``, a lease) and activates each
in the background (``ACTIVATE``). One handed out just before its block's hand-out window
closes, while the TC's owner is killed (``kill -9``, failover after the 6 s session
timeout), must still live for the timeout its user asked: the activation rides through
the failover like any request, and the new owner never aborts the txn at the block's
lease.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.coordinator.conftest import make_topic, owners, wait_until
from tests.integration.coordinator.test_coordinator_faults import all_served_by
from txnstream import TopicPartition, TxnStatus

pytestmark = [pytest.mark.integration, pytest.mark.fault]

HANDED_OUT_BEFORE_CUTOFF_S = 1.0
"""How long before the block's hand-out window closes the TxnIDs are handed out."""


@pytest.mark.slow
def test_a_txnid_handed_out_at_its_blocks_cutoff_survives_a_failover(config, worker_procs,
                                                                    client) -> None:
    topic = make_topic(config, 1, "lease")
    tp = TopicPartition(topic, 0)
    worker_procs.start("la")
    worker_procs.start("lb")
    n = config.num_coordinators
    wait_until(lambda: all_served_by(client, {"la", "lb"}, n)
               and len(set(owners(client).values())) == 2, 90, "two workers serving")
    tc, victim = next((t, o) for t, o in sorted(owners(client).items()))
    client.tc.pick_coordinator = lambda: tc  # type: ignore[method-assign]
    pool = client.tc.txn_ids

    first = client.new_transaction()  # reserves a block on `tc`
    first.commit()
    reserved_at = time.monotonic()  # no earlier than the client's RESERVE went out
    cutoff = pool._usable_until
    time.sleep(max(0.0, cutoff - HANDED_OUT_BEFORE_CUTOFF_S - time.monotonic()))

    worker_procs.signal(victim, signal.SIGKILL)
    committed = client.new_transaction(timeout_s=60)
    kept = client.new_transaction(timeout_s=60)
    handed_out = time.monotonic()
    assert handed_out < cutoff, "handed out inside the window"
    assert {committed.id.tc_id, kept.id.tc_id} == {tc}, "from the reserved block"
    assert committed.id.least_bits == first.id.least_bits + 1, "no new block was reserved"

    try:
        committed.register_partitions([tp])
        committed.commit()
    except Exception as exc:  # noqa: BLE001 - named in the failure
        pytest.fail(f"{committed.id} (timeout 60 s), handed out "
                    f"{cutoff - handed_out:.1f} s before its block's hand-out cutoff while "
                    f"its owner failed over, did not commit: {type(exc).__name__}: {exc}")
    failover_s = time.monotonic() - handed_out
    assert failover_s >= 5, f"the commit waited {failover_s:.1f} s: no failover happened?"
    survivor = ({"la", "lb"} - {victim}).pop()
    wait_until(lambda: all_served_by(client, {survivor}, n), 60, "the survivor owns every TC")

    # The block's lease (what the coordinator holds an unused TxnID for) has run out;
    # the TxnID handed out is alive for the 60 s its user asked, from its hand-out.
    lease_s = getattr(pool, "lease_s", 30.0)
    time.sleep(max(0.0, reserved_at + lease_s + 2 - time.monotonic()))
    info = client.admin.get_transaction(kept.id)
    assert info.status is TxnStatus.OPEN, (
        f"{kept.id} (timeout 60 s) is {info.status.value} "
        f"{time.monotonic() - handed_out:.0f} s after its hand-out: ended at its block's "
        f"lease of {lease_s:.0f} s")
    assert info.timeout_ms == 60_000, info
    kept.register_partitions([tp])
    kept.commit()
    assert client.admin.get_transaction(kept.id).status in (TxnStatus.COMMITTING,
                                                             TxnStatus.COMMITTED)
