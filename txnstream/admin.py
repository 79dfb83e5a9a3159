"""``Admin``: list, inspect, abort and force-end transactions; coordinator statistics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txnstream.buffer.transaction_buffer import BufferStats
from txnstream.coordinator.protocol import TcOp, TxnInfo
from txnstream.types import TopicPartition, TxnID

if TYPE_CHECKING:
    from txnstream.config import Config
    from txnstream.coordinator.tc_client import TransactionCoordinatorClient
    from txnstream.pendingack.handle import PendingAckStats

__all__ = ["Admin", "CoordinatorStats", "PartitionBufferStats"]

ADMIN_TIMEOUT_S = 10.0
"""Admin calls fail fast: a coordinator with no owner right now is reported, not waited on."""


@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """One coordinator's numbers."""

    tc_id: int
    owner_id: str | None
    stats: dict[str, int]


@dataclass(frozen=True, slots=True)
class PartitionBufferStats(BufferStats):
    """:class:`BufferStats` of a partition, with the state its buffer is in.

    ``state`` (Pulsar's ``TransactionBufferStats.state``) is one of

    * ``"served"``: a buffer owner serves it; the numbers are its served state;
    * ``"plain"``: no txn ever registered it; every record is readable;
    * ``"waiting"``: a txn registered it but no buffer owner serves it yet (none runs,
      or one is starting). Committed readers deliver nothing of it until one does:
      ``max_read_position`` is the log start - 1, and what is ongoing is not known yet
      (``ongoing`` 0, no ``blocking_txn``).
    """

    state: str = "served"


class Admin:
    """Admin operations of a :class:`~txnstream.client.Client` (``client.admin``).

    Built from what it uses: the configuration, and ``coordinator``, which gives the
    client's coordinator client (made on first use).
    """

    def __init__(self, config: Config,
                 coordinator: Callable[[], TransactionCoordinatorClient]) -> None:
        self._config = config
        self._coordinator = coordinator

    def list_transactions(self, min_age_s: float = 0.0) -> list[TxnInfo]:
        """Every transaction every coordinator still knows, oldest first.

        Only this principal's own unless it is an admin (DESIGN.md section 10). Each
        coordinator answers in pages; a coordinator that does not answer raises (a list
        is never silently short).
        """
        tc = self._coordinator()
        txns: list[TxnInfo] = []
        for tc_id in range(tc.num_coordinators):
            after = -1
            while True:
                reply = tc.request(TcOp.LIST, tc_id, min_age_ms=int(min_age_s * 1000),
                                   after_seq=after, timeout_s=ADMIN_TIMEOUT_S)
                txns.extend(reply.txns)
                if not reply.more or not reply.txns:
                    break
                after = reply.txns[-1].txn_id.least_bits
        return sorted(txns, key=lambda t: (t.open_time_ms, t.txn_id))

    def get_transaction(self, txn_id: TxnID | str) -> TxnInfo:
        """One transaction; ``TransactionNotFoundError`` if unknown."""
        tid = TxnID.parse(txn_id) if isinstance(txn_id, str) else txn_id
        reply = self._coordinator().request(TcOp.GET, tid.tc_id, txn_seq=tid.least_bits,
                                        timeout_s=ADMIN_TIMEOUT_S)
        return reply.txns[0]

    def abort_transaction(self, txn_id: TxnID | str) -> TxnInfo:
        """Abort an open transaction (reason ``admin``); returns its new state."""
        tid = TxnID.parse(txn_id) if isinstance(txn_id, str) else txn_id
        self._coordinator().request(TcOp.END, tid.tc_id, txn_seq=tid.least_bits, commit=False,
                                reason="admin")
        return self.get_transaction(tid)

    def force_end(self, txn_id: TxnID | str) -> TxnInfo:
        """End a COMMITTING/ABORTING txn now, with whatever markers were written; its state.

        For a txn stuck because a partition that still exists refuses its marker (a
        partition that no longer exists never holds a txn: its marker is dropped). A
        COMMITTING txn is recorded COMMITTED, an ABORTING one ABORTED; the coordinator
        writes no marker after that, and docs/coordinator.md ("Force-ending a txn") says
        what readers of an unmarked partition see. Admins only (``NotAuthorizedError``
        otherwise, the txn's own principal included); an OPEN txn is refused
        (``InvalidTxnStatusError``: abort it); an ended one is returned as it is.
        """
        from txnstream.coordinator.handlers import FORCE_END

        tid = TxnID.parse(txn_id) if isinstance(txn_id, str) else txn_id
        self._coordinator().request(TcOp.END, tid.tc_id, txn_seq=tid.least_bits, commit=False,
                                reason=FORCE_END, timeout_s=ADMIN_TIMEOUT_S)
        return self.get_transaction(tid)

    def coordinator_stats(self) -> list[CoordinatorStats]:
        """Per coordinator: counts by status, low watermark, sequence, owner."""
        replies = self._coordinator().broadcast(TcOp.STATS, timeout_s=ADMIN_TIMEOUT_S)
        return [CoordinatorStats(r.tc_id, r.owner_id, dict(r.stats)) for r in replies]

    def buffer_stats(self, tp: TopicPartition | str) -> PartitionBufferStats:
        """How far committed readers of ``tp`` may go, what blocks them, and its state.

        Read from the state its buffer owner serves (its latest snapshot and the deltas
        since), never by folding the partition. A partition no txn ever registered is
        ``"plain"`` (every record visible); one registered but not served yet is
        ``"waiting"`` (readers wait for a buffer owner: is a ``txnstream worker`` with
        the buffer role running?). See :class:`PartitionBufferStats`.
        """
        from txnstream.buffer.follower import BufferStateFollower, ServeStatus

        tpp = TopicPartition.parse(tp) if isinstance(tp, str) else tp
        config = self._config
        follower = BufferStateFollower(config, name="admin")
        try:
            low, high = follower.watermarks(tpp)
            follower.catch_up([tpp], timeout_s=ADMIN_TIMEOUT_S)
            status = follower.status.get(tpp)
            if status is ServeStatus.PLAIN:
                return PartitionBufferStats(tpp, high - 1, high - 1, 0, 0, None, None, None,
                                            state=ServeStatus.PLAIN.value)
            view = follower.views.get(tpp)
            if view is None:
                return PartitionBufferStats(tpp, high - 1, low - 1, 0, 0, None, None, None,
                                            state=ServeStatus.WAITING.value)
            s = view.stats(int(time.time() * 1000))
            return PartitionBufferStats(s.tp, s.last_offset, s.max_read_position, s.ongoing,
                                        s.aborted, s.blocking_txn, s.blocking_offset,
                                        s.blocked_for_s, state=ServeStatus.SERVED.value)
        finally:
            follower.close()

    def pending_ack_stats(self, tp: TopicPartition | str, subscription: str) -> PendingAckStats:
        """Replay the pending-ack log of ``subscription`` on ``tp``: cursor, pending acks."""
        from txnstream.pendingack.store import PendingAckStore

        tpp = TopicPartition.parse(tp) if isinstance(tp, str) else tp
        store = PendingAckStore(self._config, subscription, "admin")
        try:
            return store.replay(tpp).stats()
        finally:
            store.close()

    def slow_transactions(self, min_age_s: float) -> list[TxnInfo]:
        """Open transactions older than ``min_age_s`` (they block committed readers)."""
        now = time.time() * 1000
        return [t for t in self.list_transactions(min_age_s)
                if now - t.open_time_ms >= min_age_s * 1000]
