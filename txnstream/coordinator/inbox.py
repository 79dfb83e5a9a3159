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
- **A quota on reads** (Kafka's per-principal ``request_percentage``): the handling of a
  principal's reads (GET, LIST, STATS: the worker says which requests are) may take
  ``read_share`` of the worker's time, in bursts of up to ``read_burst_s``. A principal
  over it is throttled, Kafka's way: none of its requests is taken until its credit is
  back, and backpressure stops its connections being read meanwhile. Fairness alone is
  work-conserving: a principal pipelining LISTs as fast as they are answered took every
  idle moment of every worker (a quarter of a core each in the hostile flood, seed 54),
  and on a machine shared with brokers that CPU is what honest commits waited for.
  Admins and the workers' own principal (the buffer role asks TCs about txns) are
  exempt, as is everyone on a line that does not authenticate (all one principal there).
"""

from __future__ import annotations

import math
import queue
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txnstream.coordinator.transport import ServerConnection

__all__ = ["FairInbox", "TURN_BUDGET_S", "TURN_MAX_S", "ReadQuota"]

TURN_BUDGET_S = 0.005
"""Handling time of one principal's requests in a turn while others wait (then theirs)."""
TURN_MAX_S = 0.05
"""Handling time of one turn: its replies wait for its log append, after all of it."""

SWEEP_AT = 1_024
"""Principals remembered by the read quota past which the refilled ones are forgotten at
once (else at their next request): at most this many plus those that read within the
last ``burst_s / share`` seconds (5 s by default)."""

Item = tuple[Any, "ServerConnection", int, float]
"""A request (as the worker put it: decoded, or its bytes), its connection, its size,
and ``time.monotonic()`` when it arrived."""


class ReadQuota:
    """Per principal, the credit of handling time its reads may still take (seconds).

    A token bucket: it fills at ``share`` seconds a second up to ``burst_s``; each read's
    handling is taken from it, and a principal below zero is throttled until it refills
    to zero. Only principals in debt or below a full bucket are kept (bounded by the
    principals that read within the last ``burst_s / share`` seconds).
    """

    def __init__(self, share: float, burst_s: float,
                 exempt: Callable[[str], bool] = lambda principal: False) -> None:
        if not 0 < share <= 1 or not 0 < burst_s < math.inf:  # NaN fails both
            raise ValueError(f"read quota: share {share} must be in (0, 1], "
                             f"burst {burst_s} s positive")
        self.share, self.burst_s, self.exempt = share, burst_s, exempt
        self._credit: dict[str, tuple[float, float]] = {}
        """Principal -> (credit in seconds, monotonic time it was reckoned at)."""

    def _now(self, principal: str, now: float) -> float | None:
        got = self._credit.get(principal)
        if got is None:
            return None
        credit = min(self.burst_s, got[0] + (now - got[1]) * self.share)
        if credit >= self.burst_s:
            del self._credit[principal]  # full again: nothing to remember
            return None
        return credit

    def charge(self, principal: str, seconds: float, now: float) -> None:
        """Take ``seconds`` of a read's handling from the principal's credit."""
        if self.exempt(principal):
            return
        credit = self._now(principal, now)
        self._credit[principal] = ((self.burst_s if credit is None else credit) - seconds, now)
        if len(self._credit) > SWEEP_AT:
            for p in list(self._credit):
                self._now(p, now)  # drops those refilled since

    def tracked(self) -> int:
        """Principals whose credit is remembered (not full)."""
        return len(self._credit)

    def release_at(self, principal: str, now: float) -> float:
        """When the principal may be served again: ``now`` unless it is in debt."""
        credit = self._now(principal, now)
        return now if credit is None or credit >= 0 else now - credit / self.share


class FairInbox:
    """Requests by principal, taken in rotation within a per-principal turn budget."""

    def __init__(self, batch_max: int, reads: ReadQuota | None = None) -> None:
        self.batch_max = batch_max
        self.reads = reads
        self._arrived: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._waiting: dict[str, deque[Item]] = {}
        """Per principal, requests moved off the arrival queue, oldest first."""
        self._is_read = False
        """The request given last is a read (:meth:`read`)."""
        self.arrived = 0.0
        """``time.monotonic()`` when the request :meth:`take` gave last arrived."""

    def read(self) -> None:
        """The request just taken is a read: its handling counts against the read quota."""
        self._is_read = True

    def put(self, request: Any, conn: ServerConnection, nbytes: int | None = None) -> None:
        """A request read from ``conn`` (the listener's thread).

        ``nbytes``: its size on the line (default ``len(request)``, for one given as bytes).
        """
        self._arrived.put((request, conn, len(request) if nbytes is None else nbytes,
                           time.monotonic()))

    def waiting(self) -> int:
        """Requests not taken yet (the worker's thread)."""
        return sum(len(q) for q in self._waiting.values()) + self._arrived.qsize()

    def take(self, timeout: float) -> Iterator[tuple[Any, ServerConnection]]:
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
        while taken < self.batch_max and total < TURN_MAX_S:
            ready = self._ready(time.monotonic())
            turn = [p for p in ready if spent.get(p, 0.0) < TURN_BUDGET_S]
            if not turn:  # all used their budget: newcomers first; others' replies wait
                self._collect(0)  # for this turn's end, so only a lone principal goes on
                ready = self._ready(time.monotonic())
                turn = [p for p in ready if p not in spent]
                if not turn and len(spent) > 1:
                    return
                turn = turn or ready
                if not turn:
                    return
            for principal in turn:
                q = self._waiting[principal]
                data, conn, nbytes, self.arrived = q.popleft()
                if not q:
                    del self._waiting[principal]
                conn.took(nbytes)
                taken += 1
                t0 = time.perf_counter()
                self._is_read = False
                yield data, conn
                used = time.perf_counter() - t0
                if self._is_read and self.reads is not None:
                    self.reads.charge(principal, used, time.monotonic())
                spent[principal] = spent.get(principal, 0.0) + used
                total += used
                if taken >= self.batch_max or total >= TURN_MAX_S:
                    return

    def _ready(self, now: float) -> list[str]:
        """Principals with requests waiting that the read quota does not throttle."""
        if self.reads is None:
            return list(self._waiting)
        return [p for p in self._waiting if self.reads.release_at(p, now) <= now]

    def _collect(self, timeout: float) -> None:
        """Move arrived requests to their principals' queues.

        Waits up to ``timeout`` for one if no principal is ready (or until the first
        throttled one is).
        """
        now = time.monotonic()
        if not self._ready(now):
            if self._waiting and self.reads is not None:  # every one of them throttled
                release = min(self.reads.release_at(p, now) for p in self._waiting)
                timeout = min(timeout, max(release - now, 0.0))
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
