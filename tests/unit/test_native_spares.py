"""The native handles a client makes ahead (``NativeSpares``), without a broker.

A fresh idempotent librdkafka handle delivers nothing for about half a second (its
producer id); a client that made one keeps one more made, unbound, for its next
producer's first batch. Checked here: the C side's unbound handle and ``bind``; that a
producer's handle comes from the spares and a new one is made for the next; the bound
(one per settings, ``MAX_SPARE_KINDS`` settings, the oldest closed first); and that a
closed client's spares are closed and none is made after. On a real broker:
``tests/integration/producer/test_native_send.py``.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import confluent_kafka
import pytest

from txnstream.kafka.native_send import (
    MAX_SPARE_KINDS,
    NativeSender,
    NativeSpares,
    librdkafka_settings,
    native_send,
)

needs_native = pytest.mark.skipif(os.environ.get("TXNSTREAM_NATIVE") == "0",
                                  reason="TXNSTREAM_NATIVE=0: the pure-Python path only")


def _nobody_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def settings(**extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": WHERE, "enable.idempotence": True, "log_level": 0, **extra}


WHERE = _nobody_listens()


class FakeSender:
    """Stands for a NativeSender in the bookkeeping tests."""

    def __init__(self, bind_fails: bool = False) -> None:
        self.topic: str | None = None
        self.closed = False
        self.bind_fails = bind_fails

    def bind(self, topic: str) -> None:
        if self.bind_fails:
            raise RuntimeError("the native producer is closed")
        self.topic = topic

    def close(self, timeout_s: float) -> int:
        self.closed = True
        return 0


@needs_native
def test_an_unbound_sender_refuses_records_until_bound_and_binds_once():
    mod = native_send()
    assert mod is not None
    s = mod.Sender(librdkafka_settings(settings()), None)
    try:
        with pytest.raises(RuntimeError, match="bind"):
            s.produce(s.tally(), [b"v"], None, [0], {0: []}, 0, 10)
        with pytest.raises(RuntimeError, match="bind"):
            s.partitions(10)
        s.bind("orders")
        assert s.produce(s.tally(), [b"v"], None, [0], {0: []}, 0, 10) == (1, 0)
        with pytest.raises(RuntimeError, match="has its topic"):
            s.bind("other")
    finally:
        s.close(0)
    with pytest.raises(RuntimeError, match="closed"):
        s.bind("orders")


@needs_native
def test_a_producers_handle_comes_from_the_spares_and_one_more_is_made():
    spares = NativeSpares()
    kafka = confluent_kafka.Producer({"bootstrap.servers": WHERE})
    try:
        first = NativeSender.for_producer(kafka, settings(), "a", spares)
        assert first is not None and len(spares) == 1  # made for the next producer
        spare = next(iter(spares._spares.values()))
        second = NativeSender.for_producer(kafka, settings(), "b", spares)
        assert second is spare, "the second producer did not take the spare made ahead"
        assert len(spares) == 1 and next(iter(spares._spares.values())) is not spare
        other = NativeSender.for_producer(kafka, settings(**{"linger.ms": 50}), "c", spares)
        assert other is not None and len(spares) == 2  # other settings: a spare of theirs
        for s in (first, second, other):
            s.close(0)
    finally:
        spares.close()
    assert len(spares) == 0


def test_one_spare_per_settings_and_at_most_max_kinds_the_oldest_closed():
    spares = NativeSpares()
    made: list[FakeSender] = []

    def make() -> Any:
        made.append(FakeSender())
        return made[-1]

    spares.refill((("k", "0"),), make)
    spares.refill((("k", "0"),), make)  # one there already: none made
    assert len(made) == 1
    for i in range(1, MAX_SPARE_KINDS + 3):
        spares.refill((("k", str(i)),), make)
    assert len(spares) == MAX_SPARE_KINDS
    closed = [m for m in made if m.closed]
    assert closed == made[:3], "the oldest spares are the ones closed"
    got = spares.take((("k", str(MAX_SPARE_KINDS + 2)),), "orders")
    assert got is made[-1] and got.topic == "orders" and len(spares) == MAX_SPARE_KINDS - 1
    assert spares.take((("k", "0"),), "orders") is None  # closed as the oldest


def test_a_spare_that_will_not_bind_is_closed_and_none_is_given():
    spares = NativeSpares()
    bad = FakeSender(bind_fails=True)
    spares.refill((("k", "v"),), lambda: bad)
    assert spares.take((("k", "v"),), "orders") is None
    assert bad.closed and len(spares) == 0


def test_closed_spares_close_what_they_hold_and_make_nothing_after():
    spares = NativeSpares()
    held = FakeSender()
    spares.refill((("k", "v"),), lambda: held)
    spares.close()
    assert held.closed and len(spares) == 0
    spares.refill((("k", "v"),), FakeSender)
    assert len(spares) == 0
