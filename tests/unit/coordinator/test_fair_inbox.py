"""A worker's inbox: bounded by backpressure, fair among principals (issue 34 item 2).

Before, requests waited in one unbounded FIFO: one principal pipelining LIST or STATS at
thousands a second held every other principal's requests behind its own, and the stall
outlived the flood by the time its backlog took to drain.
"""

from __future__ import annotations

import threading
import time

from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.inbox import TURN_BUDGET_S, TURN_MAX_S, FairInbox
from txnstream.coordinator.transport import IoLoop, LineLimits, Listener, ServerConnection


class Conn:
    """What the inbox needs of a connection: its principal, and to hear a request taken."""

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.taken = 0

    def took(self, nbytes: int) -> None:
        self.taken += 1


def test_one_principals_backlog_does_not_hold_anothers_request_back():
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_500):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    inbox.put(b"alice", alice)  # type: ignore[arg-type]
    order = [data for data, _ in inbox.take(0)]
    assert order.index(b"alice") <= 1, "alice waited behind bob's backlog"


def test_a_turn_of_one_principals_slow_requests_ends_at_the_turns_cap():
    """Replies wait for their turn's log append: a turn must end, however much is queued."""
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    handled = []
    for data, conn in inbox.take(0):
        handled.append(data)
        if conn is bob:
            time.sleep(0.002)  # a costly request (a LIST page)
    took = time.perf_counter() - t0
    assert len(handled) < 100, "one turn handled all of bob's backlog"
    assert took < TURN_MAX_S + 0.01
    inbox.put(b"alice", alice)  # type: ignore[arg-type]
    nxt = [data for data, _ in inbox.take(0)]
    assert nxt[:2].count(b"alice") == 1, "alice waited behind bob's leftovers"
    assert bob.taken == len(handled) + sum(1 for d in nxt if d.startswith(b"bob")) == 1_000


def test_a_principal_arriving_mid_turn_is_taken_once_the_busy_one_used_its_budget():
    inbox = FairInbox(batch_max=2_000)
    bob, alice = Conn("bob"), Conn("alice")
    for i in range(1_000):
        inbox.put(b"bob-%d" % i, bob)  # type: ignore[arg-type]
    order = []
    t0 = time.perf_counter()
    for data, _conn in inbox.take(0):
        order.append((data, time.perf_counter() - t0))
        if len(order) == 1:
            inbox.put(b"alice", alice)  # type: ignore[arg-type]
        time.sleep(0.001)
    names = [d for d, _ in order]
    assert b"alice" in names, "alice's request waited for the next turn"
    # taken as soon as bob's handling passed its budget (the first request at or past it)
    over = next(i for i, (_, t) in enumerate(order) if t >= TURN_BUDGET_S)
    assert names.index(b"alice") <= over + 1, (names.index(b"alice"), over)


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
