"""``Origins``: the requests a worker took and has not answered, and where their time went.

Each request taken from the inbox is remembered until it is answered: the connection to
answer on, its deadline, and when it arrived and was taken. A turn marks its stages
(requests handled, the log appended, read back, buffer registrations written), so the
answer to a request that took longer than ``slow_s`` is logged with where its time went,
as Kafka's request log splits a request's time into its queue, local and remote parts:
an honest commit that took two seconds says whether it waited for a turn behind other
principals, for its log append, or for the append to be read back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txnstream.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from txnstream.coordinator.protocol import TcRequest
    from txnstream.coordinator.transport import ServerConnection

__all__ = ["Origins", "SWEEP_AT", "SLOW_S", "STAGES"]

log = logging.getLogger(__name__)

SWEEP_AT = 10_000
"""Requests awaiting a reply past this many: those past their deadline are forgotten
(their client gave up on them; a resend brings its connection again)."""
SLOW_S = 1.0
"""A request answered this long after it arrived is logged with its stages."""
STAGES = ("handled", "appended", "read back", "registered")
"""A turn's stages after its start, in order (:meth:`Origins.stage`)."""


@dataclass(slots=True)
class Origin:
    """A request taken and not answered yet."""

    conn: ServerConnection
    deadline_ms: int
    arrived: float
    """``time.monotonic()`` when the listener read it."""
    taken: float
    """``time.monotonic()`` when a turn took it."""
    op: str
    tc_id: int
    txn_seq: int
    """Its TC and txn: named only if it is slow (nothing formatted per request)."""


class Origins:
    """Request id -> :class:`Origin`, with the current turn's stage times."""

    def __init__(self, worker_id: str, slow_s: float = SLOW_S) -> None:
        self.worker_id, self.slow_s = worker_id, slow_s
        self._by_id: dict[str, Origin] = {}
        self._sweep_at = SWEEP_AT
        self._marks: dict[str, float] = {}
        self._turn = 0.0
        self._slow = RateLimitedLog(log)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, request_id: str) -> Origin | None:
        """The request taken under ``request_id``, if it waits for its answer."""
        return self._by_id.get(request_id)

    def turn_started(self) -> None:
        """A turn starts: stages marked from now on are its own."""
        self._turn = time.monotonic()
        self._marks = {}

    def stage(self, name: str) -> None:
        """The current turn finished stage ``name`` (one of :data:`STAGES`)."""
        self._marks[name] = time.monotonic()

    def add(self, req: TcRequest, conn: ServerConnection, arrived: float) -> None:
        """``req`` was taken from ``conn`` (it arrived at monotonic ``arrived``)."""
        self._by_id[req.request_id] = Origin(conn, req.deadline_ms, arrived, time.monotonic(),
                                             req.op.value, req.tc_id, req.txn_seq)

    def pop(self, request_id: str) -> Origin | None:
        """The request answered now: forgotten, and logged if it was slow."""
        origin = self._by_id.pop(request_id, None)
        if origin is not None:
            now = time.monotonic()
            if now - origin.arrived >= self.slow_s:
                self._log_slow(origin, now)
        return origin

    def _log_slow(self, o: Origin, now: float) -> None:
        parts = [f"{o.taken - o.arrived:.3f} s waiting for a turn"]
        if o.taken >= self._turn:  # answered in the turn that took it: its stages
            last = o.taken
            for name in STAGES:
                if (at := self._marks.get(name)) is not None:
                    parts.append(f"{at - last:.3f} s to {name}")
                    last = at
            parts.append(f"{now - last:.3f} s to answer")
        else:
            parts.append(f"answered {now - o.taken:.3f} s after it was taken, outside "
                         "that turn")
        # at most one line per op, TC and principal every 10 s (bounded kinds: RateLimitedLog)
        self._slow.warning(f"slow {o.op} {o.tc_id} {o.conn.principal}", "worker %s: %s to "
                           "tc %d (txn seq %d) from principal %r at %s answered %.3f s after "
                           "it arrived: %s", self.worker_id, o.op, o.tc_id, o.txn_seq,
                           o.conn.principal, o.conn.peer, now - o.arrived, ", ".join(parts))

    def sweep(self, now_ms: int) -> None:
        """Forget requests past their deadline once :data:`SWEEP_AT` wait (bounded)."""
        if len(self._by_id) <= self._sweep_at:
            return
        kept = {k: v for k, v in self._by_id.items() if v.deadline_ms >= now_ms}
        for k, v in self._by_id.items():
            if k not in kept:
                v.conn.inflight -= 1
        self._by_id = kept
        # many still waiting (END waiters): sweep again only once as many came in
        self._sweep_at = max(SWEEP_AT, 2 * len(self._by_id))
