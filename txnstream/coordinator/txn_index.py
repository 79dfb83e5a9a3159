"""``TxnIndex``: what LIST and STATS read, kept in step with a TC's txns (no scans).

A TC may hold a hundred thousand txns; LIST and STATS are open to every principal and
run on the worker's one loop thread. Sorting the table for a LIST (about 4 ms at 10,000
txns) or counting it for a STATS (6 ms) let one principal's stream of them stall every
commit on the worker (issue 34 item 2). So the table keeps, as its txns change:

- the sequences of its txns in order, all of them and per owning principal: a LIST page
  is a bisection and a walk over the caller's own txns;
- the count of txns per state (each coordinator status, and ``reserved``);
- the OPEN txns (reserved ones left out) by open time, in a heap whose stale entries are
  dropped when read and which is rebuilt from the live txns once it holds twice as many
  entries as they are (so it stays within twice the most OPEN txns at once, read or not).

Bounds: the sequences are those of the table; the counts one per state.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from txnstream.coordinator.meta import TxnMeta
from txnstream.types import TxnStatus

__all__ = ["TxnIndex", "state_of"]

RESERVED = "reserved"
"""The state of an OPEN txn no writer holds yet (the ``reason`` of a RESERVE's records)."""
_HEAP_SLACK = 64


def state_of(meta: TxnMeta) -> str:
    """What STATS counts ``meta`` as: its status, or ``reserved``."""
    if meta.reserved and meta.status is TxnStatus.OPEN:
        return RESERVED
    return meta.status.value


class TxnIndex:
    """Sequences in order (all, and per owner), counts per state, OPEN txns by age."""

    def __init__(self, txns: Mapping[int, TxnMeta]) -> None:
        self._txns = txns
        """The table's txns (read only: what the heap's entries are checked against)."""
        self._all: list[int] = []
        self._of: dict[str, list[int]] = {}
        self.counts: Counter[str] = Counter()
        self._opened: list[tuple[int, int]] = []
        """(open time, sequence) of OPEN txns held by writers; stale entries dropped lazily."""

    def add(self, meta: TxnMeta) -> None:
        """A txn new to the table."""
        seq = meta.txn_id.least_bits
        _insert(self._all, seq)
        _insert(self._of.setdefault(meta.owner, []), seq)
        self.counts[state_of(meta)] += 1
        self._push_if_open(meta)

    def changed(self, meta: TxnMeta, was: str) -> None:
        """``meta`` left state ``was``, or its open time moved (a txn handed out)."""
        now = state_of(meta)
        if now != was:
            self._count(was, -1)
            self.counts[now] += 1
        self._push_if_open(meta)

    def remove(self, gone: Iterable[TxnMeta]) -> None:
        """Txns the table forgets (truncated away)."""
        seqs: dict[str, set[int]] = {}
        for meta in gone:
            seqs.setdefault(meta.owner, set()).add(meta.txn_id.least_bits)
            self._count(state_of(meta), -1)
        if not seqs:
            return
        every = set().union(*seqs.values())
        self._all = [s for s in self._all if s not in every]
        for owner, mine in seqs.items():
            kept = [s for s in self._of.get(owner, ()) if s not in mine]
            if kept:
                self._of[owner] = kept
            else:
                self._of.pop(owner, None)

    def after(self, seq: int, owner: str | None) -> Iterator[int]:
        """Sequences above ``seq`` in order: every txn's, or ``owner``'s only."""
        seqs = self._all if owner is None else self._of.get(owner, [])
        for i in range(bisect.bisect_right(seqs, seq), len(seqs)):
            yield seqs[i]

    def oldest_open_time(self) -> int | None:
        """Open time of the oldest OPEN txn a writer holds, or None."""
        heap = self._opened
        while heap:
            if self._current(*heap[0]):
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def _current(self, open_time: int, seq: int) -> bool:
        m = self._txns.get(seq)
        return (m is not None and m.status is TxnStatus.OPEN and not m.reserved
                and m.open_time_ms == open_time)

    def _push_if_open(self, meta: TxnMeta) -> None:
        if meta.status is not TxnStatus.OPEN or meta.reserved:
            return
        heapq.heappush(self._opened, (meta.open_time_ms, meta.txn_id.least_bits))
        if len(self._opened) > 2 * self.counts[TxnStatus.OPEN.value] + _HEAP_SLACK:
            self._opened = [e for e in self._opened if self._current(*e)]
            heapq.heapify(self._opened)

    def _count(self, state: str, delta: int) -> None:
        left = self.counts[state] + delta
        if left:
            self.counts[state] = left
        else:
            del self.counts[state]


def _insert(seqs: list[int], seq: int) -> None:
    if not seqs or seqs[-1] < seq:
        seqs.append(seq)  # the usual case: sequences grow
    else:
        i = bisect.bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            seqs.insert(i, seq)
