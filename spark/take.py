"""The Spark source task's committed-only filter for the common record shapes, fast.

A task appends each deliverable record of its range to its columns
(:class:`~txnstream_spark.schema.RowColumns`). Most records have one of two shapes: no
headers (plain), or exactly a ``txn.id`` (and its ``txn.tag``) header (a txn's record).
:func:`take_rows` takes a run of those and stops at the first record of another shape
(an error, user headers, a marker, a txn record in a range planned plain, a ``txn.id``
not yet named), which the task's full rule (``_Rows.add``) takes, one by one. It is
``txnstream._native.take_rows`` where that is built (calling the Messages' methods from
C), else :func:`_take_rows`, its Python twin; tests/unit/test_take_rows.py checks they
agree on generated batches.

The rule, per record from index ``i``:

1. an error: stop (the full rule logs it);
2. at or past ``end``: stop, ended (the position is ``end``);
3. in ``skip`` (a marker or a hidden offset): skipped;
4. no headers: delivered, plain (user headers ``[]``, txn id None);
5. ``txn.id`` (with ``txn.tag`` second, or alone): in a range planned ``plain``, stop;
   in its aborted span (``spans``), skipped; its name not in ``names``, stop; named
   None (it does not parse), skipped; else delivered under that name;
6. any other headers: stop.

Every record taken (delivered or skipped) moves the position past it.

A task reads natively where it can (:func:`task_scan`): ``Scan.take`` in
``txnstream/_native.c`` applies the rule to librdkafka's messages as it takes them off
the task consumer's queue, so a record of the common shapes never becomes a
confluent-kafka Message (whose header list alone cost a task 1-2 µs a record, more than
the rest of its filter); every other record comes to the task's full rule as a
:class:`ScannedRecord`, in its turn. A delivered
record's headers column is one shared empty list, never changed: a new one per row made
the cyclic GC walk every one of them (1.45 against 0.45 µs a record in C).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError

from txnstream.kafka.librdkafka import native_librdkafka
from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER
from txnstream.native import native

__all__ = ["Columns", "ScannedRecord", "scan_to", "take_rows", "task_scan", "task_scan_loads"]

log = logging.getLogger(__name__)

NO_HEADERS: list[Any] = []
"""The headers of every row taken here (never appended to)."""

Columns = tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]
"""keys, values, offsets, timestamps, timestamp types, headers, txn ids."""


def _take_rows(batch: Sequence[Any], i: int, pos: int, end: int, skip: set[int],
               spans: Mapping[bytes, tuple[int, int]] | None,
               names: Mapping[bytes, str | None], plain: bool, cols: Columns
               ) -> tuple[int, int, bool]:
    """The module's rule in Python; returns ``(i, pos, ended)`` as the C one does."""
    keys, values, offsets, stamps, kinds, headers, txn_ids = (c.append for c in cols)
    n = len(batch)
    while i < n:
        m = batch[i]
        if m.error() is not None:
            break
        off = m.offset()
        if off >= end:
            return i, end, True
        if off in skip:
            pos = off + 1
            i += 1
            continue
        h = m.headers()
        txn = None
        if h:
            if plain or not (len(h) <= 2 and h[0][0] == TXN_ID_HEADER and (
                    len(h) == 1 or h[1][0] == TXN_TAG_HEADER)):
                break
            raw = h[0][1]
            span = spans.get(raw) if spans else None
            if span is not None and span[0] <= off <= span[1]:
                pos = off + 1
                i += 1
                continue  # a record of an aborted txn
            if raw not in names:
                break
            txn = names[raw]
            if txn is None:
                pos = off + 1
                i += 1
                continue  # an undecodable txn.id is never delivered
        pos = off + 1
        i += 1
        keys(m.key())
        values(m.value())
        offsets(off)
        kind, stamp = m.timestamp()
        stamps(stamp)
        kinds(kind)
        headers(NO_HEADERS)
        txn_ids(txn)
    return i, pos, False


TakeRows = Callable[[Sequence[Any], int, int, int, set[int],
                     Mapping[bytes, tuple[int, int]] | None, Mapping[bytes, str | None],
                     bool, Columns], tuple[int, int, bool]]

take_rows: TakeRows = getattr(native(), "take_rows", _take_rows)
"""The rule above, in C where ``txnstream._native`` is built."""


class ScannedRecord:
    """A record the native take leaves to the task's full rule, with a Message's methods.

    Made from the tuple ``Scan.take`` hands over: ``(offset, key, value, headers,
    timestamp type, timestamp, error code, error text)``; an error code 0 is no error.
    """

    __slots__ = ("_partition", "_t", "_topic")

    def __init__(self, t: tuple[Any, ...], topic: str, partition: int) -> None:
        self._t, self._topic, self._partition = t, topic, partition

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def error(self) -> KafkaError | None:
        return KafkaError(self._t[6], self._t[7]) if self._t[6] else None

    def offset(self) -> int:
        return int(self._t[0])

    def key(self) -> bytes | None:
        return self._t[1]  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self._t[2]  # type: ignore[no-any-return]

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._t[3]  # type: ignore[no-any-return]

    def timestamp(self) -> tuple[int, int]:
        return self._t[4], self._t[5]


def task_scan_loads() -> bool:
    """Whether :func:`task_scan` can give a scan (the native module loads, with ``take``)."""
    mod = native_librdkafka()
    return mod is not None and hasattr(mod.Scan, "take")


def task_scan(consumer: Consumer) -> Any:
    """A native scan of ``consumer`` that can ``take`` (attach before assigning), or None."""
    mod = native_librdkafka()
    if mod is None or not task_scan_loads():
        return None
    try:
        return mod.Scan(consumer, "")
    except (TypeError, ValueError, RuntimeError) as exc:
        log.warning("the source task's native read refuses its consumer (%s): reading "
                    "through confluent-kafka", exc)
        return None


def scan_to(end: int, pos: int, timeout_s: float, take: Callable[[int], tuple[int, int, bool]],
            what: str) -> Iterator[int]:
    """Call ``take(pos)`` until the range ``what`` ends; yields the position after each call.

    The take ends the range itself: at a record at or past ``end``, at the last record
    below it, or at librdkafka's end-of-partition event (a range ending in control
    records, which no read is given). ``TimeoutError`` when ``timeout_s`` passes with
    nothing taken.
    """
    deadline = time.monotonic() + timeout_s
    while pos < end:
        seen, pos, ended = take(pos)
        yield pos
        if ended:
            return
        if seen:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise TimeoutError(f"{what}: no record between {pos} and {end} "
                               f"within {timeout_s:g} s")
