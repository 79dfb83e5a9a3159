"""A buffer owner's check of many open txns does not hold its fold.

Every ``lwm_check_interval_s`` the owner asks the coordinator of each txn ongoing at a
partition it serves about it (:mod:`txnstream.buffer.ongoing`). It did so on its serving
thread, one question at a time, and asked each stuck partition's end of its data
consumer (behind its fetch parked on the broker, up to 100 ms each): nothing was folded
and no delta published meanwhile, so no commit became visible. 1,000 txns open at once
over 64 partitions held every reader of the topic back about 2 s at a check while they
committed (``bench.open_txns``). Now the serving thread only starts a round and judges
its answers at a later turn; here every call it makes must be short, and rounds must
still be judged.

A round also asks each coordinator a page of txns a request: one GET a txn cost the
worker 0.16 of a core at rest with 10,000 txns open (a page: 0.05).
"""

from __future__ import annotations

import statistics
import time

import pytest
from prometheus_client import REGISTRY

from tests.integration.buffer.conftest import make_topic, wait_until
from txnstream.buffer.ongoing import OngoingTxnCheck
from txnstream.buffer.worker import BufferWorker
from txnstream.coordinator.request_checks import GET_PAGE
from txnstream.types import TxnStatus

pytestmark = pytest.mark.integration

OPEN = 200
PARTITIONS = 16
CHECKS = 4


def _open_txns(config, client) -> tuple[str, list]:
    """A topic of :data:`PARTITIONS` and :data:`OPEN` txns open over it, a record each."""
    topic = make_topic(config, PARTITIONS)
    producer = client.create_producer(topic)
    txns = []
    for i in range(OPEN):
        txn = client.new_transaction(timeout_s=300)
        producer.send(b"open", txn=txn, partition=i % PARTITIONS)
        txns.append(txn)
    producer.flush()
    return topic, txns


def test_an_owners_check_of_many_open_txns_does_not_hold_its_fold(
        config, tc_worker, client, monkeypatch):
    took: list[float] = []
    judged: list[int] = []
    run, judge = OngoingTxnCheck.run, OngoingTxnCheck._judge

    def timed(self, served, *args):
        full = sum(1 for s in served.values() if s.buf.ongoing) == PARTITIONS
        t0 = time.perf_counter()
        try:
            return run(self, served, *args)
        finally:
            if full:  # every partition served and holding its open txns
                took.append(time.perf_counter() - t0)

    def counted(self, served):
        judged.append(len(self._answers))
        return judge(self, served)

    monkeypatch.setattr(OngoingTxnCheck, "run", timed)
    monkeypatch.setattr(OngoingTxnCheck, "_judge", counted)
    topic, txns = _open_txns(config, client)
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    bw.start()
    try:
        wait_until(lambda: sum(n == OPEN for n in judged) >= CHECKS, 120,
                   f"{CHECKS} rounds of {OPEN} answers judged")
        assert bw.markers_written == 0, "the check ended txns that are open"
    finally:
        bw.stop()
        for txn in txns:
            txn.abort()
    assert all(t.status is TxnStatus.ABORTED for t in txns)
    median = statistics.median(took)
    assert median < 0.3, (
        f"the check of {OPEN} open txns over {PARTITIONS} partitions held the serving "
        f"thread {sorted(round(s, 3) for s in took)} s, the owner folding nothing meanwhile")


def _gets() -> float:
    return sum(REGISTRY.get_sample_value("txnstream_tc_requests_total",
                                         {"op": "GET", "result": r}) or 0.0
               for r in ("ok", "InvalidRequestError", "TransactionNotFoundError"))


def test_a_round_asks_each_coordinator_a_page_of_txns_a_request(
        config, tc_worker, client, monkeypatch):
    rounds: list[int] = []
    start = OngoingTxnCheck._start

    def counted(self, served):
        start(self, served)
        if self._stuck is not None:
            rounds.append(sum(len(t) for t in self._stuck.values()))

    monkeypatch.setattr(OngoingTxnCheck, "_start", counted)
    topic, txns = _open_txns(config, client)
    bw = BufferWorker(config, [topic], snapshot_interval_s=1, lwm_check_interval_s=0.5)
    before = _gets()
    bw.start()
    try:
        wait_until(lambda: sum(n == OPEN for n in rounds) >= CHECKS, 120,
                   f"{CHECKS} rounds over {OPEN} open txns")
    finally:
        bw.stop()
        for txn in txns:
            txn.abort()
    gets = _gets() - before
    # a page of at most GET_PAGE txns of one coordinator a GET
    pages = OPEN // GET_PAGE + config.num_coordinators
    assert gets <= len(rounds) * pages, (
        f"{len(rounds)} rounds over {OPEN} open txns asked {gets:.0f} GETs, "
        f"{gets / len(rounds):.0f} a round: over {pages}, a page a coordinator")
    assert bw.markers_written == 0, "the check ended txns that are open"
