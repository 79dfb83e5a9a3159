"""``TcRequestHandler``: applies one client request to a served TC's store.

Each op (:class:`~txnstream.coordinator.protocol.TcOp`) has one method here, the way
Pulsar's ``TransactionMetadataStoreService`` has ``newTransaction``,
``addProducedPartitionToTxn``, ``endTransaction`` and so on. A handler changes only the
in-memory store, which applies the change at once and queues its log entries
(:meth:`TransactionMetadataStore.unlogged`), also when the request then fails. It returns
the reply, or None if the request waits for its txn to end (END, END_GROUP): the worker
sends a reply only after the entries read back, the finalizer answers the waiters.

* **NEW** opens one txn; **RESERVE** opens a block of up to :data:`MAX_RESERVE` txns
  with a lease (a client's TxnID pool) and **ACTIVATE** starts a handed-out txn's
  deadline from its hand-out.
* **ADD_PARTITIONS**, **ADD_SUBSCRIPTIONS** register what a txn wrote to or acked.
* **END** decides one txn, **END_GROUP** every txn of a group under one key.
* **GET**, **LIST**, **STATS** read.

A store error (:class:`~txnstream.errors.TxnStreamError`) becomes a failure reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from txnstream.config import Config
from txnstream.coordinator.metadata_store import ABORT_ADMIN, ABORT_CLIENT
from txnstream.coordinator.ownership import TcIncarnation
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest, TxnInfo
from txnstream.errors import TxnStreamError
from txnstream.types import TxnStatus

__all__ = ["MAX_RESERVE", "TcRequestHandler"]

MAX_RESERVE = 256
"""TxnIDs one RESERVE may open (a client's block); bounds one request's log append."""

Handler = Callable[[TcIncarnation, TcRequest, int], "TcReply | None"]


class TcRequestHandler:
    """The per-op logic of a coordinator, over one TC incarnation's store."""

    def __init__(self, config: Config, worker_id: str, restarts: Mapping[int, int]) -> None:
        self.config = config
        self.worker_id = worker_id
        self.restarts = restarts
        """Replays after a failure per TC id (reported by STATS)."""
        self._ops: dict[TcOp, Handler] = {
            TcOp.NEW: self._new,
            TcOp.RESERVE: self._reserve,
            TcOp.ACTIVATE: self._activate,
            TcOp.ADD_PARTITIONS: self._add_partitions,
            TcOp.ADD_SUBSCRIPTIONS: self._add_subscriptions,
            TcOp.END: self._end,
            TcOp.END_GROUP: self._end_group,
            TcOp.GET: self._get,
            TcOp.LIST: self._list,
            TcOp.STATS: self._stats,
        }

    def handle(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply | None:
        """Apply one request to the store; its reply, or None if it waits (END).

        The entries it planned are taken from ``store.unlogged()`` by the caller, also
        when it failed; the reply is sent only after they read back.
        """
        op = self._ops.get(req.op)
        if op is None:
            raise AssertionError(req.op)
        try:
            return op(tc, req, now_ms)
        except TxnStreamError as exc:
            return TcReply.failure(req, exc, self.worker_id)

    def _timeout_ms(self, req: TcRequest) -> int:
        """The txn timeout (or lease) asked for, else the default; at most the maximum."""
        return min(req.timeout_ms or int(self.config.default_txn_timeout_s * 1000),
                   int(self.config.max_txn_timeout_s * 1000))

    def _ok(self, tc: TcIncarnation, req: TcRequest) -> TcReply:
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                       owner_id=self.worker_id)

    # ------------------------------------------------------------ opening

    def _new(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        meta, _ = tc.store.new_txn(req.request_id, self._timeout_ms(req), now_ms,
                                   req.group_key)
        return TcReply(req.request_id, req.client_id, tc.tc_id,
                       txn_seq=meta.txn_id.least_bits, owner_id=self.worker_id)

    def _reserve(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        count = max(1, min(req.count, MAX_RESERVE))
        seqs = tc.store.reserve(req.request_id, count, self._timeout_ms(req), now_ms)
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=seqs[0],
                       group_seqs=tuple(seqs), owner_id=self.worker_id)

    def _activate(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        tc.store.activate(req.txn_seq, self._timeout_ms(req), req.open_time_ms, now_ms,
                          req.request_id)
        return self._ok(tc, req)

    # ------------------------------------------------------------ registering

    def _add_partitions(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        tc.store.add_partitions(req.txn_seq, req.partitions, now_ms, req.request_id)
        return self._ok(tc, req)

    def _add_subscriptions(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        tc.store.add_subscriptions(req.txn_seq, req.subscriptions, now_ms, req.request_id)
        return self._ok(tc, req)

    # ------------------------------------------------------------ ending

    def _end(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply | None:
        reason = req.reason if req.reason in (ABORT_ADMIN,) else ABORT_CLIENT
        res = tc.store.end_txn(req.txn_seq, req.commit, now_ms, reason, req.request_id)
        if res.meta.status.is_final:
            return self._ok(tc, req)
        tc.end_waiters[req.txn_seq].append(req)
        return None

    def _end_group(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply | None:
        store = tc.store
        g = store.end_group(req.group_key or "", req.group_seqs, req.commit, now_ms,
                            req.request_id)
        reply = TcReply(req.request_id, req.client_id, tc.tc_id, already=g.already,
                        group_seqs=g.seqs, owner_id=self.worker_id,
                        error_kind=None if not g.error else (
                            "TransactionTimeoutError" if g.timed_out
                            else "InvalidTxnStatusError"),
                        error_message=g.error
                        and f"group {req.group_key} aborted: {g.error}")
        if g.error or g.already:
            return reply
        pending = {s for s in g.seqs if not store.txns[s].status.is_final}
        tc.group_waiters.append((req, pending, reply))
        return None

    # ------------------------------------------------------------ reading

    def _get(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        meta = tc.store.get(req.txn_seq)
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                       txns=(TxnInfo.of(meta),), owner_id=self.worker_id)

    def _list(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        metas = [m for m in tc.store.txns.values()
                 if req.min_age_ms <= 0 or (m.status is TxnStatus.OPEN and
                                            now_ms - m.open_time_ms >= req.min_age_ms)]
        return TcReply(req.request_id, req.client_id, tc.tc_id,
                       txns=tuple(TxnInfo.of(m) for m in metas), owner_id=self.worker_id)

    def _stats(self, tc: TcIncarnation, req: TcRequest, now_ms: int) -> TcReply:
        st = tc.store.stats(now_ms)
        stats = {f"status.{k}": v for k, v in st.by_status.items()}
        stats.update({f"ended.{k}": v for k, v in tc.store.ended.items()})
        stats.update({"next_sequence": st.next_sequence,
                      "low_watermark": st.low_watermark,
                      "epoch_offset": st.epoch_offset,
                      "invalid_records": st.invalid_records,
                      "oldest_open_ms": st.oldest_open_ms or 0,
                      "log_position": tc.position,
                      "restarts": self.restarts.get(tc.tc_id, 0)})
        return TcReply(req.request_id, req.client_id, tc.tc_id, stats=stats,
                       owner_id=self.worker_id)
