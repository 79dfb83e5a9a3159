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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.config import Config
from txnstream.errors import CorruptRecordError, TxnStreamError, message_error
from txnstream.kafka.clients import close_producer
from txnstream.kafka.fetch import consume, delivered_at, delivered_offset, learn_topic
from txnstream.kafka.partitioning import murmur2_partition
from txnstream.kafka.topics import cluster_metadata
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    CHECKPOINT_HEADER,
    Checkpointed,
    PendingAckEntry,
    PendingAckKind,
    is_checkpoint,
    key_of,
)
from txnstream.pendingack.replay import Fold, fold_log
from txnstream.types import TopicPartition, TxnID

__all__ = ["PendingAckStore"]

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 30.0
"""How long a commit waits for its ack records to be durable."""
REPLAY_TIMEOUT_S = 120.0
"""How long a new owner may take to fold its log range before it gives the claim up
(and retries it); replay is bounded by the log's retention and checkpoints."""
LOG_PARTITION_CACHE = 65_536
"""Subscription partitions whose log partition is remembered (cleared when full)."""



class Checkpointing(Protocol):
    """A partition's reader (``PartitionDelivery``), as checkpoints are kept for it.

    :meth:`PendingAckStore.checkpoint_readers` reads and sets these.
    """

    tp: TopicPartition
    handle: PendingAckHandle | None
    checkpoint: Checkpointed | None
    checkpoint_due: float
    pointer_dirty: bool

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
        meta = cluster_metadata(self._producer, config.admin_timeout_s,
                                f"subscription {subscription!r}'s pending-ack log on "
                                f"{config.bootstrap_servers}", self.topic)
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
        self._unknown: dict[TxnID, set[int]] = defaultdict(set)
        """txn -> log partitions where an ack record's offset is not known (a retried
        write the broker had taken: reported delivered with no offset)."""
        self._tail_pos: dict[int, int] = {}
        self._moved_pos: dict[int, int] = {}
        """Per log partition: just past the last record the tail read that was not a
        checkpoint (where it was assigned, before it read any)."""
        self._replayed_to: dict[TopicPartition, int] = {}
        self._log_part: dict[TopicPartition, int] = {}
        """:meth:`log_partition`'s answers (at most :data:`LOG_PARTITION_CACHE`)."""
        self.replayed_records = 0
        """Log records the latest replay read (what a checkpoint bounds)."""

    def log_partition(self, tp: TopicPartition) -> int:
        """The log partition that holds ``tp``'s records for this subscription."""
        part = self._log_part.get(tp)
        if part is None:  # murmur2 in Python: once per partition, not per commit round
            if len(self._log_part) >= LOG_PARTITION_CACHE:
                self._log_part.clear()
            part = self._log_part[tp] = murmur2_partition(key_of(self.subscription, tp),
                                                          self.partitions)
        return part

    def replay(self, tp: TopicPartition, pointer: Checkpointed | None = None
               ) -> PendingAckHandle:
        """Rebuild ``tp``'s handle from the log, up to its current end.

        With a ``pointer`` (the latest checkpoint, from the group's committed offset
        metadata) it folds from the checkpoint's position: replay time is bounded by the
        checkpoint interval, not by the log's length. Without one, or if the checkpoint
        is gone (the log's retention passed it), it folds from the log start. The end
        read up to is remembered: :meth:`claim` folds what lands after it.
        """
        return self.replay_many({tp: pointer})[tp]

    def replay_many(self, pointers: Mapping[TopicPartition, Checkpointed | None]
                    ) -> dict[TopicPartition, PendingAckHandle]:
        """:meth:`replay` of many partitions with one reader, each log partition read once."""
        folds = {tp: Fold(PendingAckHandle(self.subscription, tp), self.log_partition(tp),
                          start=None if p is None else p.position,
                          checkpoint_at=None if p is None else p.at)
                 for tp, p in pointers.items()}
        self.replayed_records = fold_log(self.config, self.topic, folds.values(),
                                         REPLAY_TIMEOUT_S)
        again = {}
        for tp, f in folds.items():
            if f.gone is not None:
                log.warning("%s: %s; replaying the pending-ack log from its start", tp, f.gone)
                again[tp] = Fold(PendingAckHandle(self.subscription, tp), f.part)
        if again:
            self.replayed_records += fold_log(self.config, self.topic, again.values(),
                                              REPLAY_TIMEOUT_S)
            folds.update(again)
        with self._lock:
            for tp, f in folds.items():
                self._replayed_to[tp] = f.end
        return {tp: f.handle for tp, f in folds.items()}

    def checkpoint_many(self, states: list[tuple[PendingAckHandle, int]]
                        ) -> list[Checkpointed | None]:
        """Write each handle's state as of its log position; where to replay from then.

        Everything of a handle's key before its position must be reflected in its state.
        One flush for all (a wide reader's checkpoints fall due together); None for a
        write that failed (its previous checkpoint stays valid).
        """
        written: list[int | None] = [None] * len(states)

        def delivered(i: int, handle: PendingAckHandle) -> Callable[..., None]:
            def done(err: KafkaError | None, m: Message) -> None:
                if err is None and (off := delivered_offset(m)) is not None:
                    written[i] = off
                elif err is None:  # a retried write the broker had taken, offset not known:
                    log.info("pending-ack checkpoint of %s written at an unknown offset; "
                             "the next one is used", handle.tp)
                else:
                    log.warning("pending-ack checkpoint of %s not written: %s", handle.tp, err)
            return done

        for i, (handle, _) in enumerate(states):
            ckpt = handle.checkpoint()
            self._producer.produce(self.topic, ckpt.encode(), key=ckpt.key(),
                                   partition=self.log_partition(handle.tp),
                                   headers=[(CHECKPOINT_HEADER, b"checkpoint")],
                                   on_delivery=delivered(i, handle))
        if states:
            self._producer.flush(FLUSH_TIMEOUT_S)
        return [None if at is None else Checkpointed(pos, at)
                for (_, pos), at in zip(states, written, strict=True)]

    def checkpoint_readers(self, readers: Iterable[Checkpointing], now: float,
                           interval_s: float) -> None:
        """Checkpoint the pending acks of the ``readers`` that are due, one flush for all.

        A reader is due at most every ``interval_s`` (by ``now``, monotonic), and only
        with a record other than a checkpoint in its log partition since its last (a
        quiet log is not checkpointed again and again). Each handle reflects every
        record the tail read: the tail position is the replay's.
        """
        due = []
        for r in readers:
            if r.handle is None or now < r.checkpoint_due:
                continue
            r.checkpoint_due = now + interval_s
            if self.tail_position(r.tp) >= 0 and (
                    r.checkpoint is None or r.checkpoint.position < self.moved_position(r.tp)):
                due.append((r, r.handle))
        done = self.checkpoint_many([(h, self.tail_position(r.tp)) for r, h in due])
        for (r, _), ckpt in zip(due, done, strict=True):
            if ckpt is not None:
                r.checkpoint, r.pointer_dirty = ckpt, True

    def tail_position(self, tp: TopicPartition) -> int:
        """The next offset the tail reads in ``tp``'s log partition."""
        with self._lock:
            return self._tail_pos.get(self.log_partition(tp), -1)

    def moved_position(self, tp: TopicPartition) -> int:
        """Just past the last record of ``tp``'s log partition that is not a checkpoint.

        A checkpoint at or past it holds all a replay needs: what follows it is
        checkpoints only (so a quiet log is not checkpointed again and again, each
        checkpoint moving the log end for every partition that shares it).
        """
        with self._lock:
            return self._moved_pos.get(self.log_partition(tp), -1)

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
        result = self.claim_many([(handle, cursor, log_epoch)])[handle.tp]
        if isinstance(result, TxnStreamError):
            raise result
        return result

    def claim_many(self, claims: Sequence[tuple[PendingAckHandle, int, int]]
                   ) -> dict[TopicPartition, int | TxnStreamError]:
        """:meth:`claim` of many partitions: every OWNER written, then one fold to them.

        ``claims``: (handle, cursor, log epoch) each. Per partition, its OWNER's offset
        or the error that claim met (the others are not held back by it).
        """
        with self._lock:
            starts = {h.tp: self._replayed_to.pop(h.tp, None) for h, _, _ in claims}
        # not replayed by this store: fold from the log start, the log's end is the floor
        ends = self._log_ends({self.log_partition(tp) for tp, s in starts.items() if s is None})
        written: dict[TopicPartition, int] = {}
        generations: dict[TopicPartition, int] = {}
        out: dict[TopicPartition, int | TxnStreamError] = {}
        for handle, cursor, log_epoch in claims:
            tp = handle.tp
            part = self.log_partition(tp)
            start = starts[tp]
            entry = PendingAckEntry(PendingAckKind.OWNER, self.subscription, tp.topic,
                                    tp.partition,
                                    generation=max(handle.generation + 1,
                                                   ends[part] if start is None else start),
                                    member_id=self.member_id, cursor=cursor,
                                    log_epoch=log_epoch)
            generations[tp] = entry.generation

            def delivered(err: KafkaError | None, m: Message, tp: TopicPartition = tp) -> None:
                off = delivered_offset(m) if err is None else None
                if off is not None:
                    written[tp] = off
                elif err is None:  # a retried write the broker had taken: claimed again
                    out[tp] = TxnStreamError(f"the claim of {tp} in {self.topic} was written "
                                             "at an offset not known")
                else:
                    out[tp] = TxnStreamError(f"could not claim {tp} in {self.topic}: {err}")

            self._producer.produce(self.topic, entry.encode(), key=entry.key(),
                                   partition=part, on_delivery=delivered)
        self._producer.flush(FLUSH_TIMEOUT_S)
        folds = []
        for handle, _, _ in claims:
            tp = handle.tp
            if tp in written:
                folds.append(Fold(handle, self.log_partition(tp), start=starts[tp],
                                  through=written[tp]))
            elif tp not in out:
                out[tp] = TxnStreamError(f"could not claim {tp} in {self.topic}: not "
                                         "acknowledged in time")
        try:
            fold_log(self.config, self.topic, folds, REPLAY_TIMEOUT_S)
        except (TxnStreamError, KafkaException) as exc:  # a broker down: retaken later
            err = exc if isinstance(exc, TxnStreamError) else TxnStreamError(
                f"could not fold the pending-ack log up to the claims: {exc}")
            return {**out, **{f.handle.tp: err for f in folds}}
        for f in folds:
            h, at = f.handle, written[f.handle.tp]
            if h.generation != generations[h.tp] or h.owner != self.member_id:
                out[h.tp] = TxnStreamError(f"claim of {h.tp} lost to a concurrent owner "
                                           f"(generation {h.generation})")
            else:
                out[h.tp] = at
        return out

    def _log_ends(self, parts: set[int]) -> dict[int, int]:
        """The end offset of each of ``parts`` of the log, with one reader."""
        if not parts:
            return {}
        c = Consumer(self.config.consumer(f"{self.config.topics.prefix}-pr-{uuid.uuid4().hex}"))
        try:
            return {p: int(c.get_watermark_offsets(KafkaTP(self.topic, p),
                                                   timeout=self.config.admin_timeout_s)[1])
                    for p in parts}
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
                if not self._tailing:
                    learn_topic(self._tail, self.topic, self.config.admin_timeout_s)
                self._tailing.add(part)
                self._tail.incremental_assign([KafkaTP(self.topic, part, pos)])
                self._tail_pos[part] = pos
                self._moved_pos[part] = max(self._moved_pos.get(part, -1), pos)
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
                    part, off = delivered_at(m)
                    if off is None:  # a retried write the broker had taken: read_back
                        self._unknown[txn].add(part)  # asks for the log end
                    else:
                        w = self._written[txn]
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
        """Whether the tail has read every ack record of ``txn`` (they are durable).

        A record delivered at an unknown offset is below the partition's log end now:
        the tail must reach that end.
        """
        with self._lock:
            unknown = sorted(self._unknown.get(txn, ()))
        for p in unknown:
            try:
                end = self._tail.get_watermark_offsets(
                    KafkaTP(self.topic, p), timeout=FLUSH_TIMEOUT_S, cached=False)[1]
            except KafkaException as exc:
                log.info("%s[%d]: log end not known yet (%s)", self.topic, p, exc)
                return False
            with self._lock:
                w = self._written[txn]
                w[p] = max(w.get(p, -1), end - 1)
                self._unknown[txn].discard(p)
                if not self._unknown[txn]:
                    del self._unknown[txn]
        with self._lock:
            written = dict(self._written.get(txn, {}))
        return all(self._tail_pos.get(p, -1) > off for p, off in written.items())

    def confirmed(self, txn: TxnID) -> None:
        """The acks of ``txn`` so far were read back: a later check needs no tail."""
        with self._lock:
            self._written.pop(txn, None)
            self._unknown.pop(txn, None)

    def forget(self, txn: TxnID) -> None:
        """Drop the bookkeeping of a txn: its acks were read back, or it ended."""
        with self._lock:
            self._written.pop(txn, None)
            self._unknown.pop(txn, None)
            self._failed.pop(txn, None)

    def tracked_txns(self) -> int:
        """Txns with bookkeeping here (bounded by the txns in flight: a test checks it)."""
        with self._lock:
            return len(set(self._written) | set(self._failed) | set(self._outstanding)
                       | set(self._unknown))

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
            self._moved_pos[m.partition()] = m.offset() + 1
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
