"""Folding the pending-ack log into handles: many subscription partitions in one read.

A consumer assigned N partitions rebuilds N handles before it delivers anything. Each
lives in one log partition (by its key), and many share one. Folding them one by one
(a reader of its own each, its log partition read from its checkpoint each time) made
a start on a 256-partition topic pay 256 readers and up to 256 reads of the same log
partitions (issue 37). Here one reader reads every log partition involved once, from
the earliest position any fold needs, and hands each record to the fold of its key.

Each :class:`Fold` applies exactly what a fold of its own would: the records of its key
in ``[start, through]``, and with a checkpoint, the checkpoint's state first, then its
key's records that preceded it (a checkpoint holds the state as of an earlier log
position). A checkpoint not found where its pointer says is reported on the fold
(:attr:`Fold.gone`), never raised for the others.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.config import Config
from txnstream.errors import CorruptRecordError, TxnStreamError, message_error
from txnstream.fencing import admits
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    PendingAckCheckpoint,
    PendingAckEntry,
    PendingAckKind,
    is_checkpoint,
    key_of,
)
from txnstream.ratelog import RateLimitedLog

__all__ = ["Fold", "fold_log", "hand_out"]

_ACKS = (PendingAckKind.ACK_INDIVIDUAL, PendingAckKind.ACK_CUMULATIVE)

log = logging.getLogger(__name__)
_refused = RateLimitedLog(log)
"""Acks a replay left out although their generation was current (a line per partition per
10 s)."""

READ_BATCH = 5000
IDLE_POLL_S = 0.2


@dataclass(eq=False)
class Fold:
    """One handle's fold: its key's records of log partition ``part`` in a range."""

    handle: PendingAckHandle
    part: int
    start: int | None = None
    """The first offset to fold (None: the log start)."""
    through: int | None = None
    """The last offset to fold (None: the end found when the read starts)."""
    checkpoint_at: int | None = None
    """Where the checkpoint holding the state as of ``start`` is (None: no checkpoint)."""
    gone: str | None = None
    """Why the checkpoint could not be used (then nothing was folded into the handle)."""
    end: int = -1
    """After :func:`fold_log`: the next offset a later fold of the key starts from."""
    early: list[KafkaRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = key_of(self.handle.subscription, self.handle.tp)

    def begin(self, low: int) -> int:
        """The first offset to fold, in a log partition starting at ``low``."""
        return low if self.start is None else max(self.start, low)

    def offer(self, m: KafkaRecord) -> None:
        """``m`` (of this key, inside the range): fold it, or keep it for the checkpoint."""
        if self.gone is not None:
            return
        at = self.checkpoint_at
        if at is None:
            if not is_checkpoint(m.headers()):
                _apply(self.handle, m)
        elif m.offset() < at:
            self.early.append(m)
        elif m.offset() == at:
            try:
                self.handle.restore(PendingAckCheckpoint.decode(m.value()))
            except CorruptRecordError as exc:
                self._give_up(f"unreadable checkpoint at {m.topic()}[{m.partition()}]"
                              f"@{m.offset()}: {exc}")
                return
            for e in self.early:
                if not is_checkpoint(e.headers()):
                    _apply(self.handle, e)
            self.early.clear()
            self.checkpoint_at = None
        else:
            self._give_up(f"no checkpoint of {self.handle.tp} at [{self.part}]@{at}")

    def _give_up(self, why: str) -> None:
        self.gone = why
        self.early.clear()


def _apply(handle: PendingAckHandle, m: KafkaRecord) -> None:
    try:
        entry = PendingAckEntry.decode(m.value())
    except CorruptRecordError as exc:
        log.error("skipping unreadable pending-ack record at %s[%d]@%d: %s",
                  m.topic(), m.partition(), m.offset(), exc)
        return
    if handle.apply(entry) or entry.txn_id is None or entry.kind not in _ACKS \
            or not admits(entry.generation, handle.generation):
        return
    # The live owner took this ack, so the fold disagrees with what it held then: the
    # acks it makes fall back to unacked, and a new owner delivers them again (stop 54's
    # exactly-once duplicate was one such: an ack logged before the mark of an END).
    _refused.warning(
        f"refused {handle.subscription} {handle.tp}", "pending-ack replay of %s for %r: "
        "the %s of offsets %s in txn %s at %s[%d]@%d (generation %d, the current one) "
        "conflicts with the state folded before it and is left out: those offsets may be "
        "delivered again", handle.tp, handle.subscription, entry.kind.name,
        _brief(entry.offsets), entry.txn_id, m.topic(), m.partition(), m.offset(),
        entry.generation)


def _brief(offsets: tuple[int, ...]) -> str:
    return str(list(offsets)) if len(offsets) <= 8 else \
        f"[{offsets[0]}..{offsets[-1]}] ({len(offsets)})"


def fold_log(config: Config, topic: str, folds: Iterable[Fold], timeout_s: float) -> int:
    """Fold every one of ``folds`` with one reader; returns the records read.

    Sets each fold's :attr:`~Fold.end` (the offset after the last one it covered) and,
    for a checkpoint not where its pointer says (outside the log, or not found), its
    :attr:`~Fold.gone` (its handle untouched: the caller folds it from the log start).
    Raises ``TxnStreamError`` if a log partition yields nothing for ``timeout_s``.
    """
    by_part: dict[int, list[Fold]] = {}
    for f in folds:
        by_part.setdefault(f.part, []).append(f)
    if not by_part:
        return 0
    c = Consumer(config.consumer(f"{config.topics.prefix}-pr-{uuid.uuid4().hex}"))
    try:
        ranges: dict[int, tuple[int, int]] = {}
        keyed: dict[int, dict[bytes, list[Fold]]] = {}
        for part, fs in by_part.items():
            low, high = c.get_watermark_offsets(KafkaTP(topic, part),
                                                timeout=config.admin_timeout_s)
            live = []
            for f in fs:
                if f.checkpoint_at is not None and (f.start is None or f.start < low
                                                    or f.checkpoint_at >= high):
                    f.gone = (f"checkpoint at {topic}[{part}]@{f.checkpoint_at} is outside "
                              f"the log ({low}..{high})")
                    continue
                f.end = high if f.through is None else f.through + 1
                live.append(f)
                keyed.setdefault(part, {}).setdefault(f.key, []).append(f)
            first = min((f.begin(low) for f in live), default=high)
            last = max((f.end for f in live), default=first)
            for f in live:
                f.end = max(f.end, f.begin(low))
            if last > first:
                ranges[part] = (first, last)
        read = _read(c, topic, ranges, keyed, timeout_s)
    finally:
        c.close()
    for fs in by_part.values():
        for f in fs:
            if f.gone is None and f.checkpoint_at is not None:
                f._give_up(f"no checkpoint of {f.handle.tp} at {topic}[{f.part}]"
                           f"@{f.checkpoint_at}")
    return read


def _read(c: Consumer, topic: str, ranges: dict[int, tuple[int, int]],
          keyed: dict[int, dict[bytes, list[Fold]]], timeout_s: float) -> int:
    """Read each partition's ``[first, last)`` once, handing records to their key's folds."""
    if not ranges:
        return 0
    c.assign([KafkaTP(topic, part, first) for part, (first, _) in ranges.items()])
    left = set(ranges)
    read = 0
    deadline = time.monotonic() + timeout_s
    while left:
        msgs = drain(c, READ_BATCH, IDLE_POLL_S)
        if not msgs:
            for at in c.position([KafkaTP(topic, p) for p in left]):
                if at.offset >= ranges[at.partition][1]:
                    left.discard(at.partition)
            if left and time.monotonic() > deadline:
                raise TxnStreamError(
                    f"could not replay the pending-ack log: {topic} partitions "
                    f"{sorted(left)} gave nothing for {timeout_s:g} s (ranges "
                    f"{ {p: ranges[p] for p in sorted(left)} })")
            continue
        deadline = time.monotonic() + timeout_s
        read += hand_out(msgs, ranges, keyed, left)
    return read


def hand_out(msgs: list[KafkaRecord], ranges: dict[int, tuple[int, int]],
             keyed: dict[int, dict[bytes, list[Fold]]], left: set[int]) -> int:
    """Offer each record to the folds of its key whose range holds it.

    Returns how many records were inside a range. A partition whose last offset to
    read came is taken out of ``left``.
    """
    read = 0
    for m in msgs:
        if message_error(m, "pending-ack replay", log):
            continue
        part, off = m.partition(), m.offset()
        last = ranges[part][1]
        if off >= last - 1:
            left.discard(part)
            if off >= last:
                continue
        read += 1
        for f in keyed[part].get(m.key() or b"", ()):
            if f.begin(0) <= off < f.end:
                f.offer(m)
    return read
