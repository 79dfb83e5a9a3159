"""A buffer owner's check of many open txns does not hold its fold.

Every ``lwm_check_interval_s`` the owner asks the coordinator of each txn ongoing at a
partition it serves about it (:mod:`txnstream.buffer.ongoing`), on its serving thread:
nothing is folded and no delta published meanwhile, so no commit becomes visible. With
one question at a time, and each stuck partition's end asked of the owner's data
consumer (behind its fetch parked on the broker, up to 100 ms each), 1,000 txns open at
once over 64 partitions held every reader back about 1.5 s at each check
(``bench.open_txns``: nothing delivered in the first 1.5 s of 1,000 commits).
"""

from __future__ import annotations

import statistics
import time

import pytest

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream.buffer.ongoing import OngoingTxnCheck
from txnstream.buffer.worker import BufferWorker
from txnstream.types import TxnStatus

pytestmark = pytest.mark.integration

OPEN = 200
PARTITIONS = 16
CHECKS = 4


def test_an_owners_check_of_many_open_txns_takes_a_round_not_one_per_txn(
        config, tc_worker, client, monkeypatch):
    took: list[float] = []
    run = OngoingTxnCheck.run

    def timed(self, served):
        full = sum(1 for s in served.values() if s.buf.ongoing) == PARTITIONS
        t0 = time.perf_counter()
        try:
            return run(self, served)
        finally:
            if full:  # every partition served and holding its open txns
                took.append(time.perf_counter() - t0)

    monkeypatch.setattr(OngoingTxnCheck, "run", timed)
    topic = make_topic(config, PARTITIONS)
    producer = client.create_producer(topic)
    txns = []
    for i in range(OPEN):
        txn = client.new_transaction(timeout_s=300)
        producer.send(b"open", txn=txn, partition=i % PARTITIONS)
        txns.append(txn)
    producer.flush()
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    bw.start()
    try:
        wait_until(lambda: len(took) >= CHECKS, 120, f"{CHECKS} checks of {OPEN} open txns")
        assert bw.markers_written == 0, "the check ended txns that are open"
    finally:
        bw.stop()
        for txn in txns:
            txn.abort()
    assert all(t.status is TxnStatus.ABORTED for t in txns)
    median = statistics.median(took)
    assert median < 0.3, (
        f"a check of {OPEN} open txns over {PARTITIONS} partitions took "
        f"{sorted(round(s, 3) for s in took)} s, the owner folding nothing meanwhile")
