"""The TxnIdPool's lease contract, with a recording coordinator stand-in and a fake clock.

What must hold (see ``TxnIdPool``): a TxnID is handed out only inside its block's
hand-out window; the lease the pool asks for leaves every handed-out TxnID's ACTIVATE its
whole request deadline plus the clock slack; the ACTIVATE's deadline runs from the
hand-out, however long it waits for a pipeline thread. And the store names a lease that
ran out as such, not as the timeout the user chose.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.coordinator.test_store_rules import Log, owner
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.txn_ids import HAND_OUT_WINDOW_S, LEASE_CLOCK_SLACK_S, TxnIdPool
from txnstream.errors import RequestTimeoutError, TransactionTimeoutError

R = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """Records requests; a RESERVE takes ``reserve_takes_s`` on the fake clock."""

    def __init__(self, clock: Clock, request_timeout_s: float = R) -> None:
        self.config = SimpleNamespace(request_timeout_s=request_timeout_s)
        self.client_id = "c-test"
        self.clock = clock
        self.requests: list[tuple[TcOp, float, dict[str, Any], float | None]] = []
        self.reserve_takes_s = 0.0
        self.next_seq = 0

    def pick_coordinator(self) -> int:
        return 0

    def request(self, op: TcOp, tc_id: int, *, timeout_s: float | None = None,
                **fields: Any) -> Any:
        self.requests.append((op, self.clock.now, fields, timeout_s))
        if op is TcOp.RESERVE:
            self.clock.now += self.reserve_takes_s
            seqs = tuple(range(self.next_seq, self.next_seq + fields["count"]))
            self.next_seq += fields["count"]
            return SimpleNamespace(group_seqs=seqs, txn_keys=())
        return SimpleNamespace()


def pool_of(request_timeout_s: float = R) -> tuple[TxnIdPool, StandIn, Clock]:
    clock = Clock()
    tc = StandIn(clock, request_timeout_s)
    return TxnIdPool(tc, clock=clock), tc, clock  # type: ignore[arg-type]


def test_every_txnid_is_handed_out_with_its_activation_deadline_and_slack_left():
    pool, tc, clock = pool_of()
    leases: dict[int, float] = {}  # seq -> when its block's lease ends (client clock)
    for step in range(400):
        clock.now += 0.37 if step % 50 else 9.0  # bursts and pauses
        before = len(tc.requests)
        _, seq, _ = pool.take()
        for op, sent, fields, _ in tc.requests[before:]:
            assert op is TcOp.RESERVE
            lease_s = fields["timeout_ms"] / 1000
            assert lease_s == HAND_OUT_WINDOW_S + R + LEASE_CLOCK_SLACK_S
            for s in range(tc.next_seq - fields["count"], tc.next_seq):
                leases[s] = sent + lease_s
        left = leases[seq] - clock.now
        assert left >= R + LEASE_CLOCK_SLACK_S, (
            f"TxnID {seq} handed out with {left:.1f} s of lease left: its ACTIVATE "
            f"(retried for {R:.0f} s) could land after the lease")


def test_the_lease_follows_the_request_deadline():
    pool, tc, _ = pool_of(request_timeout_s=90.0)
    pool.take()
    assert tc.requests[0][2]["timeout_ms"] == int(
        (HAND_OUT_WINDOW_S + 90.0 + LEASE_CLOCK_SLACK_S) * 1000)


def test_a_block_granted_after_its_window_is_not_handed_out():
    pool, tc, clock = pool_of()
    tc.reserve_takes_s = HAND_OUT_WINDOW_S + 1  # a RESERVE that waited out a failover
    with pytest.raises(RequestTimeoutError):
        pool.take()
    assert all(op is TcOp.RESERVE for op, *_ in tc.requests) and len(tc.requests) >= 2
    tc.reserve_takes_s = 0.5
    _, seq, _ = pool.take()
    sent = tc.requests[-1][1]
    assert seq >= tc.next_seq - 4 and clock.now < sent + HAND_OUT_WINDOW_S


def test_an_activation_deadline_runs_from_its_hand_out():
    pool, tc, clock = pool_of()
    tc_id, seq, _ = pool.take()
    activate = pool.activation(tc_id, seq, 60_000)
    clock.now += 12.0  # waited for a pipeline thread
    activate()
    op, _, fields, timeout_s = tc.requests[-1]
    assert op is TcOp.ACTIVATE and fields["timeout_ms"] == 60_000
    assert timeout_s == pytest.approx(R - 12.0)
    late = pool.activation(tc_id, seq + 1, 60_000)
    clock.now += R
    sent = len(tc.requests)
    with pytest.raises(RequestTimeoutError):
        late()
    assert len(tc.requests) == sent, "an ACTIVATE past its deadline is not sent"


def test_a_lease_that_ran_out_is_named_as_a_lease_not_as_the_users_timeout():
    s = owner(Log())
    lease = int((HAND_OUT_WINDOW_S + R + LEASE_CLOCK_SLACK_S) * 1000)
    [seq] = s.reserve("r1", 1, lease, now_ms=0)
    s.expire(lease)
    with pytest.raises(TransactionTimeoutError, match="reserved with a lease of 42000 ms"):
        s.activate(seq, 60_000, open_time_ms=lease - 1, now_ms=lease + 1)
    [other] = s.reserve("r2", 1, lease, now_ms=0)
    with pytest.raises(TransactionTimeoutError, match="lease"):
        s.activate(other, 60_000, open_time_ms=lease - 1, now_ms=lease)
