"""``TxnFinalizer``: carries every decided txn of the served TCs to its end.

A txn whose COMMITTING/ABORTING entry read back is decided; finishing it takes three
steps, each turn for every such txn at once (Pulsar's
``TransactionMetadataStoreService.endTransaction`` does the same per txn, through
``TransactionBufferClient`` and the pending-ack handles):

1. **Markers and marks.** A COMMIT/ABORT marker (with the TC's low watermark) to each
   partition the txn produced to and a commit/abort mark to each acked subscription's
   pending-ack log, one flush for all. A crash after this step leaves COMMITTING/ABORTING
   in the log: the next owner finds it on replay and writes them again (markers are
   idempotent for readers). A failed write is retried with a backoff per txn that
   doubles up to ``backoff_max_s``; the txn stays decided meanwhile.
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
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from txnstream import metrics
from txnstream.coordinator.meta import TxnMeta
from txnstream.coordinator.ownership import TcIncarnation, TcOwnership
from txnstream.coordinator.protocol import ENDED_NOTICE, TcReply, TcRequest
from txnstream.coordinator.txn_log import KafkaClients
from txnstream.errors import TxnStreamError
from txnstream.markers import MarkerKind, MarkerSigner, TxnMarker
from txnstream.types import TxnStatus

__all__ = ["TxnFinalizer"]

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1
"""First wait before writing a txn's markers again: a leader move passes in about this."""


class TxnFinalizer:
    """Markers, marks, replies and final records for the decided txns of served TCs."""

    def __init__(self, ownership: TcOwnership, clients: KafkaClients, pending_ack_topic: str,
                 worker_id: str, reply: Callable[[TcRequest, TcReply], None], *,
                 flush_timeout_s: float, backoff_max_s: float) -> None:
        self.ownership = ownership
        self.clients = clients
        self.pending_ack_topic = pending_ack_topic
        self.worker_id = worker_id
        self._reply = reply
        self.flush_timeout_s = flush_timeout_s
        self.backoff_max_s = backoff_max_s
        self.signer: MarkerSigner | None = None
        """Signs every marker (set by the worker when it holds the workers' secret)."""

    def _headers(self, marker: TxnMarker, topic: str, partition: int,
                 value: bytes) -> list[tuple[str, str | bytes | None]]:
        if self.signer is None:
            return marker.headers()
        return self.signer.headers(marker, topic, partition, value)

    def finalize(self, now_ms: int) -> None:
        """Markers and marks for every decided txn, then replies, then COMMITTED/ABORTED."""
        serving = self.ownership.serving
        producer = self.clients.producer
        mono = time.monotonic()
        work: list[tuple[TcIncarnation, int]] = []
        failed: set[tuple[int, int]] = set()
        for tc in list(self.ownership.tcs.values()):
            if not serving(tc):
                continue
            lwm = tc.store.low_watermark
            if tc.late_aborts:
                self._write_late_aborts(tc, lwm)
            for meta in tc.store.ending():
                seq = meta.txn_id.least_bits
                if tc.retry_at.get(seq, (0.0, 0))[0] > mono:
                    continue
                commit = meta.status is TxnStatus.COMMITTING
                key = (tc.tc_id, seq)

                def on_delivery(err: KafkaError | None, _m: Message,
                                key: tuple[int, int] = key) -> None:
                    if err is not None:
                        failed.add(key)

                marker = TxnMarker(meta.txn_id, MarkerKind.COMMIT if commit else MarkerKind.ABORT,
                                   lwm)
                value = marker.encode()
                try:
                    for tp in sorted(meta.partitions):
                        producer.produce(tp.topic, value, partition=tp.partition,
                                         headers=self._headers(marker, tp.topic, tp.partition,
                                                               value),
                                         on_delivery=on_delivery)
                    for sub in sorted(meta.subscriptions):
                        mark = _pending_ack_mark(commit, sub, meta.txn_id)
                        producer.produce(self.pending_ack_topic, mark.encode(),
                                         key=mark.key(), on_delivery=on_delivery)
                except (KafkaException, BufferError) as exc:
                    log.warning("tc %d: markers for txn %s not produced: %s", tc.tc_id,
                                meta.txn_id, exc)
                    failed.add(key)
                work.append((tc, seq))
        if not work:
            return
        remaining = producer.flush(self.flush_timeout_s)
        for tc, seq in work:
            if not serving(tc):
                continue  # restarted meanwhile: the replay finds the txn ending and retries
            if remaining or (tc.tc_id, seq) in failed:
                _, tries = tc.retry_at.get(seq, (0.0, 0))
                delay = min(self.backoff_max_s, RETRY_FIRST_S * 2 ** tries)
                tc.retry_at[seq] = (mono + delay, tries + 1)
                log.warning("tc %d: markers for txn (%d,%d) not written; retry in %.1fs",
                            tc.tc_id, tc.tc_id, seq, delay)
                continue
            tc.retry_at.pop(seq, None)
            self._ended(tc, seq, now_ms)
        for tc in {tc for tc, _ in work}:
            if serving(tc):
                self.ownership.append_async(tc, tc.store.unlogged())

    def _write_late_aborts(self, tc: TcIncarnation, lwm: int) -> None:
        """ABORT markers where an owner registered partitions after its txn ended.

        Best effort, once: a marker that cannot be written (the partition does not
        exist) leaves the records to the buffer role's low-watermark rule.
        """
        late, tc.late_aborts = tc.late_aborts, []
        for txn_id, partitions in late:
            marker = TxnMarker(txn_id, MarkerKind.ABORT, lwm)
            value = marker.encode()
            for tp in partitions:
                try:
                    self.clients.producer.produce(
                        tp.topic, value, partition=tp.partition,
                        headers=self._headers(marker, tp.topic, tp.partition, value))
                except (KafkaException, BufferError) as exc:
                    log.warning("tc %d: no ABORT marker for late partition %s of txn %s: "
                                "%s", tc.tc_id, tp, txn_id, exc)

    def _ended(self, tc: TcIncarnation, seq: int, now_ms: int) -> None:
        """The markers of txn ``seq`` are written: mark it final and answer who waits.

        If it aborted, the connection that last wrote into it is told, so that writer's
        next send fails at once (a writer that aborted it itself ignores the notice).
        """
        entry = tc.store.finalize(seq, now_ms)
        meta = tc.store.txns[seq]
        watcher = tc.watchers.pop(seq, None)
        if watcher is not None and meta.status is TxnStatus.ABORTED:
            watcher.send(TcReply(f"{ENDED_NOTICE}{seq}", "", tc.tc_id,
                                 error_kind=type(_ended_other_way(meta)).__name__,
                                 error_message=str(_ended_other_way(meta)), txn_seq=seq,
                                 owner_id=self.worker_id).encode())
        if entry is not None and entry.status is not None:
            metrics.TXN_ENDED.labels(str(tc.tc_id), entry.status.value).inc()
            metrics.TXN_DURATION_SECONDS.labels(entry.status.value).observe(
                max(0.0, (now_ms - meta.open_time_ms) / 1000))
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
