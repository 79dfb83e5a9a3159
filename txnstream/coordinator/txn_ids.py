"""``TxnIdPool``: TxnIDs a client reserves in blocks and hands out without a round trip.

The client side of the lease contract of ``RESERVE`` / ``ACTIVATE`` (docs/coordinator.md);
the coordinator side is :meth:`TransactionMetadataStore.reserve` and
:meth:`~TransactionMetadataStore.activate`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from txnstream.config import Config
from txnstream.coordinator.protocol import TcOp, TcReply
from txnstream.errors import RequestTimeoutError
from txnstream.types import TxnID

__all__ = [
    "HAND_OUT_WINDOW_S",
    "LEASE_CLOCK_SLACK_S",
    "RESERVE_FIRST",
    "RESERVE_MAX",
    "Coordinators",
    "TxnIdPool",
]

log = logging.getLogger(__name__)

HAND_OUT_WINDOW_S = 10.0
"""How long after its ``RESERVE`` went out a block's TxnIDs are handed out; a block used
up within a quarter of it doubles the next one."""
LEASE_CLOCK_SLACK_S = 2.0
"""Allowance for the wall clocks of the client and of the TC's owners (old and new, after
a failover) to disagree: NTP keeps hosts within milliseconds of each other."""
RESERVE_FIRST = 4
RESERVE_MAX = 128
"""Block sizes: a block used up within a quarter of its lease doubles the next one."""


class Coordinators(Protocol):
    """What the pool needs of its client: a request to one TC, and which TC is next."""

    config: Config
    client_id: str

    def pick_coordinator(self) -> int:
        """The TC the next block comes from (round-robin)."""

    def request(self, op: TcOp, tc_id: int, *, timeout_s: float | None = None,
                **fields: Any) -> TcReply:
        """Send one request; its successful reply, or its error raised."""


class TxnIdPool:
    """TxnIDs reserved in blocks (``RESERVE``), handed out without a round trip each.

    Each block comes from the next coordinator in turn, so txns still spread over every
    TC. The lease contract, which makes a handed-out TxnID live for the timeout its user
    asked even when its activation meets a failover:

    1. The client hands a block's TxnIDs out only for :data:`HAND_OUT_WINDOW_S` after it
       sent the ``RESERVE`` (by its monotonic clock, so never later than the window
       after the TC opened the block).
    2. A handed-out TxnID's ``ACTIVATE`` is an ordinary request: retried through
       failovers until ``Config.request_timeout_s`` (R) after the hand-out, and dropped
       by any worker once that deadline has passed.
    3. The block's lease, after which the TC aborts a TxnID not activated yet (a logged
       abort every later owner agrees with), is the window plus R plus
       :data:`LEASE_CLOCK_SLACK_S`: :attr:`lease_s`.

    So no activation can still be on its way when the lease ends: either it was durable
    before (the txn's deadline is then its hand-out plus its own timeout), or its
    request deadline passed first and the client got ``RequestTimeoutError`` for it, as
    it would for a ``NEW`` sent at the same moment. A failover only delays activations
    like any other request. The cost: an unused TxnID holds its TC's low watermark for at
    most :attr:`lease_s` (42 s with the defaults). What is left of a block after its
    window is not used (the TC aborts those at their lease), and :meth:`release` aborts
    a closing client's leftovers at once.
    """

    def __init__(self, tc: Coordinators,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tc = tc
        self._clock = clock
        self._lock = threading.Lock()
        self._tc_id = -1
        self._seqs: list[int] = []
        self._keys: dict[int, bytes] = {}
        """The txn keys of ``_seqs`` (empty when the workers check no membership)."""
        self._usable_until = 0.0
        self._granted_at = 0.0
        self._size = RESERVE_FIRST
        self.request_timeout_s = tc.config.request_timeout_s
        """R: how long an ``ACTIVATE`` is retried (the client's request deadline)."""
        self.lease_s = HAND_OUT_WINDOW_S + self.request_timeout_s + LEASE_CLOCK_SLACK_S
        """The lease each ``RESERVE`` asks for (see the class docstring)."""

    def take(self) -> tuple[int, int, bytes | None]:
        """``(tc_id, seq, txn key)`` of a fresh OPEN txn; reserves a block if needed.

        The key is None when the workers check no membership.

        A block whose ``RESERVE`` reply came after its hand-out window closed (a slow
        failover) is left to its lease and another is reserved, until the request
        deadline; then ``RequestTimeoutError``.
        """
        with self._lock:
            give_up = self._clock() + self.request_timeout_s
            while not self._seqs or self._clock() >= self._usable_until:
                left = give_up - self._clock()
                if left <= 0:
                    raise RequestTimeoutError(
                        f"no block of TxnIDs reserved within {self.request_timeout_s:.0f}s "
                        "that could still be handed out: are the coordinators reachable?")
                self._refill(left)
            seq = self._seqs.pop(0)
            return self._tc_id, seq, self._keys.pop(seq, None)

    def activation(self, tc_id: int, seq: int, timeout_ms: int,
                   open_time_ms: int | None = None) -> Callable[[], TcReply]:
        """The ``ACTIVATE`` of a TxnID handed out now, to send now or on a pipeline.

        Its open time (``open_time_ms``: now unless given) and its request deadline (R)
        run from now, however long it waits for a pipeline thread: step 2 of the lease
        contract.
        """
        if open_time_ms is None:
            open_time_ms = int(time.time() * 1000)
        give_up = self._clock() + self.request_timeout_s

        def activate() -> TcReply:
            left = give_up - self._clock()
            if left <= 0:
                raise RequestTimeoutError(
                    f"the activation of transaction {TxnID(tc_id, seq)} did not start "
                    f"within {self.request_timeout_s:.0f}s of its hand-out")
            return self._tc.request(TcOp.ACTIVATE, tc_id, timeout_s=left, txn_seq=seq,
                                    timeout_ms=timeout_ms, open_time_ms=open_time_ms)

        return activate

    def _refill(self, timeout_s: float) -> None:
        sent = self._clock()
        if self._granted_at and not self._seqs \
                and sent - self._granted_at < HAND_OUT_WINDOW_S / 4:
            self._size = min(RESERVE_MAX, self._size * 2)  # used up fast: bigger blocks
        tc_id = self._tc.pick_coordinator()
        reply = self._tc.request(TcOp.RESERVE, tc_id, timeout_s=timeout_s, count=self._size,
                                 timeout_ms=int(self.lease_s * 1000))
        self._tc_id, self._seqs = tc_id, list(reply.group_seqs)
        self._keys = dict(zip(reply.group_seqs, reply.txn_keys, strict=False))
        self._granted_at = sent
        self._usable_until = sent + HAND_OUT_WINDOW_S

    def release(self) -> None:
        """Abort the TxnIDs never handed out (a closing client), best effort."""
        with self._lock:
            seqs, self._seqs = self._seqs, []
            self._keys = {}
            if not seqs or self._clock() >= self._granted_at + self.lease_s:
                return
            try:
                self._tc.request(TcOp.END_GROUP, self._tc_id, timeout_s=5.0,
                                 group_key=f"release-{self._tc.client_id}-{seqs[0]}",
                                 group_seqs=tuple(seqs), commit=False)
            except Exception as exc:  # their lease ends them anyway
                log.debug("releasing reserved txns %s: %s", seqs, exc)
