"""``send_batch``'s native send without a broker: the extension, its tallies, and the
bookkeeping Python makes of them.

The native handle here points at a port nobody listens on, so its records are reported
failed once ``message.timeout.ms`` passes: what a tally says of failures, of a full queue
and of values it refuses is checked on the real C side. What Python makes of a tally's
reports (:meth:`TxnSends.outstanding`) is checked against what the Python delivery
callback makes of the same reports, on generated reports (hypothesis).
``tests/integration/producer/test_native_send.py`` compares the two paths on a real broker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from array import array
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.errors import TransactionOutcomeUnknownError
from txnstream.fate import DeliveredOffsets
from txnstream.kafka.native_send import NativeSender, librdkafka_settings, native_send
from txnstream.send_paths import TxnSends
from txnstream.types import TxnID

NATIVE = native_send()
TXN = TxnID(1, 7)

# Only TXNSTREAM_NATIVE=0 (the pure-Python path on purpose) skips the C side: a build
# that failed must fail these tests, not skip them.
needs_native = pytest.mark.skipif(os.environ.get("TXNSTREAM_NATIVE") == "0",
                                  reason="TXNSTREAM_NATIVE=0: the pure-Python path only")


def test_the_native_send_is_built_and_loads():
    if os.environ.get("TXNSTREAM_NATIVE") != "0":
        assert NATIVE is not None, "txnstream._native_send did not build or load (logged why)"


def test_settings_render_as_confluent_kafka_renders_them():
    out = librdkafka_settings({"bootstrap.servers": "h:1", "enable.idempotence": True,
                               "linger.ms": 5, "acks": "all", "x": 0.5,
                               "logger": logging.getLogger("x")})
    assert out == [("bootstrap.servers", "h:1"), ("enable.idempotence", "true"),
                   ("linger.ms", "5"), ("acks", "all"), ("x", "0.5")]
    assert librdkafka_settings({"a": "b", "error_cb": print}) == "error_cb"


def test_no_native_handle_beside_a_fake_or_with_a_callback():
    assert NativeSender.for_producer(object(), {"bootstrap.servers": "h:1"}, "t") is None
    kafka = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:1"})
    assert NativeSender.for_producer(kafka, {"bootstrap.servers": "127.0.0.1:1",
                                             "stats_cb": print}, "t") is None


def _nobody_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def sender() -> Any:
    where = _nobody_listens()
    kafka = confluent_kafka.Producer({"bootstrap.servers": where})
    ns = NativeSender.for_producer(kafka, {
        "bootstrap.servers": where, "enable.idempotence": True, "message.timeout.ms": 300,
        "queue.buffering.max.messages": 4, "log_level": 0}, "orders")
    assert ns is not None
    try:
        yield ns
    finally:
        ns.close(0)


HEADERS = {0: [("txn.id", b"\x00\x01")], 2: [("txn.id", b"\x00\x01"), ("h", None)]}


@needs_native
def test_records_that_time_out_are_reported_failed_naming_the_partition(sender):
    tally = sender.tally()
    assert sender.produce(tally, [b"a", None, b"c"], [b"k", None, None], [2, 0, 2],
                          HEADERS, 0) == (3, 0)
    assert tally.outstanding == 3
    deadline = time.monotonic() + 10
    while tally.outstanding and time.monotonic() < deadline:
        time.sleep(0.05)
    acked, offsets, unknown, error = tally.take()
    assert (acked, offsets, unknown) == (3, None, None)
    assert error == (KafkaError._MSG_TIMED_OUT, 2)  # the first failed record's partition
    assert tally.take() == (0, None, None, None)  # an error is taken once


@needs_native
def test_a_full_queue_returns_to_python_with_what_was_handed(sender):
    tally = sender.tally()
    t0 = time.monotonic()
    nxt, err = sender.produce(tally, [b"v"] * 10, None, [0] * 10, HEADERS, 0)
    assert (nxt, err) == (4, 0) and tally.outstanding == 4
    assert time.monotonic() - t0 < 5


@needs_native
def test_a_value_that_is_not_bytes_hands_nothing(sender):
    tally = sender.tally()
    with pytest.raises(TypeError, match=r"values\[1\] is bytes or None, not str"):
        sender.produce(tally, [b"a", "b"], None, [0, 0], HEADERS, 0)
    with pytest.raises(ValueError, match="has no headers"):
        sender.produce(tally, [b"a"], None, [1], HEADERS, 0)
    assert tally.outstanding == 0 and sender.flush(1) == 0  # (flush: an error event waits)


@needs_native
def test_tallies_dropped_or_closed_with_records_in_flight_leave_nothing_behind(sender):
    import threading

    dropped = sender.tally()
    assert sender.produce(dropped, [b"a", b"b"], None, [0, 0], HEADERS, 0) == (2, 0)
    del dropped  # its counts live on until its records are reported (then freed in C)
    kept = sender.tally()
    done = threading.Event()

    def produce_while_closing() -> None:
        try:
            sender.produce(kept, [b"c"] * 10, None, [0] * 10, HEADERS, 0)
        except RuntimeError:
            pass  # closed before it began
        done.set()

    t = threading.Thread(target=produce_while_closing)
    t.start()
    sender.close(0)  # waits for a produce() using the handle; destroys it with records
    t.join(10)
    assert done.is_set()
    with pytest.raises(RuntimeError, match="closed"):
        sender.produce(kept, [b"d"], None, [0], HEADERS, 0)
    assert sender.pending() == 0


class FakeTally:
    """A tally whose reports a test gives, as the C one gathers them."""

    def __init__(self) -> None:
        self.acked = 0
        self.offsets: dict[int, list[int]] = {}
        self.unknown: dict[int, int] = {}
        self.error: tuple[int, int] | None = None
        self.error_taken = False

    def report(self, part: int, what: int | None | KafkaError) -> None:
        self.acked += 1
        if isinstance(what, KafkaError):
            self.error = self.error or (what.code(), part)
        elif what is None:
            self.unknown[part] = self.unknown.get(part, 0) + 1
        else:
            self.offsets.setdefault(part, []).append(what)

    @property
    def outstanding(self) -> int:
        return 0

    def take(self) -> tuple[int, Any, Any, Any]:
        out = (self.acked, {p: array("q", o).tobytes() for p, o in self.offsets.items()}
               or None, self.unknown or None,
               None if self.error_taken else self.error)
        self.error_taken |= self.error is not None
        self.acked, self.offsets, self.unknown = 0, {}, {}
        return out


class Report:
    def __init__(self, partition: int, offset: int | None) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int | None:
        return self._o


class Txn:
    def __init__(self) -> None:
        self.id, self.key = TXN, None
        self.delivered = DeliveredOffsets()
        self.abort_only: list[str] = []

    def mark_abort_only(self, exc: Exception) -> None:
        self.abort_only.append(str(exc))


reports = st.lists(st.tuples(
    st.integers(0, 3),
    st.one_of(st.integers(0, 10**9), st.none(),
              st.sampled_from([KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
                               KafkaError(KafkaError._MSG_TIMED_OUT)]))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(reports, st.lists(st.integers(1, 60), max_size=4))
def test_native_reports_make_what_the_python_callback_makes(given_reports, takes):
    """Same reports, one by one through the Python callback or taken from a tally at any
    points: the same outstanding count, offsets, unknown records and abort-only error."""
    py_txn, nat_txn = Txn(), Txn()
    py, nat = TxnSends("orders", py_txn), TxnSends("orders", nat_txn)  # type: ignore[arg-type]
    tally = FakeTally()
    nat.tally = tally
    for p in range(4):
        py.headers_at(p)
        nat.headers_at(p)
    py.sent = nat.sent = len(given_reports)
    cuts = {sum(takes[:i + 1]) for i in range(len(takes))}
    for i, (part, what) in enumerate(given_reports):
        err = what if isinstance(what, KafkaError) else None
        py.delivered(err, Report(part, None if err else what))  # type: ignore[arg-type]
        tally.report(part, what)
        if i in cuts:
            nat.outstanding()
    assert py.outstanding() == nat.outstanding() == 0
    assert py_txn.abort_only[:1] == nat_txn.abort_only[:1]  # the first one is the cause
    assert all("send to orders-" in m for m in nat_txn.abort_only)
    try:
        want: Any = py_txn.delivered.snapshot(TXN)
    except TransactionOutcomeUnknownError as exc:
        with pytest.raises(TransactionOutcomeUnknownError) as got:
            nat_txn.delivered.snapshot(TXN)
        assert str(got.value) == str(exc)
    else:
        assert nat_txn.delivered.snapshot(TXN) == want
