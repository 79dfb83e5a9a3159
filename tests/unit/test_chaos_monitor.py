"""The chaos monitor flags a txn as open past its timeout only if it surely was.

A LIST asks every coordinator in turn; while one fails over, the call can take seconds
after another coordinator answered. An age measured when the call returned flagged a
txn its opener had aborted in time (soak of 2026-11-24, seed 2: aborted 43.5 s after it
opened, flagged at 50.5 s against a 50 s bound).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from chaos.monitor import Monitor
from chaos.profile import profile
from txnstream import TxnStatus


class SlowList:
    """An admin whose LIST returns ``delay_s`` after the coordinators answered."""

    def __init__(self, txns: list[object], delay_s: float) -> None:
        self.txns, self.delay_s = txns, delay_s

    def list_transactions(self) -> list[object]:
        answered = list(self.txns)
        time.sleep(self.delay_s)
        return answered


def txn(age_s: float, timeout_s: float, status: TxnStatus = TxnStatus.OPEN) -> SimpleNamespace:
    return SimpleNamespace(txn_id="(0,927)", status=status, partitions=["t-0"],
                           open_time_ms=time.time() * 1000 - age_s * 1000,
                           timeout_ms=timeout_s * 1000)


def monitor(admin: SlowList) -> Monitor:
    p = profile("short")
    return Monitor(sup=None, client=SimpleNamespace(admin=admin), profile=p,  # type: ignore[arg-type]
                   truth=None, seed=1)  # type: ignore[arg-type]


def test_an_age_is_taken_when_the_list_was_asked_not_when_it_returned():
    p = profile("short")
    bound = 1.0 + p.grace_s
    m = monitor(SlowList([txn(bound - 0.3, 1.0)], delay_s=0.6))
    listed = m.list_txns()
    assert listed is not None
    assert m.check_stuck(listed) == [], "flagged a txn younger than its bound when answered"


def test_a_txn_open_past_its_bound_when_asked_is_flagged():
    p = profile("short")
    bound = 1.0 + p.grace_s
    m = monitor(SlowList([txn(bound + 0.5, 1.0), txn(bound + 5, 1.0, TxnStatus.COMMITTED)],
                         delay_s=0.0))
    listed = m.list_txns()
    assert listed is not None
    stuck = m.check_stuck(listed)
    assert [(s.txn, s.status) for s in stuck] == [("(0,927)", "OPEN")]
    assert stuck[0].age_s >= bound


def prepared(opened_s: float, timeout_s: float, prepared_s: float, max_prepared_s: float
             ) -> SimpleNamespace:
    t = txn(opened_s, timeout_s, TxnStatus.PREPARED)
    t.prepared_at_ms = time.time() * 1000 - prepared_s * 1000
    t.max_prepared_ms = max_prepared_s * 1000
    return t


def test_a_prepared_txn_is_held_to_its_maximum_prepared_age_not_its_timeout():
    # PREPARED stops the timeout clock (issue 39): a txn opened long ago and prepared
    # within its maximum prepared age is not stuck (soak seed 36 flagged two such).
    p = profile("short")
    m = monitor(SlowList([prepared(opened_s=70.0, timeout_s=15.0, prepared_s=60.0,
                                   max_prepared_s=300.0)], delay_s=0.0))
    listed = m.list_txns()
    assert listed is not None
    assert m.check_stuck(listed) == []
    m = monitor(SlowList([prepared(opened_s=400.0, timeout_s=15.0,
                                   prepared_s=300.0 + p.grace_s + 1, max_prepared_s=300.0)],
                         delay_s=0.0))
    listed = m.list_txns()
    assert listed is not None
    stuck = m.check_stuck(listed)
    assert [(s.txn, s.status) for s in stuck] == [("(0,927)", "PREPARED")]
    assert stuck[0].timeout_s == 300.0
