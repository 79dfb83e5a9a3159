"""``Origins``: where a slow request's time went, and the bound on requests remembered."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from txnstream.coordinator import origins as origins_mod
from txnstream.coordinator.origins import SWEEP_AT, Origins
from txnstream.coordinator.protocol import TcOp, TcRequest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(origins_mod.time, "monotonic", c)
    return c


def _conn() -> SimpleNamespace:
    return SimpleNamespace(principal="honest", peer="127.0.0.1:5555", inflight=0)


def _req(rid: str, deadline_ms: int = 2**62, tc_id: int = 3) -> TcRequest:
    return TcRequest(rid, "client-1", -1, TcOp.END, tc_id, deadline_ms, txn_seq=2838)


def _slow_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == origins_mod.__name__]


def test_a_slow_request_answered_in_its_turn_says_where_its_time_went(clock, caplog):
    o = Origins("w-1")
    arrived = clock.now
    clock.now += 1.5  # waited for a turn behind others
    o.turn_started()
    o.add(_req("r1"), _conn(), arrived)
    for name, dt in (("handled", 0.01), ("appended", 0.2), ("read back", 0.3),
                     ("registered", 0.0)):
        clock.now += dt
        o.stage(name)
    clock.now += 0.004
    with caplog.at_level(logging.WARNING, logger=origins_mod.__name__):
        assert o.pop("r1") is not None
    [line] = _slow_lines(caplog)
    assert "END to tc 3 (txn seq 2838) from principal 'honest'" in line
    assert "answered 2.014 s after it arrived" in line
    assert ("1.500 s waiting for a turn, 0.010 s to handled, 0.200 s to appended, "
            "0.300 s to read back, 0.000 s to registered, 0.004 s to answer") in line
    assert len(o) == 0


def test_a_request_answered_after_its_turn_says_so(clock, caplog):
    o = Origins("w-1")
    o.turn_started()
    o.add(_req("r1"), _conn(), clock.now)
    clock.now += 2.0
    o.turn_started()  # a later turn (or the finalizer) answers it
    with caplog.at_level(logging.WARNING, logger=origins_mod.__name__):
        o.pop("r1")
    [line] = _slow_lines(caplog)
    assert "0.000 s waiting for a turn, answered 2.000 s after it was taken, outside " \
           "that turn" in line


def test_a_request_answered_in_time_is_not_logged(clock, caplog):
    o = Origins("w-1")
    o.turn_started()
    o.add(_req("r1"), _conn(), clock.now)
    clock.now += 0.999
    with caplog.at_level(logging.DEBUG, logger=origins_mod.__name__):
        assert o.pop("r1") is not None
        assert o.pop("r1") is None  # answered once
    assert _slow_lines(caplog) == []


def test_slow_lines_of_one_op_are_rate_limited(clock, caplog):
    o = Origins("w-1")
    with caplog.at_level(logging.WARNING, logger=origins_mod.__name__):
        for i in range(50):
            o.turn_started()
            o.add(_req(f"r{i}"), _conn(), clock.now)
            clock.now += 2.0
            o.pop(f"r{i}")
        o.add(_req("other-tc", tc_id=2), _conn(), clock.now)
        clock.now += 2.0
        o.pop("other-tc")
    assert len(_slow_lines(caplog)) == 2, \
        "one line per op, TC and principal per 10 s (of the real clock)"


def test_requests_past_their_deadline_are_swept_once_many_wait(clock):
    o = Origins("w-1")
    conn = _conn()
    for i in range(SWEEP_AT):
        o.add(_req(f"gone-{i}", deadline_ms=999), conn, clock.now)
        conn.inflight += 1
    for i in range(10):
        o.add(_req(f"wait-{i}"), conn, clock.now)
        conn.inflight += 1
    o.sweep(1_000)
    assert len(o) == 10 and conn.inflight == 10
    assert o.get("wait-0") is not None and o.get("gone-0") is None
