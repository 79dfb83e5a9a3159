"""``PendingAckStore``: the pending-ack log on Kafka (``<prefix>_pending_ack``).

Every record of one (subscription, topic partition) has the key
``subscription|topic|partition`` and lands, by murmur2, in one log partition, in order.
The owner of a subscription partition:

1. :meth:`replay` reads that log partition from its start and folds the records of its
   key into a :class:`PendingAckHandle` (before delivering anything);
2. appends an ``OWNER`` record with a newer generation, at least the log's end offset
   (fencing older owners, also after retention removed their records);
3. logs each transactional ack (:meth:`append`) before the ack is confirmed: the
   transaction's commit waits for those writes (:meth:`flush_txn`) and reads them back
   (:meth:`read_back`); a newer ``OWNER`` met on the way fences the member and makes
   the transaction abort-only, so a paused zombie cannot commit a duplicate;
4. :meth:`poll_marks` tails the log for the coordinator's COMMIT/ABORT marks and for a
   newer ``OWNER`` (then this member is fenced for that partition).

A crash after logging an ack but before the commit leaves a pending ack in the log: the
coordinator aborts the txn at its timeout and writes an ABORT mark, and whoever owns the
partition then redelivers the message.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.config import Config
from txnstream.errors import CorruptRecordError, TxnStreamError, message_error
from txnstream.fencing import write_owner_record
from txnstream.kafka.clients import close_producer
from txnstream.kafka.fetch import KafkaRecord, consume, delivered_at, delivered_offset, read_to
from txnstream.kafka.partitioning import murmur2_partition
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    CHECKPOINT_HEADER,
    Checkpointed,
    PendingAckCheckpoint,
    PendingAckEntry,
    PendingAckKind,
    is_checkpoint,
    key_of,
)
from txnstream.types import TopicPartition, TxnID

__all__ = ["PendingAckStore"]

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 30.0
"""How long a commit waits for its ack records to be durable."""
REPLAY_TIMEOUT_S = 120.0
"""How long a new owner may take to fold its log range before it gives the claim up
(and retries it); replay is bounded by the log's retention and checkpoints."""


class _CheckpointGone(TxnStreamError):
    """The checkpoint a pointer names is not in the log (retention) or not readable."""


class PendingAckStore:
    """Reads and writes one consumer's subscription partitions in the pending-ack log."""

    def __init__(self, config: Config, subscription: str, member_id: str) -> None:
        self.config = config
        self.topic = config.topics.pending_ack
        self.subscription = subscription
        self.member_id = member_id
        self._producer = Producer(config.producer(**{"linger.ms": 1}))
        meta = self._producer.list_topics(self.topic, timeout=config.admin_timeout_s)
        tmeta = meta.topics.get(self.topic)
        if tmeta is None or tmeta.error is not None:
            raise TxnStreamError(f"topic {self.topic} does not exist: run `txnstream init`")
        self.partitions = len(tmeta.partitions)
        self._tail = Consumer(config.consumer(f"{config.topics.prefix}-pa-{uuid.uuid4().hex}",
                                              **{"fetch.wait.max.ms": 20}))
        self._tailing: set[int] = set()
        self._lock = threading.Lock()
        self._outstanding: dict[TxnID, int] = defaultdict(int)
        self._failed: dict[TxnID, str] = {}
        self._written: dict[TxnID, dict[int, int]] = defaultdict(dict)
        """txn -> log partition -> highest offset of its ack records there."""
        self._tail_pos: dict[int, int] = {}
        self._replayed_to: dict[TopicPartition, int] = {}
        self.replayed_records = 0
        """Log records the latest replay read (what a checkpoint bounds)."""

    def log_partition(self, tp: TopicPartition) -> int:
        """The log partition that holds ``tp``'s records for this subscription."""
        return murmur2_partition(key_of(self.subscription, tp), self.partitions)

    def replay(self, tp: TopicPartition, pointer: Checkpointed | None = None
               ) -> PendingAckHandle:
        """Rebuild ``tp``'s handle from the log, up to its current end.

        With a ``pointer`` (the latest checkpoint, from the group's committed offset
        metadata) it folds from the checkpoint's position: replay time is bounded by the
        checkpoint interval, not by the log's length. Without one, or if the checkpoint
        is gone (the log's retention passed it), it folds from the log start. The end
        read up to is remembered: :meth:`claim` folds what lands after it.
        """
        part = self.log_partition(tp)
        handle = PendingAckHandle(self.subscription, tp)
        end = None
        if pointer is not None:
            try:
                end = self._fold_range(handle, part, pointer.position, None, pointer.at)
            except _CheckpointGone as exc:
                log.warning("%s: %s; replaying the pending-ack log from its start", tp, exc)
                handle = PendingAckHandle(self.subscription, tp)
        if end is None:
            end = self._fold_range(handle, part, None, None)
        with self._lock:
            self._replayed_to[tp] = end
        return handle

    def _fold_range(self, handle: PendingAckHandle, part: int, start: int | None,
                    through: int | None, checkpoint_at: int | None = None) -> int:
        """Fold ``handle``'s records of log partition ``part``; the next offset to read.

        From ``start`` (default: the log start) through offset ``through`` (default: the
        end found now). With ``checkpoint_at``, the checkpoint there holds the state as
        of ``start``: records of the key before it are folded after restoring it.
        """
        key = key_of(self.subscription, handle.tp)
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-pr-{uuid.uuid4().hex}"))
        early: list[KafkaRecord] = []
        try:
            ktp = KafkaTP(self.topic, part)
            low, high = c.get_watermark_offsets(ktp, timeout=self.config.admin_timeout_s)
            if checkpoint_at is not None and (start is None or start < low
                                              or checkpoint_at >= high):
                raise _CheckpointGone(f"checkpoint at {self.topic}[{part}]@{checkpoint_at} "
                                      f"is outside the log ({low}..{high})")
            pos = low if start is None else max(start, low)
            end = high if through is None else through + 1
            if end > pos:
                ktp.offset = pos
                c.assign([ktp])
                try:
                    for batch in read_to(c, self.topic, part, end, REPLAY_TIMEOUT_S, 5000):
                        for m in batch:
                            if message_error(m, f"pending-ack replay of {handle.tp}", log):
                                continue
                            if m.offset() >= end:
                                break
                            pos = m.offset() + 1
                            if m.key() != key:
                                continue
                            if checkpoint_at is None:
                                if not is_checkpoint(m.headers()):
                                    self._apply(handle, m)
                            elif m.offset() < checkpoint_at:
                                early.append(m)
                            elif m.offset() == checkpoint_at:
                                self._restore(handle, m)
                                for e in early:
                                    if not is_checkpoint(e.headers()):
                                        self._apply(handle, e)
                                early.clear()
                                checkpoint_at = None
                            else:
                                raise _CheckpointGone(f"no checkpoint of {handle.tp} at "
                                                      f"{self.topic}[{part}]@{checkpoint_at}")
                except TimeoutError as exc:
                    raise TxnStreamError(
                        f"could not replay the pending-ack log of {handle.tp} "
                        f"({self.topic}[{part}] from {start} up to {end}): {exc}") from exc
            if checkpoint_at is not None:
                raise _CheckpointGone(f"no checkpoint of {handle.tp} at "
                                      f"{self.topic}[{part}]@{checkpoint_at}")
            self.replayed_records = pos - (low if start is None else max(start, low))
            return max(pos, end)
        finally:
            c.close()

    def _restore(self, handle: PendingAckHandle, m: KafkaRecord) -> None:
        try:
            handle.restore(PendingAckCheckpoint.decode(m.value()))
        except CorruptRecordError as exc:
            raise _CheckpointGone(f"unreadable checkpoint at {m.topic()}[{m.partition()}]"
                                  f"@{m.offset()}: {exc}") from exc

    def checkpoint(self, handle: PendingAckHandle, position: int) -> Checkpointed | None:
        """Write ``handle``'s state as of log ``position``; where to replay from then.

        Everything of its key before ``position`` must be reflected in the state. None
        if the write failed (the previous checkpoint stays valid).
        """
        ckpt = handle.checkpoint()
        written: list[int] = []

        def delivered(err: KafkaError | None, m: Message) -> None:
            if err is None:
                written.append(delivered_offset(m))
            else:
                log.warning("pending-ack checkpoint of %s not written: %s", handle.tp, err)

        self._producer.produce(self.topic, ckpt.encode(), key=ckpt.key(),
                               partition=self.log_partition(handle.tp),
                               headers=[(CHECKPOINT_HEADER, b"checkpoint")],
                               on_delivery=delivered)
        self._producer.flush(FLUSH_TIMEOUT_S)
        return Checkpointed(position, written[0]) if written else None

    def tail_position(self, tp: TopicPartition) -> int:
        """The next offset the tail reads in ``tp``'s log partition."""
        with self._lock:
            return self._tail_pos.get(self.log_partition(tp), -1)

    def _apply(self, handle: PendingAckHandle, m: KafkaRecord) -> PendingAckEntry | None:
        try:
            entry = PendingAckEntry.decode(m.value())
        except CorruptRecordError as exc:
            log.error("skipping unreadable pending-ack record at %s[%d]@%d: %s",
                      m.topic(), m.partition(), m.offset(), exc)
            return None
        handle.apply(entry)
        return entry

    def claim(self, handle: PendingAckHandle, cursor: int, log_epoch: int = -1) -> int:
        """Append this member's OWNER record (a newer generation); fold up to it.

        ``log_epoch``: the log ``cursor`` is on (-1 not known); newer than the handle's,
        the fold of the OWNER starts the state over on that log
        (:meth:`PendingAckHandle.new_log`), for this owner and every later replay.

        The generation is at least the log end :meth:`replay` read to, and above the
        latest one folded. So a generation is never above its own OWNER's offset, and
        every generation handed out before is below the new one: offsets only grow,
        even when retention has removed every OWNER and checkpoint of the partition (a
        paused zombie that claimed long ago is still fenced). Counting from the last
        OWNER seen, as before, started again at 0 after retention.

        Records that landed between the end :meth:`replay` read to and this OWNER are
        valid in the log (a zombie's late ack is one: it precedes the OWNER, so the
        zombie's read-back finds no OWNER before it and its txn commits). They are
        folded here, before anything is delivered, so the new owner holds such a
        message back instead of delivering it a second time. Returns the OWNER's
        offset: the caller tails from the next one on (:meth:`resume_tail`).
        """
        part = self.log_partition(handle.tp)
        with self._lock:
            start = self._replayed_to.pop(handle.tp, None)
        # not replayed by this store: fold from the log start, the log's end is the floor
        floor = self._log_end(part) if start is None else start
        entry = PendingAckEntry(PendingAckKind.OWNER, self.subscription, handle.tp.topic,
                                handle.tp.partition,
                                generation=max(handle.generation + 1, floor),
                                member_id=self.member_id, cursor=cursor,
                                log_epoch=log_epoch)
        w = write_owner_record(self._producer, self.topic, part, entry.key(), entry.encode(),
                               FLUSH_TIMEOUT_S)
        if w.undelivered or w.error is not None or w.offset is None:
            why = w.error if w.error is not None else "not acknowledged in time"
            raise TxnStreamError(f"could not claim {handle.tp} in {self.topic}: {why}")
        owner_at = w.offset
        self._fold_range(handle, part, start, owner_at)
        if handle.generation != entry.generation or handle.owner != self.member_id:
            raise TxnStreamError(f"claim of {handle.tp} lost to a concurrent owner "
                                 f"(generation {handle.generation})")
        return owner_at

    def _log_end(self, part: int) -> int:
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-pr-{uuid.uuid4().hex}"))
        try:
            return int(c.get_watermark_offsets(KafkaTP(self.topic, part),
                                               timeout=self.config.admin_timeout_s)[1])
        finally:
            c.close()

    def resume_tail(self, tp: TopicPartition, pos: int) -> None:
        """The tail reads ``part`` from ``pos`` on (or from earlier, if it is behind).

        Records a tail read past ``pos`` before this partition's handle existed were
        dropped for it: the tail goes back to ``pos`` (others' records read twice are
        idempotent: marks apply once, stale OWNERs are ignored). The caller registers
        the handle under the consumer lock that serialises the tail's readers.
        """
        part = self.log_partition(tp)
        with self._lock:
            if part not in self._tailing:
                self._tailing.add(part)
                self._tail.incremental_assign([KafkaTP(self.topic, part, pos)])
                self._tail_pos[part] = pos
            elif self._tail_pos.get(part, -1) > pos:
                # unassign + assign rather than seek: valid in any fetch state
                self._tail.incremental_unassign([KafkaTP(self.topic, part)])
                self._tail.incremental_assign([KafkaTP(self.topic, part, pos)])
                self._tail_pos[part] = pos

    def append(self, entry: PendingAckEntry) -> None:
        """Log a transactional ack; its txn's commit waits for it (:meth:`flush_txn`)."""
        txn = entry.txn_id
        assert txn is not None
        with self._lock:
            self._outstanding[txn] += 1

        def delivered(err: KafkaError | None, m: Message) -> None:
            with self._lock:
                if err is not None:
                    self._failed[txn] = str(err)
                else:
                    w = self._written[txn]
                    part, off = delivered_at(m)
                    w[part] = max(w.get(part, -1), off)
                self._outstanding[txn] -= 1
                if self._outstanding[txn] <= 0:
                    del self._outstanding[txn]

        self._producer.produce(self.topic, entry.encode(), key=entry.key(),
                               partition=self.log_partition(entry.tp), on_delivery=delivered)

    def append_plain(self, entry: PendingAckEntry) -> None:
        """Log a plain individual ack above the cursor: kept across a rebalance.

        DESIGN section 7. Fire and forget: a lost one only means one redelivery.
        """
        self._producer.produce(self.topic, entry.encode(), key=entry.key(),
                               partition=self.log_partition(entry.tp))
        self._producer.poll(0)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every record written so far is durable; False if some were not."""
        return self._producer.flush(timeout_s) == 0

    def flush_txn(self, txn: TxnID) -> None:
        """Wait until every ack record of ``txn`` is durable; raise if one failed."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while True:
            with self._lock:
                left = self._outstanding.get(txn, 0)
                failed = self._failed.pop(txn, None)
            if failed:
                raise TxnStreamError(f"ack of {txn} could not be logged: {failed}", txn)
            if not left:
                return
            if time.monotonic() > deadline:
                raise TxnStreamError(f"{left} ack records of {txn} not durable in time", txn)
            self._producer.poll(0.005)

    def read_back(self, txn: TxnID) -> bool:
        """Whether the tail has read every ack record of ``txn`` (they are durable)."""
        with self._lock:
            written = dict(self._written.get(txn, {}))
        return all(self._tail_pos.get(p, -1) > off for p, off in written.items())

    def confirmed(self, txn: TxnID) -> None:
        """The acks of ``txn`` so far were read back: a later check needs no tail."""
        with self._lock:
            self._written.pop(txn, None)

    def forget(self, txn: TxnID) -> None:
        """Drop the bookkeeping of a txn: its acks were read back, or it ended."""
        with self._lock:
            self._written.pop(txn, None)
            self._failed.pop(txn, None)

    def tracked_txns(self) -> int:
        """Txns with bookkeeping here (bounded by the txns in flight: a test checks it)."""
        with self._lock:
            return len(set(self._written) | set(self._failed) | set(self._outstanding))

    def poll_marks(self) -> list[PendingAckEntry]:
        """New records of the tailed log partitions (marks, OWNER claims, acks)."""
        if not self._tailing:
            return []
        out = []
        for m in consume(self._tail, 1000, 0):
            if message_error(m, f"pending-ack tail of {self.subscription}", log):
                continue
            self._tail_pos[m.partition()] = m.offset() + 1
            if is_checkpoint(m.headers()):
                continue  # a state for replays; the tail's readers hold the live state
            try:
                out.append(PendingAckEntry.decode(m.value()))
            except CorruptRecordError as exc:
                log.error("skipping unreadable pending-ack record at %s[%d]@%d: %s",
                          m.topic(), m.partition(), m.offset(), exc)
        return [e for e in out if e.subscription == self.subscription]

    def close(self) -> None:
        """Flush and release."""
        close_producer(self._producer, 5)
        self._tail.close()
