"""``TransactionTimeoutTracker``: which open transactions are past their deadline.

Deadlines come from the *logged* open time plus the txn's own timeout, so a new owner
after failover computes the same deadlines (Pulsar's ``TransactionTimeoutTracker``).
"""

from __future__ import annotations

import heapq

__all__ = ["TransactionTimeoutTracker"]


class TransactionTimeoutTracker:
    """A min-heap of ``(deadline_ms, seq)``; stale entries are skipped lazily."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []
        self._deadline: dict[int, int] = {}

    def track(self, seq: int, deadline_ms: int) -> None:
        """Start (or move) the deadline of ``seq``."""
        self._deadline[seq] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, seq))

    def untrack(self, seq: int) -> None:
        """The txn left OPEN; its deadline no longer matters."""
        self._deadline.pop(seq, None)

    def pop_expired(self, now_ms: int) -> list[int]:
        """Sequences whose deadline is <= ``now_ms``, earliest deadline first; each once."""
        out: list[int] = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline, seq = heapq.heappop(self._heap)
            if self._deadline.get(seq) == deadline:
                del self._deadline[seq]
                out.append(seq)
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest live deadline, if any."""
        while self._heap and self._deadline.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._deadline)
