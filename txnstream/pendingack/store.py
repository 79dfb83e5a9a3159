"""``PendingAckStore``: the pending-ack log on Kafka (``<prefix>_pending_ack``).

Every record of one (subscription, topic partition) has the key
``subscription|topic|partition`` and lands, by murmur2, in one log partition, in order.
The owner of a subscription partition:

1. :meth:`replay` reads that log partition from its start and folds the records of its
   key into a :class:`PendingAckHandle` (before delivering anything);
2. appends an ``OWNER`` record with the next generation (fencing older owners);
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
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind, key_of
from txnstream.producer import murmur2_partition
from txnstream.types import TopicPartition, TxnID

__all__ = ["PendingAckStore"]

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 30.0
"""How long a commit waits for its ack records to be durable."""
REPLAY_TIMEOUT_S = 120.0
"""How long a new owner may take to fold its log range before it gives the claim up
(and retries it); replay is bounded by the log's retention and checkpoints."""


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

    def log_partition(self, tp: TopicPartition) -> int:
        """The log partition that holds ``tp``'s records for this subscription."""
        return murmur2_partition(key_of(self.subscription, tp), self.partitions)

    def replay(self, tp: TopicPartition) -> PendingAckHandle:
        """Fold every record of ``tp`` from the log start to its current end.

        The end read up to is remembered: :meth:`claim` folds what lands after it.
        """
        handle = PendingAckHandle(self.subscription, tp)
        part = self.log_partition(tp)
        with self._lock:
            self._replayed_to[tp] = self._fold_range(handle, part, None, None)
        return handle

    def _fold_range(self, handle: PendingAckHandle, part: int, start: int | None,
                    through: int | None) -> int:
        """Fold ``handle``'s records of log partition ``part``; the next offset to read.

        From ``start`` (default: the log start) through offset ``through`` (default: the
        end found now).
        """
        key = key_of(self.subscription, handle.tp)
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-pr-{uuid.uuid4().hex}"))
        try:
            ktp = KafkaTP(self.topic, part)
            low, high = c.get_watermark_offsets(ktp, timeout=self.config.admin_timeout_s)
            pos = low if start is None else max(start, low)
            end = high if through is None else through + 1
            if end > pos:
                ktp.offset = pos
                c.assign([ktp])
                deadline = time.monotonic() + REPLAY_TIMEOUT_S
                while pos < end and time.monotonic() < deadline:
                    for m in c.consume(5000, 0.5):
                        if message_error(m, f"pending-ack replay of {handle.tp}", log):
                            continue
                        if m.offset() >= end:
                            break
                        pos = m.offset() + 1
                        if m.key() == key:
                            self._apply(handle, m)
                if pos < end:
                    raise TxnStreamError(
                        f"could not replay the pending-ack log of {handle.tp} "
                        f"({self.topic}[{part}] from {start} up to {end}) in "
                        f"{REPLAY_TIMEOUT_S:.0f}s")
            return max(pos, end)
        finally:
            c.close()

    def _apply(self, handle: PendingAckHandle, m: Message) -> PendingAckEntry | None:
        try:
            entry = PendingAckEntry.decode(m.value())
        except CorruptRecordError as exc:
            log.error("skipping unreadable pending-ack record at %s[%d]@%d: %s",
                      m.topic(), m.partition(), m.offset(), exc)
            return None
        handle.apply(entry)
        return entry

    def claim(self, handle: PendingAckHandle, cursor: int) -> None:
        """Append this member's OWNER record (next generation); fold up to it; tail on.

        Records that landed between the end :meth:`replay` read to and this OWNER are
        valid in the log (a zombie's late ack is one: it precedes the OWNER, so the
        zombie's read-back finds no OWNER before it and its txn commits). They are
        folded here, before anything is delivered, so the new owner holds such a
        message back instead of delivering it a second time.
        """
        entry = PendingAckEntry(PendingAckKind.OWNER, self.subscription, handle.tp.topic,
                                handle.tp.partition, generation=handle.generation + 1,
                                member_id=self.member_id, cursor=cursor)
        part = self.log_partition(handle.tp)
        written: list[int] = []
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, m: Message) -> None:
            if err is not None:
                failed.append(err)
            else:
                written.append(m.offset())

        self._producer.produce(self.topic, entry.encode(), key=entry.key(), partition=part,
                               on_delivery=delivered)
        if self._producer.flush(FLUSH_TIMEOUT_S) or failed or not written:
            raise TxnStreamError(f"could not claim {handle.tp} in {self.topic}: "
                                 f"{failed[0] if failed else 'not acknowledged in time'}")
        owner_at = written[0]
        with self._lock:
            start = self._replayed_to.pop(handle.tp, None)
        self._fold_range(handle, part, start, owner_at)
        if handle.generation != entry.generation or handle.owner != self.member_id:
            raise TxnStreamError(f"claim of {handle.tp} lost to a concurrent owner "
                                 f"(generation {handle.generation})")
        with self._lock:
            if part not in self._tailing:
                self._tailing.add(part)
                self._tail.incremental_assign([KafkaTP(self.topic, part, owner_at + 1)])
                self._tail_pos[part] = owner_at + 1

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
                    w[m.partition()] = max(w.get(m.partition(), -1), m.offset())
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
        for m in self._tail.consume(1000, 0):
            if message_error(m, f"pending-ack tail of {self.subscription}", log):
                continue
            self._tail_pos[m.partition()] = m.offset() + 1
            try:
                out.append(PendingAckEntry.decode(m.value()))
            except CorruptRecordError as exc:
                log.error("skipping unreadable pending-ack record at %s[%d]@%d: %s",
                          m.topic(), m.partition(), m.offset(), exc)
        return [e for e in out if e.subscription == self.subscription]

    def close(self) -> None:
        """Flush and release."""
        self._producer.flush(5)
        self._tail.close()
