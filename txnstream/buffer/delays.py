"""Delayed records in the served buffer state: which visible records are not due yet.

A record sent with ``deliver_after``/``deliver_at`` (:mod:`txnstream.delayed`) carries
its time in a header. A consumer reads the header itself and holds the record; the Spark
source plans its ranges on the driver and never reads ahead of them, so the buffer
owner's fold notes each delayed record's due time and publishes it with the rest of the
served state (DELTAs, snapshots), and the planner defers what is not due yet
(:mod:`txnstream_spark.deferred`).

* A plain record's time is its ``txn.deliver.at`` (a ``txn.deliver.after`` on a plain
  record, not txnstream's, counts from its timestamp).
* A txn record's time is known at its txn's COMMIT marker: ``txn.deliver.after`` counts
  from the marker's timestamp (at least the record's own), ``txn.deliver.at`` is taken
  as written. Until then the fold keeps it with the txn (:class:`PendingDelays`); an
  aborted txn's records are never visible, so their delays are dropped.
* A record due by the time it becomes visible (a time in the past) is not noted.
* A header that does not parse delays nothing (as for a consumer).

The fold stays deterministic: due times come from the log alone (a time beyond
:data:`~txnstream.delayed.MAX_DELAY_S` after the record's timestamp is taken as that far).

Bounds: a partition keeps at most :data:`MAX_DELAYED_RUNS` runs, and so does each open
txn; past it, neighbouring runs merge pairwise (the merged run spans both and the records
between them, due at the later time). A flood of delays costs latency (records between
two merged runs wait for the later time), never memory, and nothing is ever delivered
early. The owner drops runs whose time passed :data:`EXPIRED_AFTER_MS` ago when it
publishes (readers' clocks may lag the owner's by that much without delivering early).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from txnstream.delayed import MAX_DELAY_S
from txnstream.message import DELIVER_AFTER_HEADER, DELIVER_AT_HEADER

__all__ = ["EXPIRED_AFTER_MS", "MAX_DELAYED_RUNS", "DelayRuns", "PendingDelays", "delay_of",
           "due_at"]

MAX_DELAYED_RUNS = 10_000
"""Runs of delayed records one partition's state keeps (and one open txn's); past it,
neighbouring runs merge pairwise."""
EXPIRED_AFTER_MS = 300_000
"""A run due this long ago is dropped when the owner publishes: five minutes of clock
difference between the owner and a reader never make the reader deliver early."""
_MAX_MS = MAX_DELAY_S * 1000
_MAX_DIGITS = 19

Run = tuple[int, int, int]
"""``(first offset, last offset, due epoch ms)``."""


def delay_of(headers: Sequence[tuple[str, bytes | None]] | None) -> tuple[int, int] | None:
    """``(at_ms, after_ms)`` of a record's delay header (0 where not given); None: no delay.

    A value that is no decimal number of ms delays nothing (None), as for a consumer.
    """
    for k, v in headers or ():
        if k == DELIVER_AT_HEADER or k == DELIVER_AFTER_HEADER:
            if not isinstance(v, bytes) or not 0 < len(v) <= _MAX_DIGITS or not v.isdigit():
                return None
            return (int(v), 0) if k == DELIVER_AT_HEADER else (0, min(int(v), _MAX_MS))
    return None


def due_at(at_ms: int, after_ms: int, since_ms: int, record_ms: int) -> int:
    """When a delayed record visible from ``since_ms`` is due (never past the bound)."""
    return min(max(at_ms, since_ms + after_ms), max(record_ms, since_ms) + _MAX_MS)


class DelayRuns:
    """Disjoint runs ``(first, last, due_ms)`` ascending, at most ``cap`` of them.

    Adding is idempotent (a delta applied twice changes nothing): a run that overlaps or
    touches others with the same time joins them, one that overlaps others takes the
    latest of their times (never earlier).
    """

    __slots__ = ("_firsts", "_runs", "_soonest", "cap")

    def __init__(self, runs: Iterable[Run] = (), cap: int = MAX_DELAYED_RUNS) -> None:
        self._firsts: list[int] = []
        self._runs: list[Run] = []
        self._soonest = 2**63
        """At most the earliest time of a run: :meth:`expire` costs nothing before it."""
        self.cap = cap
        for first, last, due in runs:
            self.add(first, last, due)

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self._runs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelayRuns) and self._runs == other._runs

    def __repr__(self) -> str:
        return f"DelayRuns({self._runs!r})"

    def add(self, first: int, last: int, due: int) -> None:
        """Note that ``[first, last]`` is due at ``due`` (epoch ms)."""
        if last < first:
            return
        self._soonest = min(self._soonest, due)
        firsts, runs = self._firsts, self._runs
        i = bisect.bisect_right(firsts, first)
        lo = i
        if lo > 0 and (runs[lo - 1][1] >= first
                       or (runs[lo - 1][1] + 1 == first and runs[lo - 1][2] == due)):
            lo -= 1
        hi = i
        while hi < len(runs) and (runs[hi][0] <= last
                                  or (runs[hi][0] == last + 1 and runs[hi][2] == due)):
            hi += 1
        if hi > lo:
            merged = runs[lo:hi]
            first = min(first, merged[0][0])
            last = max(last, merged[-1][1])
            due = max(due, *(r[2] for r in merged))
        if hi < len(runs) and runs[hi][0] == last + 1 and runs[hi][2] == due:
            last, hi = runs[hi][1], hi + 1  # touching and due alike once merged
        if lo > 0 and runs[lo - 1][1] + 1 == first and runs[lo - 1][2] == due:
            first, lo = runs[lo - 1][0], lo - 1
        runs[lo:hi] = [(first, last, due)]
        firsts[lo:hi] = [first]
        if len(runs) > self.cap:
            self._coarsen()

    def _coarsen(self) -> None:
        runs = self._runs
        out: list[Run] = []
        for i in range(0, len(runs), 2):
            a, b = runs[i], runs[min(i + 1, len(runs) - 1)]
            run = (a[0], b[1], max(a[2], b[2]))
            if out and out[-1][1] + 1 == run[0] and out[-1][2] == run[2]:
                run = (out.pop()[0], run[1], run[2])  # as add() would have joined them
            out.append(run)
        self._runs, self._firsts = out, [r[0] for r in out]

    def trim(self, below: int) -> None:
        """Forget offsets below ``below``."""
        runs = self._runs
        n = 0
        while n < len(runs) and runs[n][1] < below:
            n += 1
        if n:
            del runs[:n]
            del self._firsts[:n]
        if runs and runs[0][0] < below:
            runs[0] = (below, runs[0][1], runs[0][2])
            self._firsts[0] = below

    def expire(self, before_ms: int) -> None:
        """Forget runs due before ``before_ms`` (free until the earliest falls due)."""
        if before_ms <= self._soonest:
            return
        self._runs = [r for r in self._runs if r[2] >= before_ms]
        self._firsts = [r[0] for r in self._runs]
        self._soonest = min((r[2] for r in self._runs), default=2**63)

    def due_of(self, offset: int) -> int | None:
        """The time of the run that holds ``offset``; None if none does."""
        i = bisect.bisect_right(self._firsts, offset) - 1
        return self._runs[i][2] if i >= 0 and self._runs[i][1] >= offset else None

    def in_range(self, start: int, end: int, after_ms: int | None = None) -> list[Run]:
        """The runs' parts in ``[start, end)`` (those due after ``after_ms``, if given)."""
        i = max(0, bisect.bisect_right(self._firsts, start) - 1)
        out = []
        for first, last, due in self._runs[i:]:
            if first >= end:
                break
            if last >= start and (after_ms is None or due > after_ms):
                out.append((max(first, start), min(last, end - 1), due))
        return out

    def to_avro(self) -> list[dict[str, int]]:
        """The runs as ``DelayedRun`` records (snapshots and DELTAs)."""
        return [{"first": f, "last": la, "due_ms": d} for f, la, d in self._runs]

    @classmethod
    def from_avro(cls, items: Iterable[dict[str, Any]]) -> DelayRuns:
        """Inverse of :meth:`to_avro`."""
        return cls((r["first"], r["last"], r["due_ms"]) for r in items)


class PendingDelays:
    """An open txn's delayed records: runs ``[first, last, at_ms, after_ms]`` until its end.

    At most :data:`MAX_DELAYED_RUNS`; past it, neighbouring runs merge pairwise (each
    part the larger).
    """

    __slots__ = ("runs",)

    def __init__(self, runs: Iterable[Sequence[int]] = ()) -> None:
        self.runs: list[list[int]] = [list(r) for r in runs]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PendingDelays) and self.runs == other.runs

    def __repr__(self) -> str:
        return f"PendingDelays({self.runs!r})"

    def add(self, first: int, last: int, at_ms: int, after_ms: int) -> None:
        """Records ``[first, last]`` (above every run so far) carry this delay."""
        runs = self.runs
        if runs and runs[-1][1] + 1 == first and runs[-1][2:] == [at_ms, after_ms]:
            runs[-1][1] = last
            return
        runs.append([first, last, at_ms, after_ms])
        if len(runs) > MAX_DELAYED_RUNS:
            self.runs = [[a[0], b[1], max(a[2], b[2]), max(a[3], b[3])]
                         for a, b in zip(runs[::2], runs[1::2] + runs[-1:], strict=False)]

    def extend_to(self, last: int) -> None:
        """The last run goes on up to ``last`` (a run of records with the same headers)."""
        self.runs[-1][1] = max(self.runs[-1][1], last)

    def resolve(self, commit_ms: int, record_ms: int) -> list[Run]:
        """The runs' due times for a commit at ``commit_ms``; only those due after it."""
        since = max(commit_ms, record_ms)
        out = []
        for first, last, at, after in self.runs:
            due = due_at(at, after, since, record_ms)
            if due > since:
                out.append((first, last, due))
        return out
