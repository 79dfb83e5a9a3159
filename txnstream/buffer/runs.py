"""Runs of records: what the buffer owner's fold reads, one entry per run.

An :data:`Entry` is ``(topic, partition, first, last, headers, value, timestamp)``: the
records at offsets ``first..last`` (consecutive) of one partition, which are either all
plain (``headers`` None: no ``txn.id`` and no ``txn.marker`` header), or all carry the
same headers, byte for byte, with a ``txn.id`` and no ``txn.marker`` (one txn's records,
as its writer sends them). A record with a ``txn.marker`` header is an entry of its own,
with its ``value``; every other entry has ``value`` None. ``timestamp`` is the first
record's (-1: none).

:func:`runs_of` builds them from records in Python; ``txnstream._native`` builds the
same from librdkafka's messages (:mod:`txnstream.buffer.scan`), and
:meth:`TransactionBuffer.fold_entries <txnstream.buffer.TransactionBuffer.fold_entries>`
folds either. What the fold decides does not depend on where a run is cut: a run only
saves judging again what its first record's headers already decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from txnstream.message import TXN_ID_HEADER, TXN_MARKER_HEADER

__all__ = ["Entry", "Headers", "runs_of"]

Headers = Sequence[tuple[str, bytes | None]] | None
Entry = tuple[str, int, int, int, Headers, "bytes | None", int]
"""``(topic, partition, first, last, headers, value, timestamp)``."""


class RunRecord(Protocol):
    """What :func:`runs_of` reads of a record (a Kafka ``Message`` of one partition)."""

    def offset(self) -> int: ...
    def headers(self) -> Headers: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...


def runs_of(records: Iterable[RunRecord], topic: str, partition: int) -> list[Entry]:
    """The entries of ``records``, all of ``topic``-``partition``, in offset order."""
    out: list[Entry] = []
    run: list = []  # type: ignore[type-arg]  # the open entry, as a list
    for m in records:
        offset, headers = m.offset(), m.headers()
        txn = marker = False
        for k, _ in headers or ():
            if k == TXN_ID_HEADER:
                txn = True
            elif k == TXN_MARKER_HEADER:
                marker = True
        if run and not marker and offset == run[3] + 1 and (
                (not txn and run[4] is None) or (txn and run[4] is not None
                                                 and list(headers or ()) == run[4])):
            run[3] = offset
            continue
        if run:
            out.append(tuple(run))
        run = [topic, partition, offset, offset, list(headers or ()) if txn or marker else None,
               m.value() if marker else None, m.timestamp()[1]]
        if marker:
            out.append(tuple(run))
            run = []
    if run:
        out.append(tuple(run))
    return out
