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
* **ADD_PARTITIONS**, **ADD_SUBSCRIPTIONS** register what a txn wrote to or acked; a
  partition that does not exist is refused (its marker could never be written).
* **END** decides one txn, **END_GROUP** every txn of a group under one key. An END
  with reason ``force`` from an admin ends a decided txn stuck on a partition that
  refuses its marker (``txnstream txn force-end``). A commit also carries what its
  client's pipelined requests may not have confirmed yet: the activation
  (``open_time_ms``) and partitions. They are applied first, as ACTIVATE and
  ADD_PARTITIONS would apply them (the same checks; a refusal fails the END and
  decides nothing), and logged before the COMMITTING entry: a commit costs one turn,
  not a registration turn and then an END turn (Kafka's EndTxn likewise needs no
  earlier reply). Their own requests, if they arrive after the decision, are answered
  OK when they add nothing (:meth:`_already_in`).
* **GET**, **LIST**, **STATS** read; LIST answers in pages of :data:`LIST_PAGE`. A GET
  names one txn (``txn_seq``) or a page of them (``group_seqs``, as many as a LIST
  page: a buffer owner's check of the txns ongoing at its partitions asks a request
  a page, not a request a txn).

Before any of them, :func:`~txnstream.coordinator.request_checks.check_request` checks
every field, and the caller's principal (proved by the line's handshake) is checked
against the txn's owner (DESIGN.md section 10, Pulsar's ``verifyTxnOwnership``): only
the principal that opened a txn may activate, add to, end or read it; an admin may read
and abort any txn, but never commit another principal's (its records are not the
admin's to vouch for). LIST shows a non-admin its own txns only. Group keys are scoped
to the principal that uses them, so another principal naming a Spark sink's key ends a
group of its own and touches nothing of the sink's. A principal holds at most
``max_open_txns`` OPEN txns per TC.

A store error (:class:`~txnstream.errors.TxnStreamError`) becomes a failure reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from txnstream.config import Config
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.ownership import TcIncarnation
from txnstream.coordinator.protocol import (
    TcOp,
    TcReply,
    TcRequest,
    TxnInfo,
    scoped_group_key,
)
from txnstream.coordinator.request_checks import check_request
from txnstream.coordinator.txn_table import ABORT_ADMIN, ABORT_CLIENT
from txnstream.errors import (
    InvalidTxnStatusError,
    NotAuthorizedError,
    TooManyRequestsError,
    TxnStreamError,
    UnknownPartitionError,
)
from txnstream.kafka.topics import PartitionCatalog
from txnstream.membership import MembershipKey
from txnstream.types import ANONYMOUS, TopicPartition, TxnID, TxnStatus

__all__ = ["FORCE_END", "MAX_RESERVE", "LIST_PAGE", "Caller", "TcRequestHandler"]

log = logging.getLogger(__name__)

MAX_RESERVE = 256
"""TxnIDs one RESERVE may open (a client's block); bounds one request's log append."""
LIST_PAGE = 25
"""Txns one LIST reply carries (about 5 KB); the client asks for the next page with
``after_seq``. A request is the unit the worker's fair turns interleave: a LIST of 1,000
(~12 ms with its reply's encoding) flooded by one principal took another's commits from
3 ms to 130-250 ms; pages of 100 to ~17, of 25 to ~10 (stop 60, RELIABILITY.md)."""
MAX_LATE_ABORTS = 10_000
"""Late registrations awaiting their ABORT marker per TC; past it they are left to the
buffer role's low-watermark rule (a bound on a hostile owner's memory)."""
MAX_OPEN_TXNS = 10_000
"""Default of OPEN txns per principal per TC (``WorkerSettings.max_open_txns_per_principal``)."""
FORCE_END = "force"
"""The ``reason`` of an END that force-ends a decided txn (admins only, see ``_force_end``)."""
MAX_NAMED = 10
"""Partitions a refusal names (the count says how many more)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, as the line's handshake proved it."""

    principal: str = ANONYMOUS
    admin: bool = True
    """May read and abort every txn (a worker that authenticates nobody treats everyone
    so: there is nobody to tell apart)."""


Handler = Callable[[TcIncarnation, TcRequest, int, Caller], "TcReply | None"]


class TcRequestHandler:
    """The per-op logic of a coordinator, over one TC incarnation's store."""

    def __init__(self, config: Config, worker_id: str, restarts: Mapping[int, int],
                 max_open_txns: int = MAX_OPEN_TXNS,
                 partitions: PartitionCatalog | None = None) -> None:
        self.config = config
        self.partitions = partitions
        """Which partitions exist: ADD_PARTITIONS refuses others (None: nothing checked)."""
        self.max_open_txns = max_open_txns
        self.worker_id = worker_id
        self.restarts = restarts
        """Replays after a failure per TC id (reported by STATS)."""
        self.membership: MembershipKey | None = None
        """The workers' membership key: replies that give TxnIDs give their txn keys
        (None: the workers hold no secret, and records are not checked for membership)."""
        self._ops: dict[TcOp, Handler] = {
            TcOp.NEW: self._new,
            TcOp.RESERVE: self._reserve,
            TcOp.ACTIVATE: self._activate,
            TcOp.ADD_PARTITIONS: self._add_partitions,
            TcOp.ADD_SUBSCRIPTIONS: self._add_subscriptions,
            TcOp.END: self._end,
            TcOp.PREPARE: self._prepare,
            TcOp.END_GROUP: self._end_group,
            TcOp.GET: self._get,
            TcOp.LIST: self._list,
            TcOp.STATS: self._stats,
        }

    def handle(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
               caller: Caller = Caller()) -> TcReply | None:
        """Apply one request to the store; its reply, or None if it waits (END).

        The entries it planned are taken from ``store.unlogged()`` by the caller, also
        when it failed; the reply is sent only after they read back.
        """
        op = self._ops[req.op]
        try:
            check_request(req, self._max_timeout_ms, MAX_RESERVE,
                          int(self.config.max_prepared_s * 1000))
            return op(tc, req, now_ms, caller)
        except TxnStreamError as exc:
            return TcReply.failure(req, exc, self.worker_id)

    @property
    def _max_timeout_ms(self) -> int:
        return int(self.config.max_txn_timeout_s * 1000)

    def _timeout_ms(self, req: TcRequest) -> int:
        """The txn timeout (or lease) asked for (checked against the maximum), or the default."""
        return req.timeout_ms or int(self.config.default_txn_timeout_s * 1000)

    def _owned(self, tc: TcIncarnation, seq: int, caller: Caller, what: str,
               admin_may: bool = True) -> TxnMeta:
        """The txn, if ``caller`` may ``what`` it; ``NotAuthorizedError`` otherwise.

        An unknown txn is ``TransactionNotFoundError`` to anyone (TxnIDs are sequential:
        that one exists tells nothing).
        """
        meta = tc.store.get(seq)
        if meta.owner == caller.principal or (caller.admin and admin_may):
            return meta
        txn_id = TxnID(tc.tc_id, seq)
        raise NotAuthorizedError(
            f"principal {caller.principal!r} may not {what} transaction {txn_id}: it is "
            "not a transaction this principal opened", txn_id)

    def _room(self, tc: TcIncarnation, caller: Caller, count: int) -> None:
        held = tc.store.open_by_owner.get(caller.principal, 0)
        if held + count > self.max_open_txns:
            raise TooManyRequestsError(
                f"principal {caller.principal!r} holds {held} open transactions on "
                f"coordinator {tc.tc_id}; {count} more would pass its limit of "
                f"{self.max_open_txns} (max_open_txns_per_principal): end some first")

    def _ok(self, tc: TcIncarnation, req: TcRequest) -> TcReply:
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                       owner_id=self.worker_id)

    # ------------------------------------------------------------ opening

    def _new(self, tc: TcIncarnation, req: TcRequest, now_ms: int, caller: Caller) -> TcReply:
        if req.request_id not in tc.store.seen_requests:
            self._room(tc, caller, 1)
        key = scoped_group_key(caller.principal, req.group_key) if req.group_key else None
        meta, _ = tc.store.new_txn(req.request_id, self._timeout_ms(req), now_ms, key,
                                   caller.principal)
        return TcReply(req.request_id, req.client_id, tc.tc_id,
                       txn_seq=meta.txn_id.least_bits, owner_id=self.worker_id,
                       txn_keys=self._keys(tc.tc_id, (meta.txn_id.least_bits,)))

    def _keys(self, tc_id: int, seqs: Sequence[int]) -> tuple[bytes, ...]:
        """The txn keys of ``seqs`` of TC ``tc_id`` (none without a membership key)."""
        m = self.membership
        if m is None:
            return ()
        return tuple(m.txn_key(TxnID(tc_id, s)) for s in seqs)

    def _reserve(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                 caller: Caller) -> TcReply:
        count = req.count
        if req.request_id not in tc.store.seen_requests:
            self._room(tc, caller, count)
        seqs = tc.store.reserve(req.request_id, count, self._timeout_ms(req), now_ms,
                                caller.principal)
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=seqs[0],
                       group_seqs=tuple(seqs), owner_id=self.worker_id,
                       txn_keys=self._keys(tc.tc_id, seqs))

    def _activate(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                  caller: Caller) -> TcReply:
        meta = self._owned(tc, req.txn_seq, caller, "activate", admin_may=False)
        if self._already_in(meta, not meta.reserved):
            return self._ok(tc, req)
        tc.store.activate(req.txn_seq, self._timeout_ms(req), req.open_time_ms, now_ms,
                          req.request_id)
        return self._ok(tc, req)

    # ------------------------------------------------------------ registering

    def _add_partitions(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                        caller: Caller) -> TcReply:
        meta = self._owned(tc, req.txn_seq, caller, "add partitions to", admin_may=False)
        if self._already_in(meta, meta.partitions.issuperset(req.partitions)):
            return self._ok(tc, req)
        if self.partitions is not None and meta.status is TxnStatus.OPEN \
                and now_ms < meta.deadline_ms:  # an ended txn is refused as it was
            self._check_exist(req, set(req.partitions) - meta.partitions)
        try:
            tc.store.add_partitions(req.txn_seq, req.partitions, now_ms, req.request_id)
        except TxnStreamError:
            # The txn has ended (or is past its deadline): its writer may already have
            # sent records there, which no marker of the txn covers. An ABORT marker
            # makes them stragglers of an ended txn, never a block for readers.
            late = tuple(sorted(set(req.partitions) - meta.partitions))
            if late and len(tc.late_aborts) < MAX_LATE_ABORTS:
                tc.late_aborts.append((meta.txn_id, late))
            raise
        return self._ok(tc, req)

    @staticmethod
    def _already_in(meta: TxnMeta, nothing_new: bool) -> bool:
        """Whether a registration (or activation) is already part of a committing txn.

        Its commit carried it (:meth:`_end`), so a pipelined request that arrives after
        the decision is confirmed, not refused: it adds nothing, and the txn ends as
        decided. One that would add something is refused as before (too late to join).
        """
        return nothing_new and meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)

    def _check_exist(self, req: TcRequest, new: set[TopicPartition]) -> None:
        """Refuse partitions that do not exist (their marker could never be written).

        The cache answers for partitions it knows, with no call to the cluster; a miss is
        looked up, rate-limited (:class:`~txnstream.kafka.topics.PartitionCatalog`). A
        refusal is an ``InvalidRequestError`` naming them: the request is not applied and
        nothing restarts.
        """
        assert self.partitions is not None
        missing = self.partitions.missing(new) if new else []
        if missing:
            named = ", ".join(str(tp) for tp in missing[:MAX_NAMED])
            more = f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
            raise UnknownPartitionError(
                f"ADD_PARTITIONS request refused: {named}{more} does not exist (no such "
                "topic, or the topic has fewer partitions); a marker could never be "
                "written there", TxnID(req.tc_id, req.txn_seq))

    def _add_subscriptions(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                           caller: Caller) -> TcReply:
        self._owned(tc, req.txn_seq, caller, "add subscriptions to", admin_may=False)
        tc.store.add_subscriptions(req.txn_seq, req.subscriptions, now_ms, req.request_id)
        return self._ok(tc, req)

    # ------------------------------------------------------------ ending

    def _end(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
             caller: Caller) -> TcReply | None:
        if req.reason == FORCE_END:
            return self._force_end(tc, req, now_ms, caller)
        # a prepared txn's records were vouched for by its owner at PREPARE: an admin may
        # complete it either way (recovery tooling); an open one only abort
        meta = self._owned(tc, req.txn_seq, caller, "commit" if req.commit else "abort",
                           admin_may=not req.commit or tc.store.get(req.txn_seq).status
                           is TxnStatus.PREPARED)
        if req.commit and meta.status is TxnStatus.OPEN:
            self._carried(tc, req, meta, now_ms, caller)
        reason = ABORT_ADMIN if req.reason == ABORT_ADMIN and caller.admin else ABORT_CLIENT
        res = tc.store.end_txn(req.txn_seq, req.commit, now_ms, reason, req.request_id)
        # Answered once the decision reads back (the worker sends no reply before its
        # entries do), not after the markers: Kafka's order. ``already``: another request
        # decided it, so some of this writer's records may follow the markers; its client
        # checks each by the readers' rule (txnstream.fate).
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                       owner_id=self.worker_id,
                       already=res.meta.decided_by != req.request_id)

    def _carried(self, tc: TcIncarnation, req: TcRequest, meta: TxnMeta, now_ms: int,
                 caller: Caller) -> None:
        """Apply what a commit or prepare carries, before the decision.

        What the client's pipeline may not have confirmed yet: applied (and logged) with
        the checks of their own requests.
        """
        if req.open_time_ms and meta.reserved:
            self._activate(tc, req, now_ms, caller)
        if req.partitions:
            self._add_partitions(tc, req, now_ms, caller)

    def _prepare(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                 caller: Caller) -> TcReply:
        """Log the txn PREPARED (its carried registrations first), answered once durable.

        Its owner's only: an admin may complete a prepared txn, never vouch for one.
        """
        meta = self._owned(tc, req.txn_seq, caller, "prepare", admin_may=False)
        if meta.status is TxnStatus.OPEN:
            self._carried(tc, req, meta, now_ms, caller)
        max_ms = req.max_prepared_ms or int(self.config.default_max_prepared_s * 1000)
        tc.store.prepare(req.txn_seq, max_ms, now_ms, req.request_id)
        return self._ok(tc, req)

    def _force_end(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                   caller: Caller) -> TcReply:
        """End a decided txn now, with whatever markers were written (admins only).

        For a txn stuck because a partition that still exists refuses its marker: a
        COMMITTING txn is logged COMMITTED, an ABORTING one ABORTED, and the reply waits
        for that record to read back like any other. Markers not written are never
        written by the coordinator (docs/coordinator.md says what readers then see). An
        OPEN txn is refused (abort it); a final one is answered as it is. Those who wait
        on the txn are answered by the finalizer (it finds the entry left in
        ``end_waiters``).
        """
        txn_id = TxnID(tc.tc_id, req.txn_seq)
        if not caller.admin:
            raise NotAuthorizedError(
                f"principal {caller.principal!r} may not force-end transaction {txn_id}: "
                "only an admin may", txn_id)
        meta = tc.store.get(req.txn_seq)
        if meta.status is TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                txn_id, TxnStatus.COMMITTING, meta.status,
                f"transaction {txn_id} is OPEN: abort it (`txnstream txn abort`); force-end "
                "only ends a COMMITTING or ABORTING transaction whose markers cannot all be "
                "written")
        if meta.status.is_ending:
            was = meta.status.value
            tc.store.finalize(req.txn_seq, now_ms)
            tc.retry_at.pop(req.txn_seq, None)
            tc.end_waiters.setdefault(req.txn_seq, [])  # the finalizer answers who waits
            log.warning("tc %d: transaction %s force-ended %s by admin %r (it was %s; "
                        "markers not written by then never will be)", tc.tc_id, txn_id,
                        meta.status.value, caller.principal, was)
        return self._ok(tc, req)

    def _end_group(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
                   caller: Caller) -> TcReply | None:
        store = tc.store
        for seq in req.group_seqs:
            self._owned(tc, seq, caller, "end (in a group)", admin_may=False)
        g = store.end_group(scoped_group_key(caller.principal, req.group_key or ""),
                            req.group_seqs, req.commit, now_ms, req.request_id)
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
        if not pending:  # an empty group: nothing to wait for
            return reply
        tc.group_waiters.append((req, pending, reply))
        return None

    # ------------------------------------------------------------ reading

    def _get(self, tc: TcIncarnation, req: TcRequest, now_ms: int, caller: Caller) -> TcReply:
        if req.group_seqs:
            return self._get_many(tc, req, caller)
        meta = self._owned(tc, req.txn_seq, caller, "read")
        # The key goes to who may write the txn: its owner (attach_transaction), or an
        # admin (who may end it anyway).
        return TcReply(req.request_id, req.client_id, tc.tc_id, txn_seq=req.txn_seq,
                       txns=(TxnInfo.of(meta),), owner_id=self.worker_id,
                       txn_keys=self._keys(tc.tc_id, (req.txn_seq,)))

    def _get_many(self, tc: TcIncarnation, req: TcRequest, caller: Caller) -> TcReply:
        """A page of txns (``group_seqs``: ``request_checks.GET_PAGE`` at most); no keys.

        ``txns``: those the caller may read; ``group_seqs``: those not known here;
        ``stats``: ``next_sequence`` (to tell never issued from forgotten). A txn in
        neither was not answered (not the caller's to read): the asker must not take it
        for unknown.
        """
        found: list[TxnInfo] = []
        unknown: list[int] = []
        for seq in dict.fromkeys(req.group_seqs):
            if (meta := tc.store.txns.get(seq)) is None:
                unknown.append(seq)
            elif meta.owner == caller.principal or caller.admin:
                found.append(TxnInfo.of(meta))
        return TcReply(req.request_id, req.client_id, tc.tc_id, group_seqs=tuple(unknown),
                       txns=tuple(found), stats={"next_sequence": tc.store.next_sequence},
                       owner_id=self.worker_id)

    def _list(self, tc: TcIncarnation, req: TcRequest, now_ms: int, caller: Caller) -> TcReply:
        """One page of txns above ``after_seq``, in sequence order.

        Reserved ones (no writer holds them yet) are not listed.
        """
        page: list[TxnMeta] = []
        more = False
        # in order from the index, and a non-admin's own txns only: no sort, no scan
        for seq in tc.store.index.after(req.after_seq, None if caller.admin
                                        else caller.principal):
            m = tc.store.txns[seq]
            if m.reserved and m.status is TxnStatus.OPEN:
                continue
            if req.min_age_ms > 0 and not (m.status is TxnStatus.OPEN and
                                           now_ms - m.open_time_ms >= req.min_age_ms):
                continue
            if len(page) == LIST_PAGE:
                more = True
                break
            page.append(m)
        return TcReply(req.request_id, req.client_id, tc.tc_id,
                       txns=tuple(TxnInfo.of(m) for m in page), owner_id=self.worker_id,
                       more=more)

    def _stats(self, tc: TcIncarnation, req: TcRequest, now_ms: int,
               caller: Caller) -> TcReply:
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
