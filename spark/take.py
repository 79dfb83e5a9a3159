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

Every record taken (delivered or skipped) moves the position past it. A delivered
record's headers column is one shared empty list, never changed: a new one per row made
the cyclic GC walk every one of them (1.45 against 0.45 µs a record in C).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER
from txnstream.native import native

__all__ = ["Columns", "take_rows"]

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
