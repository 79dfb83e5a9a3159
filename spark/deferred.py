"""Delayed records in a stream's micro-batches: deferred, then read once due (issue 38).

A record sent with ``deliver_after``/``deliver_at`` is delivered no earlier than its
time. The buffer owners note, for each served partition, the visible records that are
not due yet (:mod:`txnstream.buffer.delays`). When the source ends a micro-batch
(``latestOffset``) it looks at what the new range holds: runs not due now are
**deferred**: the batch skips them, and they travel in the end offsets under
:data:`DEFERRED_KEY` (``{"t": {"0": 12}, "@deferred": {"t": {"0": [[5, 5, due_ms]]}}}``).
Each later ``latestOffset`` **releases** the deferred runs that fell due: the next batch
reads them (a task per cluster of nearby runs, :func:`clusters`) beside its new range.

What a batch reads is a function of its start and end offsets alone (Spark replays a
batch from them after a failure): its range minus the end's deferred runs, plus the
start's deferred runs that the end no longer defers. Due times were fixed when the
records became visible, so a batch's plan never depends on when it is replayed.

Bounds: at most :data:`MAX_DEFERRED_RUNS` deferred runs per partition travel in the
offsets; a range that would defer more ends before the first run that does not fit, so
the partition waits there (latency behind the delayed records, as a consumer pauses)
until some fall due. A batch read (``spark.read``) skips what is not due when it is
planned.

Pure: no I/O; ``tests/unit/spark/test_deferred.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from txnstream.types import TopicPartition

from .options import Offsets

__all__ = ["DEFERRED_KEY", "MAX_DEFERRED_RUNS", "RELEASE_GAP", "RunGate", "clusters", "defer",
           "join", "split", "subtract"]

DEFERRED_KEY = "@deferred"
"""Where deferred runs sit in a stream's offsets JSON (``@`` is in no topic name)."""
MAX_DEFERRED_RUNS = 1_000
"""Deferred runs one partition carries from batch to batch (about 40 KB of offsets)."""
RELEASE_GAP = 10_000
"""Released runs closer than this many offsets are read by one task (reading through
the gap costs less than another task); farther ones by a task each."""

Run = tuple[int, int, int]
"""``(first offset, last offset, due epoch ms)``."""
Span = tuple[int, int]
"""``(first offset, last offset)``."""


def split(offsets: Mapping[str, Any]) -> tuple[dict[str, Any], dict[TopicPartition, list[Run]]]:
    """The offsets without :data:`DEFERRED_KEY`, and each partition's deferred runs.

    A malformed entry (a hand-edited checkpoint) raises ``ValueError`` naming it.
    """
    rest = {t: v for t, v in offsets.items() if t != DEFERRED_KEY}
    out: dict[TopicPartition, list[Run]] = {}
    noted = offsets.get(DEFERRED_KEY) or {}
    if not isinstance(noted, dict):
        raise ValueError(f"offsets: {DEFERRED_KEY!r} must map topics to partitions")
    for t, parts in noted.items():
        if not isinstance(parts, dict):
            raise ValueError(f"offsets: {DEFERRED_KEY!r} of topic {t!r} must map partitions "
                             "to runs")
        for p, runs in parts.items():
            try:
                got = [(int(f), int(la), int(d)) for f, la, d in runs]
                tp = TopicPartition(t, int(p))
            except (TypeError, ValueError):
                raise ValueError(f"offsets: {DEFERRED_KEY!r} of {t}-{p} is {runs!r:.80}, not "
                                 "a list of [first, last, due ms]") from None
            if any(f > la or f < 0 for f, la, _ in got) or any(
                    a[1] >= b[0] for a, b in zip(got, got[1:], strict=False)):
                raise ValueError(f"offsets: {DEFERRED_KEY!r} of {t}-{p}: runs must be "
                                 f"ascending and disjoint, got {runs!r:.80}")
            out[tp] = got
    return rest, out


def join(offsets: Mapping[str, Any], deferred: Mapping[TopicPartition, Sequence[Run]]
         ) -> dict[str, Any]:
    """``offsets`` with the partitions' deferred runs beside them (none: unchanged)."""
    noted: dict[str, dict[str, list[list[int]]]] = {}
    for tp, runs in sorted(deferred.items()):
        if runs:
            noted.setdefault(tp.topic, {})[str(tp.partition)] = [list(r) for r in runs]
    return {**offsets, DEFERRED_KEY: noted} if noted else dict(offsets)


def defer(carried: Sequence[Run], found: Sequence[Run], end: int, now_ms: int
          ) -> tuple[list[Run], int]:
    """What a new range ending at ``end`` defers, and its end (cut if past the bound).

    ``carried``: the start's deferred runs; ``found``: the new range's runs not due at
    ``now_ms`` (ascending, above every carried one).
    """
    still = [r for r in carried if r[2] > now_ms]
    room = MAX_DEFERRED_RUNS - len(still)
    found = [r for r in found if r[2] > now_ms and r[0] < end]
    if len(found) > room:
        end = found[max(room, 0)][0]
        found = found[:max(room, 0)]
    return still + found, end


def subtract(runs: Iterable[Span], minus: Iterable[Span]) -> list[Span]:
    """The offsets of ``runs`` that are in no run of ``minus``, as ascending spans."""
    cut = sorted(minus)
    out: list[Span] = []
    for first, last in sorted(runs):
        at = max(first, out[-1][1] + 1) if out else first  # overlapping runs: once
        for f, la in cut:
            if la < at or f > last:
                continue
            if f > at:
                out.append((at, f - 1))
            at = max(at, la + 1)
        if at <= last:
            out.append((at, last))
    return out


def clusters(spans: Sequence[Span], gap: int = RELEASE_GAP) -> list[list[Span]]:
    """``spans`` (ascending) grouped where they lie within ``gap`` offsets of each other."""
    out: list[list[Span]] = []
    for s in spans:
        if out and s[0] - out[-1][-1][1] <= gap:
            out[-1].append(s)
        else:
            out.append([s])
    return out


class RunGate:
    """A task's test of ascending offsets against spans: in one (``only``) or in none.

    Offsets come in increasing order, so each test moves a cursor: O(1) amortized.
    """

    __slots__ = ("_spans", "_i", "_only")

    def __init__(self, spans: Sequence[Span], only: bool) -> None:
        self._spans, self._i, self._only = list(spans), 0, only

    def blocks(self, offset: int) -> bool:
        """Whether the record at ``offset`` is not delivered by this task."""
        spans, i = self._spans, self._i
        while i < len(spans) and spans[i][1] < offset:
            i += 1
        self._i = i
        inside = i < len(spans) and spans[i][0] <= offset
        return inside != self._only


def offsets_floor(offsets: Offsets, deferred: Mapping[TopicPartition, Sequence[Run]]
                  ) -> Offsets:
    """``offsets`` lowered to each partition's first deferred offset (where state is kept)."""
    out = {t: dict(parts) for t, parts in offsets.items()}
    for tp, runs in deferred.items():
        at = out.get(tp.topic, {}).get(str(tp.partition))
        if runs and at is not None:
            out[tp.topic][str(tp.partition)] = min(int(at), runs[0][0])
    return out


def released_partitions(opts: Any, views: Mapping[TopicPartition, Any],
                        released: Mapping[TopicPartition, Sequence[Span]]) -> list[Any]:
    """The input partitions that read ``released`` spans, a task per cluster of them.

    Each skips what its range must (``views``' hidden offsets and aborted spans: the
    planner keeps them down to the first deferred offset) and delivers only the spans.
    """
    from .partition import TxnStreamPartition

    out = []
    for tp, spans in sorted(released.items()):
        view = views.get(tp)
        for group in clusters(spans):
            lo, hi = group[0][0], group[-1][1] + 1
            hidden, aborted = view.skip_in(lo, hi) if view is not None else ([], [])
            out.append(TxnStreamPartition(opts.config, tp.topic, tp.partition, lo, hi, hidden,
                                          aborted, opts.value_schema, plain=view is None,
                                          fail_on_data_loss=opts.fail_on_data_loss,
                                          only=group))
    return out
