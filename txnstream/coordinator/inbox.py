"""``FairInbox``: the requests a worker has read and not handled yet, fair among principals.

A worker handles requests on one thread, in turns; the listener's thread reads them. Before
this inbox, requests waited in one unbounded FIFO and a turn took the first 2,000: one
principal pipelining LIST or STATS at thousands a second held every other principal's
commits behind its own (issue 34 item 2). Now:

- **Bounded, with backpressure** (Kafka's ``queued.max.requests``, per connection): a
  connection stops being read while ``LineLimits.max_queued`` of its requests, or
  ``max_queued_bytes`` of their bytes, wait here, and every connection while
  ``max_queued_bytes_total`` wait (:class:`~txnstream.coordinator.transport.Listener`
  counts them; the inbox tells the connection when one is taken).
- **Fair** (as Kafka's request quotas are per principal): a turn takes the principals'
  requests in rotation, one at a time, and stops taking a principal's once their handling
  took :data:`TURN_BUDGET_S` of the turn while another principal has requests waiting; a
  turn's handling ends at :data:`TURN_MAX_S`. A principal's request waits at most the
  rest of one turn and its own place in the next, however many another has queued.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txnstream.coordinator.transport import ServerConnection

__all__ = ["FairInbox", "TURN_BUDGET_S", "TURN_MAX_S"]

TURN_BUDGET_S = 0.005
"""Handling time of one principal's requests in a turn while others wait (then theirs)."""
TURN_MAX_S = 0.05
"""Handling time of one turn: its replies wait for its log append, after all of it."""

Item = tuple[bytes, "ServerConnection"]


class FairInbox:
    """Requests by principal, taken in rotation within a per-principal turn budget."""

    def __init__(self, batch_max: int) -> None:
        self.batch_max = batch_max
        self._arrived: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._waiting: dict[str, deque[Item]] = {}
        """Per principal, requests moved off the arrival queue, oldest first."""

    def put(self, data: bytes, conn: ServerConnection) -> None:
        """A request read from ``conn`` (the listener's thread)."""
        self._arrived.put((data, conn))

    def waiting(self) -> int:
        """Requests not taken yet (the worker's thread)."""
        return sum(len(q) for q in self._waiting.values()) + self._arrived.qsize()

    def take(self, timeout: float) -> Iterator[Item]:
        """The requests of this turn, fairly; waits up to ``timeout`` for the first one.

        Time between one request given and the next asked for is its handling time,
        charged to its principal. Principals are taken in rotation; once every one here
        used :data:`TURN_BUDGET_S`, requests that arrived meanwhile from others are taken,
        and the turn ends if it served more than one principal (their replies wait for
        its end). A lone principal goes on until the turn's handling reaches
        :data:`TURN_MAX_S` or ``batch_max`` requests. Requests not taken stay here.
        """
        self._collect(timeout)
        spent: dict[str, float] = {}
        taken = 0
        total = 0.0
        while self._waiting and taken < self.batch_max and total < TURN_MAX_S:
            turn = [p for p in self._waiting if spent.get(p, 0.0) < TURN_BUDGET_S]
            if not turn:  # all used their budget: newcomers first; others' replies wait
                self._collect(0)  # for this turn's end, so only a lone principal goes on
                turn = [p for p in self._waiting if p not in spent]
                if not turn and len(spent) > 1:
                    return
                turn = turn or list(self._waiting)
            for principal in turn:
                q = self._waiting[principal]
                data, conn = q.popleft()
                if not q:
                    del self._waiting[principal]
                conn.took(len(data))
                taken += 1
                t0 = time.perf_counter()
                yield data, conn
                used = time.perf_counter() - t0
                spent[principal] = spent.get(principal, 0.0) + used
                total += used
                if taken >= self.batch_max or total >= TURN_MAX_S:
                    return

    def _collect(self, timeout: float) -> None:
        if not self._waiting:
            try:
                self._file(self._arrived.get(timeout=timeout) if timeout > 0
                           else self._arrived.get_nowait())
            except queue.Empty:
                return
        while True:  # bounded: connections stop being read while theirs wait here
            try:
                self._file(self._arrived.get_nowait())
            except queue.Empty:
                return

    def _file(self, item: Item) -> None:
        self._waiting.setdefault(item[1].principal, deque()).append(item)
