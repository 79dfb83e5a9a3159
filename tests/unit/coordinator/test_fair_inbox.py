"""A worker's inbox: bounded by backpressure, fair among principals (issue 34 item 2).

Before, requests waited in one unbounded FIFO: one principal pipelining LIST or STATS at
thousands a second held every other principal's requests behind its own, and the stall
outlived the flood by the time its backlog took to drain.
"""

from __future__ import annotations

import threading
import time

import pytest

from txnstream.coordinator import inbox as inbox_module
from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.inbox import SWEEP_AT, TURN_BUDGET_S, TURN_MAX_S, FairInbox, ReadQuota
from txnstream.coordinator.transport import IoLoop, LineLimits, Listener, ServerConnection


class Conn:
    """What the inbox needs of a connection: its principal, and to hear a request taken."""

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.taken = 0

    def took(self, nbytes: int) -> None:
        self.taken += 1


class Clock:
    """The inbox's ``time.perf_counter``, moved by the test: handling costs what it says,
    whatever the machine's load (a loaded run's sleeps overshoot by milliseconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(inbox_module, "time", c)
    return c


def test_one_principals_backlog_does_not_hold_anothers_request_back():
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_500):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    inbox.put(b"alice", alice)  # type: ignore[arg-type]
    order = [data for data, _ in inbox.take(0)]
    assert order.index(b"alice") <= 1, "alice waited behind bob's backlog"


def test_a_turn_of_one_principals_slow_requests_ends_at_the_turns_cap(clock):
    """Replies wait for their turn's log append: a turn must end, however much is queued."""
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    handled = []
    for data, _conn in inbox.take(0):
        handled.append(data)
        clock.now += 0.002  # a costly request (a LIST page)
    assert len(handled) == round(TURN_MAX_S / 0.002), "the turn did not end at its cap"
    inbox.put(b"alice", alice)  # type: ignore[arg-type]
    nxt = [data for data, _ in inbox.take(0)]
    assert nxt[:2].count(b"alice") == 1, "alice waited behind bob's leftovers"
    assert bob.taken == len(handled) + sum(1 for d in nxt if d.startswith(b"bob")) == 1_000


def test_a_principal_arriving_mid_turn_is_taken_once_the_busy_one_used_its_budget(clock):
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    names = []
    for data, _conn in inbox.take(0):
        names.append(data)
        if len(names) == 1:
            inbox.put(b"alice", alice)  # type: ignore[arg-type]
        clock.now += 0.001
    assert b"alice" in names, "alice's request waited for the next turn"
    # taken right after bob's handling reached its budget, not at the turn's end
    assert names.index(b"alice") == round(TURN_BUDGET_S / 0.001), names[:12]


def test_a_connection_is_not_read_past_its_queued_requests_until_the_worker_takes():
    """Backpressure (Kafka's queued.max.requests, per connection): the listener stops
    reading a connection with max_queued requests waiting, and reads on once one is
    taken; nothing is lost."""
    got: list[tuple[bytes, ServerConnection]] = []
    arrived = threading.Condition()

    def on_request(data: bytes, conn: ServerConnection) -> None:
        with arrived:
            got.append((data, conn))
            arrived.notify_all()

    lst = Listener("127.0.0.1", 0, on_request, limits=LineLimits(max_queued=8))
    io = IoLoop("test-backpressure")
    try:
        client = ClientConnection.open(io, lst.address, None, None, lambda _r: None,
                                       lambda _c: None, 5)
        for i in range(100):
            client.send(b"request-%d" % i)
        time.sleep(1.0)
        with arrived:
            assert len(got) == 8, f"{len(got)} requests read with 8 waiting allowed"
        for n in range(8, 100):
            with arrived:
                data, conn = got[n - 8]
            conn.took(len(data))
            with arrived:
                assert arrived.wait_for(lambda n=n: len(got) > n, 5), f"stuck at {n}"
        time.sleep(0.3)
        assert [d for d, _ in got] == [b"request-%d" % i for i in range(100)]
        client.close()
        client.closed.wait(5)
    finally:
        io.close()
        lst.close()


SHARE, BURST_S = 0.05, 0.25


def _reads(inbox: FairInbox, clock: Clock, cost_s: float) -> list[bytes]:
    """One turn in which every request taken is a read costing ``cost_s``."""
    out = []
    for data, _conn in inbox.take(0):
        inbox.read()
        clock.now += cost_s
        out.append(data)
    return out


def test_a_principals_reads_past_its_quota_wait_while_anothers_requests_are_taken(clock):
    """Old (950340a): fairness only; a principal pipelining LISTs had every idle moment of
    the worker (a quarter of a core per worker in the hostile flood, seed 54)."""
    inbox = FairInbox(batch_max=2_000, reads=ReadQuota(SHARE, BURST_S))
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    taken = []
    for _ in range(20):  # 20 turns of 2 ms LIST pages: 10 ms of reads a turn at most
        taken += _reads(inbox, clock, 0.002)
    # the burst (0.25 s) and what refilled while it was spent (5% of it), then nothing:
    # the clock moves only by the handling, and the last page taken put bob in debt
    burst_pages = BURST_S / (0.002 * (1 - SHARE))
    assert burst_pages <= len(taken) <= burst_pages + 1, len(taken)
    inbox.put(b"alice", alice)  # type: ignore[arg-type]
    assert [d for d, _ in inbox.take(0)] == [b"alice"], "alice waited behind bob's debt"
    clock.now += 1.0  # a second: 50 ms of credit back, and bob's debt of one page paid
    more = _reads(inbox, clock, 0.002)
    assert 0 < len(more) <= round(SHARE / 0.002) + 1, len(more)
    assert bob.taken == len(taken) + len(more), "a throttled request was taken"


def test_requests_that_are_not_reads_are_never_throttled(clock):
    inbox = FairInbox(batch_max=2_000, reads=ReadQuota(SHARE, BURST_S))
    bob = Conn("bob")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    n = 0
    for _ in range(100):
        for _data, _conn in inbox.take(0):
            clock.now += 0.002  # commits: not reads
            n += 1
    assert n == 1_000


def test_exempt_principals_are_not_throttled(clock):
    inbox = FairInbox(batch_max=2_000, reads=ReadQuota(SHARE, BURST_S,
                                                       lambda p: p == "admin"))
    admin = Conn("admin")
    for i in range(1_000):
        inbox.put(b"a-%d" % i, admin)  # type: ignore[arg-type]
    n = sum(len(_reads(inbox, clock, 0.002)) for _ in range(100))
    assert n == 1_000 and inbox.reads is not None and inbox.reads.tracked() == 0


def test_a_take_with_only_throttled_principals_waits_for_the_first_release_not_spins(clock):
    inbox = FairInbox(batch_max=2_000, reads=ReadQuota(SHARE, 0.001))
    bob = Conn("bob")
    inbox.put(b"bob-0", bob)  # type: ignore[arg-type]
    inbox.put(b"bob-1", bob)  # type: ignore[arg-type]
    assert _reads(inbox, clock, 0.0035) == [b"bob-0"]  # 2.5 ms in debt: 50 ms to repay
    t0 = time.monotonic()
    assert list(inbox.take(1.0)) == []  # the clock stands still: nothing released
    waited = time.monotonic() - t0
    assert 0.04 <= waited < 0.9, f"take() returned after {waited:.3f} s: it should wait " \
        "until the throttled principal's release (50 ms), neither spin nor its full timeout"
    clock.now += 0.05
    assert [d for d, _ in inbox.take(0)] == [b"bob-1"]


def test_the_quotas_memory_of_principals_is_bounded(clock):
    quota = ReadQuota(SHARE, BURST_S)
    for i in range(SWEEP_AT * 5):  # a read each by ever new principals, a ms apart
        clock.now += 0.001
        quota.charge(f"p{i}", 0.001, clock.now)
    # remembered: at most SWEEP_AT plus those whose credit has not refilled (20 ms at 5%)
    assert quota.tracked() <= SWEEP_AT + round(0.001 / SHARE / 0.001) + 1, quota.tracked()


def test_a_read_quota_refuses_a_share_or_burst_out_of_range():
    for share, burst in ((0.0, 1.0), (1.5, 1.0), (0.1, 0.0), (float("nan"), 1.0),
                         (0.1, float("nan")), (0.1, float("inf"))):
        with pytest.raises(ValueError, match="read quota"):
            ReadQuota(share, burst)

