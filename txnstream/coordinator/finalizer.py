"""``TxnFinalizer``: carries every decided txn of the served TCs to its end.

A txn whose COMMITTING/ABORTING entry read back is decided; finishing it takes three
steps, each turn for every such txn at once (Pulsar's
``TransactionMetadataStoreService.endTransaction`` does the same per txn, through
``TransactionBufferClient`` and the pending-ack handles):

1. **Markers and marks.** A COMMIT/ABORT marker (with the TC's low watermark) to each
   partition the txn produced to and a commit/abort mark to each acked subscription's
   pending-ack log, each produced in its own try, one wait for all. A crash after this
   step leaves COMMITTING/ABORTING in the log: the next owner finds it on replay and
   writes them again (markers are idempotent for readers). A failed write is retried
   with a backoff per txn that doubles up to ``backoff_max_s``, and only the writes
   still missing are retried (:class:`_Marking`); the txn stays decided meanwhile.
   **A partition that no longer exists** (a produce error says so and a metadata
   lookup confirms it, :class:`~txnstream.kafka.topics.PartitionCatalog`) has its marker
   dropped, as Kafka drops markers for a deleted topic, so the txn still ends. A
   partition that exists but refuses the marker holds the txn (and the TC's LWM) until
   it takes it or an admin force-ends the txn (the handler's END with reason
   ``force``); the retry logs at most one line per TC per 10 s.
2. **Replies** to the END requests (and to a group's END_GROUP once its last txn ends).
   A crash before them: the client resends and the next owner answers from the log.
3. **COMMITTED/ABORTED** appended without waiting
   (:meth:`~txnstream.coordinator.ownership.TcOwnership.append_async`): if it is lost
   the incarnation is replayed and finishes the txn again.

Only txns whose COMMITTING/ABORTING entry this incarnation read back reach here (an
incarnation whose append failed was dropped before this step).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from txnstream import metrics
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.ownership import TcIncarnation, TcOwnership
from txnstream.coordinator.protocol import COMMITTED_NOTICE, ENDED_NOTICE, TcReply, TcRequest
from txnstream.coordinator.txn_log import LINGER_S, KafkaClients
from txnstream.errors import TxnStreamError
from txnstream.kafka.topics import PartitionCatalog, says_gone
from txnstream.markers import MarkerKind, MarkerSigner, TxnMarker, produce_marker
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition, TxnStatus

__all__ = ["TxnFinalizer"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

RETRY_FIRST_S = 0.1
"""First wait before writing a txn's markers again: a leader move passes in about this."""
SUSPECT_AFTER_S = 1.0
"""A marker unreported this long into a turn has its partition looked up: if the cluster
says it is gone the marker is dropped and the turn stops waiting on it. Healthy markers
are reported in milliseconds; librdkafka fails one for a deleted topic after about
``topic.metadata.propagation.max.ms`` (see :data:`txnstream.kafka.topics.NO_AUTO_CREATE`)."""

Target = TopicPartition | SubscriptionRef
"""What a decided txn writes to: a partition's marker or a subscription's mark."""


@dataclass(eq=False)
class _Marking:
    """How far one incarnation got writing one decided txn's markers and marks.

    Kept in memory only, for the incarnation's life and the txn's (bounded by the txn's
    partitions and subscriptions): a retry produces only what is neither ``done`` nor in
    flight, so a partition already marked gets no second marker from this incarnation
    (a new owner writes them all again; readers keep the first).
    """

    done: set[Target] = field(default_factory=set)
    """Written, or dropped because the partition no longer exists."""
    inflight: set[Target] = field(default_factory=set)
    """Produced, delivery not reported yet."""
    fresh: set[Target] = field(default_factory=set)
    """Produced this turn: what the turn waits for (never an older unreported one)."""
    suspect: set[TopicPartition] = field(default_factory=set)
    """Failed with an error saying the partition does not exist: to be confirmed."""
    failed: dict[Target, str] = field(default_factory=dict)
    """Failed this round, and why (retried after the backoff)."""
    dropped: set[TopicPartition] = field(default_factory=set)

    def on_delivery(self, target: Target) -> Callable[[KafkaError | None, Message], None]:
        """The delivery callback of ``target``'s record."""
        def delivered(err: KafkaError | None, _m: Message) -> None:
            self.inflight.discard(target)
            if err is None:
                self.done.add(target)
            else:
                self.report(target, err)
        return delivered

    def report(self, target: Target, err: Any) -> None:
        """``target`` failed with ``err`` (a ``KafkaError`` or the exception produce raised)."""
        self.inflight.discard(target)
        if isinstance(target, TopicPartition) and says_gone(err):
            self.suspect.add(target)
        else:
            self.failed[target] = str(err)

    def complete(self, meta: TxnMeta) -> bool:
        """Whether every marker and mark of ``meta`` is written or dropped."""
        return meta.partitions <= self.done and meta.subscriptions <= self.done

    def describe_failures(self) -> str:
        """The failed or unreported targets, for a log line (the first few)."""
        items = [f"{t}: {why}" for t, why in sorted(self.failed.items(), key=str)[:5]]
        if self.inflight:
            items.append(f"{len(self.inflight)} not reported in time")
        return "; ".join(items) or "none failed"


class TxnFinalizer:
    """Markers, marks, replies and final records for the decided txns of served TCs."""

    def __init__(self, ownership: TcOwnership, clients: KafkaClients, pending_ack_topic: str,
                 worker_id: str, reply: Callable[[TcRequest, TcReply], None], *,
                 flush_timeout_s: float, backoff_max_s: float,
                 partitions: PartitionCatalog | None = None) -> None:
        self.ownership = ownership
        self.clients = clients
        self.pending_ack_topic = pending_ack_topic
        self.worker_id = worker_id
        self._reply = reply
        self.flush_timeout_s = flush_timeout_s
        self.backoff_max_s = backoff_max_s
        self.signer: MarkerSigner | None = None
        """Signs every marker (set by the worker when it holds the workers' secret)."""
        self.partitions = partitions
        """Confirms that a partition a marker failed on is gone (None: never dropped)."""
        self._markings: weakref.WeakKeyDictionary[TcIncarnation, dict[int, _Marking]] = (
            weakref.WeakKeyDictionary())
        """Per incarnation (forgotten with it), per decided txn: what is written."""

    def due_in(self) -> float | None:
        """Seconds until finalization work is due: 0 now, None if no txn is decided.

        A decided txn is due unless it waits out a failed marker's backoff (``retry_at``);
        the worker waits for requests no longer than this. It used to ask without waiting
        while any txn was decided, so a txn held by a partition refusing its marker spun
        the worker's loop between retries
        (``test_a_worker_waiting_out_a_refused_markers_backoff_stays_idle``).
        """
        mono = time.monotonic()
        soonest: float | None = None
        for tc in self.ownership.tcs.values():
            if not self.ownership.serving(tc):
                continue
            for meta in tc.store.ending():
                at = tc.retry_at.get(meta.txn_id.least_bits, (0.0, 0))[0]
                if at <= mono:
                    return 0.0
                soonest = at - mono if soonest is None else min(soonest, at - mono)
        return soonest

    def finalize(self, now_ms: int) -> None:
        """Markers and marks for every decided txn, then replies, then COMMITTED/ABORTED.

        Each target (a partition's marker, a subscription's mark) is produced in its own
        try and only until it is written: one that fails never stops the others, and a
        retry writes only what is still missing (see :class:`_Marking`).
        """
        serving = self.ownership.serving
        mono = time.monotonic()
        work: list[tuple[TcIncarnation, int, _Marking]] = []
        for tc in list(self.ownership.tcs.values()):
            if not serving(tc):
                continue
            self._answer_force_ended(tc)
            lwm = tc.store.low_watermark
            if tc.late_aborts:
                self._write_late_aborts(tc, lwm)
            markings = self._markings.setdefault(tc, {})
            ending = tc.store.ending()
            seqs = {m.txn_id.least_bits for m in ending}
            for seq in [s for s in markings if s not in seqs]:
                del markings[seq]  # force-ended: nothing more to write
            for meta in ending:
                seq = meta.txn_id.least_bits
                if tc.retry_at.get(seq, (0.0, 0))[0] > mono:
                    continue
                marking = markings.setdefault(seq, _Marking())
                self._produce_missing(tc, meta, lwm, marking)
                work.append((tc, seq, marking))
        if not work:
            return
        self._await(work)
        for tc, seq, marking in work:
            if not serving(tc):
                continue  # restarted meanwhile: the replay finds the txn ending and retries
            self._confirm_gone(tc, seq, marking)
            meta = tc.store.txns[seq]
            if not marking.complete(meta):
                _, tries = tc.retry_at.get(seq, (0.0, 0))
                delay = min(self.backoff_max_s, RETRY_FIRST_S * 2 ** tries)
                tc.retry_at[seq] = (mono + delay, tries + 1)
                _rate_limited.warning(
                    f"markers {tc.tc_id}", "tc %d: markers of txn %s not all written (%s); "
                    "retry in %.1fs. A partition that refuses them holds the txn and the "
                    "LWM until it takes them or an admin runs `txnstream txn force-end %s`",
                    tc.tc_id, meta.txn_id, marking.describe_failures(), delay, meta.txn_id)
                marking.failed.clear()
                continue
            tc.retry_at.pop(seq, None)
            self._markings.get(tc, {}).pop(seq, None)
            self._ended(tc, seq, now_ms)
        for tc in {tc for tc, _, _ in work}:
            if serving(tc):
                self.ownership.append_async(tc, tc.store.unlogged())

    def _produce_missing(self, tc: TcIncarnation, meta: TxnMeta, lwm: int,
                         marking: _Marking) -> None:
        """Produce every marker and mark of ``meta`` not written and not in flight."""
        commit = meta.status is TxnStatus.COMMITTING
        marker = TxnMarker(meta.txn_id, MarkerKind.COMMIT if commit else MarkerKind.ABORT, lwm)
        value = marker.encode()
        producer = self.clients.producer
        marking.fresh.clear()
        for tp in sorted(meta.partitions - marking.done - marking.inflight):
            marking.inflight.add(tp)
            marking.fresh.add(tp)
            try:
                produce_marker(producer, tp, marker, self.signer, value,
                               on_delivery=marking.on_delivery(tp))
            except (KafkaException, BufferError) as exc:
                marking.report(tp, exc)
        for sub in sorted(meta.subscriptions - marking.done - marking.inflight):
            mark = _pending_ack_mark(commit, sub, meta.txn_id)
            marking.inflight.add(sub)
            marking.fresh.add(sub)
            try:
                producer.produce(self.pending_ack_topic, mark.encode(), key=mark.key(),
                                 on_delivery=marking.on_delivery(sub))
            except (KafkaException, BufferError) as exc:
                marking.report(sub, exc)

    def _await(self, work: list[tuple[TcIncarnation, int, _Marking]]) -> None:
        """Serve delivery reports until this turn's targets are reported (or the timeout).

        A target still unreported after :data:`SUSPECT_AFTER_S` whose partition the
        cluster says is gone is counted dropped at once (librdkafka may hold a record for
        a deleted topic a while before it fails it), so no turn waits long on it.
        """
        producer = self.clients.producer
        deadline = time.monotonic() + self.flush_timeout_s
        suspect_at = time.monotonic() + SUSPECT_AFTER_S
        # Send the turn's markers now, a partition's in one request: a flush overrides the
        # producer's linger (LINGER_S) while it waits, and it waits no longer than that.
        producer.flush(LINGER_S)
        while any(m.inflight & m.fresh for _, _, m in work):
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= suspect_at:
                suspect_at = deadline  # once per turn
                for tc, seq, m in work:
                    for tp in [t for t in m.inflight & m.fresh
                               if isinstance(t, TopicPartition)]:
                        if self.partitions is not None and self.partitions.gone(tp):
                            m.inflight.discard(tp)
                            self._drop(tc, seq, m, tp)
            producer.poll(min(0.05, max(0.0, deadline - now)))

    def _confirm_gone(self, tc: TcIncarnation, seq: int, marking: _Marking) -> None:
        """Drop markers whose partition is gone; the other suspects stay failed (retried).

        Gone: a produce error said the partition does not exist and the cluster confirms.
        """
        for tp in sorted(marking.suspect):
            marking.suspect.discard(tp)
            if self.partitions is not None and self.partitions.gone(tp):
                self._drop(tc, seq, marking, tp)
            else:
                marking.failed.setdefault(tp, "reported missing, but the cluster has it")

    def _drop(self, tc: TcIncarnation, seq: int, marking: _Marking, tp: TopicPartition) -> None:
        marking.done.add(tp)
        marking.failed.pop(tp, None)
        marking.dropped.add(tp)
        _rate_limited.warning(f"dropped {tc.tc_id}", "tc %d: marker of txn (%d,%d) for %s "
                              "dropped: the partition no longer exists", tc.tc_id, tc.tc_id,
                              seq, tp)

    def _answer_force_ended(self, tc: TcIncarnation) -> None:
        """Answer who waits on a txn an admin force-ended (final without the finalizer).

        Its END waiters, its group's waiters, its writer (the handler leaves an entry in
        ``end_waiters`` for a force-ended txn, so it is found here).
        """
        for seq in list(tc.end_waiters):
            meta = tc.store.txns.get(seq)
            if meta is not None and meta.status.is_final:
                tc.retry_at.pop(seq, None)
                self._answer(tc, seq)

    def _write_late_aborts(self, tc: TcIncarnation, lwm: int) -> None:
        """ABORT markers where an owner registered partitions after its txn ended.

        Best effort, once, each partition in its own try: a marker that cannot be written
        (the partition no longer exists, or refuses it) leaves the records to the buffer
        role's check of ongoing txns. Never retried, so never a loop.
        """
        late, tc.late_aborts = tc.late_aborts, []
        for txn_id, partitions in late:
            marker = TxnMarker(txn_id, MarkerKind.ABORT, lwm)
            value = marker.encode()
            for tp in partitions:
                try:
                    produce_marker(self.clients.producer, tp, marker, self.signer, value)
                except (KafkaException, BufferError) as exc:
                    _rate_limited.warning(f"late {tc.tc_id}", "tc %d: no ABORT marker for "
                                          "late partition %s of txn %s: %s", tc.tc_id, tp,
                                          txn_id, exc)

    def _ended(self, tc: TcIncarnation, seq: int, now_ms: int) -> None:
        """The markers of txn ``seq`` are written: mark it final and answer who waits.

        If it aborted, the connection that last wrote into it is told, so that writer's
        next send fails at once (a writer that aborted it itself ignores the notice).
        """
        entry = tc.store.finalize(seq, now_ms)
        meta = tc.store.txns[seq]
        if entry is not None and entry.status is not None:
            metrics.TXN_ENDED.labels(str(tc.tc_id), entry.status.value).inc()
            metrics.TXN_DURATION_SECONDS.labels(entry.status.value).observe(
                max(0.0, (now_ms - meta.open_time_ms) / 1000))
        self._answer(tc, seq)

    def _answer(self, tc: TcIncarnation, seq: int) -> None:
        """Txn ``seq`` is final: tell its writers how it ended, answer END and group waiters.

        Aborted: ``ended:`` with the reason, so a writer's next send fails. Committed:
        ``committed:``, so a writer whose txn another handle committed stops sending
        (what it sent is checked at its flush or commit, :mod:`txnstream.fate`). The
        handle that ended it itself ignores either.
        """
        meta = tc.store.txns[seq]
        watchers = tc.watchers.pop(seq, None)
        if watchers:  # none for a txn whose one writer ended it: nothing encoded then
            if meta.status is TxnStatus.ABORTED:
                why = _ended_other_way(meta)
                notice = TcReply(f"{ENDED_NOTICE}{seq}", "", tc.tc_id,
                                 error_kind=type(why).__name__, error_message=str(why),
                                 txn_seq=seq, owner_id=self.worker_id)
            else:
                notice = TcReply(f"{COMMITTED_NOTICE}{seq}", "", tc.tc_id, txn_seq=seq,
                                 owner_id=self.worker_id)
            data = notice.encode()
            for conn in watchers:
                conn.send(data)
        for req in tc.end_waiters.pop(seq, []):
            if req.commit == (meta.status is TxnStatus.COMMITTED):
                self._reply(req, TcReply(req.request_id, req.client_id, tc.tc_id,
                                         txn_seq=seq, owner_id=self.worker_id))
            else:
                self._reply(req, TcReply.failure(req, _ended_other_way(meta), self.worker_id))
        still = []
        for req, pending, reply in tc.group_waiters:
            pending.discard(seq)
            if pending:
                still.append((req, pending, reply))
            else:
                self._reply(req, reply)
        tc.group_waiters = still


def _pending_ack_mark(commit: bool, sub: Any, txn_id: Any) -> Any:
    from txnstream.pendingack.records import PendingAckEntry, PendingAckKind

    kind = PendingAckKind.COMMIT_MARK if commit else PendingAckKind.ABORT_MARK
    return PendingAckEntry.mark(kind, sub.subscription, sub.tp, txn_id)


def _ended_other_way(meta: TxnMeta) -> TxnStreamError:
    from txnstream.errors import InvalidTxnStatusError, TransactionTimeoutError

    if meta.abort_reason == "timeout":
        return TransactionTimeoutError(
            f"transaction {meta.txn_id} was aborted at its timeout of {meta.timeout_ms} ms",
            meta.txn_id)
    why = f" ({meta.abort_reason})" if meta.abort_reason else ""
    return InvalidTxnStatusError(meta.txn_id, None, meta.status,
                                 f"transaction {meta.txn_id} ended {meta.status.value}{why}")
