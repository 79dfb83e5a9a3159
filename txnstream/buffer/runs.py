"""Runs of records: what the buffer owner's fold reads, one entry per run.

An :data:`Entry` is ``(topic, partition, first, last, headers, value, timestamp)``: the
records at offsets ``first..last`` (consecutive) of one partition, which are one of:

- all plain without a delay header (``headers`` None): no ``txn.id``, no ``txn.marker``,
  no ``txn.deliver.at`` and no ``txn.deliver.after`` header (other headers, the user's,
  may be there: the entry does not keep them);
- all plain with a delay header (``txn.deliver.at`` or ``txn.deliver.after``, no
  ``txn.id`` and no ``txn.marker``), the same headers, byte for byte, in the same
  order (``headers`` their list), and the same timestamp (a plain record's due time may
  count from it: :mod:`txnstream.buffer.delays`);
- all txn records with the same headers, byte for byte: a ``txn.id`` and no
  ``txn.marker`` (one txn's records, as its writer sends them; a delay header among them
  changes nothing);
- a single record with a ``txn.marker`` header, with its ``value``.

Every entry but a marker's has ``value`` None. ``timestamp`` is the first record's (-1:
none).

:func:`runs_of` builds them from records in Python; ``txnstream._native`` builds the
same from librdkafka's messages (:mod:`txnstream.buffer.scan`), and
:meth:`TransactionBuffer.fold_entries <txnstream.buffer.TransactionBuffer.fold_entries>`
folds either. What the fold decides does not depend on where a run is cut: a run only
saves judging again what its first record's headers already decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from txnstream.message import (
    DELIVER_AFTER_HEADER,
    DELIVER_AT_HEADER,
    TXN_ID_HEADER,
    TXN_MARKER_HEADER,
)

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
    """The entries of ``records``, all of ``topic``-``partition``, in offset order.

    A record extends the open run when its offset is the next one and it is of the run's
    kind: plain without a delay header, to a run of those (``headers`` None, whatever
    other headers it has); plain with a delay header or a txn record, to a run whose
    ``headers`` equal its own (same list, same order: of its own kind then, as a txn
    record's headers have a ``txn.id`` and a delayed plain one's have none), a delayed
    plain one only if its timestamp is the run's too (its due time may count from it).
    A marker is always an entry of its own.
    """
    out: list[Entry] = []
    run: list = []  # type: ignore[type-arg]  # the open entry, as a list
    for m in records:
        offset, headers = m.offset(), m.headers()
        txn = marker = delayed = False
        for k, _ in headers or ():
            if k == TXN_ID_HEADER:
                txn = True
            elif k == TXN_MARKER_HEADER:
                marker = True
            elif k == DELIVER_AT_HEADER or k == DELIVER_AFTER_HEADER:
                delayed = True
        keep = txn or marker or delayed  # the entry keeps the record's headers
        if run and not marker and offset == run[3] + 1 and (
                (not keep and run[4] is None) or (keep and run[4] is not None
                                                  and list(headers or ()) == run[4]
                                                  and (txn or not delayed
                                                       or m.timestamp()[1] == run[6]))):
            run[3] = offset
            continue
        if run:
            out.append(tuple(run))
        run = [topic, partition, offset, offset, list(headers or ()) if keep else None,
               m.value() if marker else None, m.timestamp()[1]]
        if marker:
            out.append(tuple(run))
            run = []
    if run:
        out.append(tuple(run))
    return out
