"""Where a take of a partition starts: what a new owner's start is computed from.

:class:`TakePlan` is one partition's take before its pending acks are replayed (its
cursor, served state and log bounds); :meth:`TakePlan.start_on` is where delivery starts
once they are (:func:`txnstream.delivery.start_on_log`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.buffer.follower import BufferStateFollower, ServeStatus
from txnstream.delivery import StartPlan, start_on_log
from txnstream.kafka.offsets import Bounds
from txnstream.pendingack.records import CursorMetadata
from txnstream.types import TopicPartition

if TYPE_CHECKING:
    from txnstream.pendingack.handle import PendingAckHandle

__all__ = ["TakePlan"]


@dataclass
class TakePlan:
    """One partition's take, before its replay: what its start is computed from."""

    tp: TopicPartition
    found: KafkaTP
    meta: CursorMetadata
    status: ServeStatus
    view_epoch: int | None
    low: int
    high: int
    initial: str

    @classmethod
    def of(cls, tp: TopicPartition, found: KafkaTP, bounds: Bounds,
           follower: BufferStateFollower, scanned: bool, lock: threading.RLock,
           initial: str) -> TakePlan:
        """What a take of ``tp`` starts from.

        Its cursor (``found``: the group's committed offset), served state (just read if
        ``scanned``) and log ``bounds``.
        """
        err = KafkaException(found.error) if found.error is not None else bounds
        if isinstance(err, KafkaException):
            raise err
        with lock:
            status = follower.status[tp] if scanned else follower.follow(tp)
            view = follower.views.get(tp)
        low, high = cast("tuple[int, int]", bounds)
        return cls(tp, found, CursorMetadata.from_metadata(found.metadata), status,
                   None if view is None else view.log_epoch, low, high, initial)

    def start_on(self, handle: PendingAckHandle, follower: BufferStateFollower,
                 lock: threading.RLock, timeout: float) -> StartPlan:
        """Where delivery starts: on the log the view serves.

        A state of an older log starts over in the claim.
        """

        def initial() -> int:  # latest: the committed end (Kafka's LSO) as of now
            if self.initial == "earliest" or self.status is ServeStatus.PLAIN:
                return self.low if self.initial == "earliest" else self.high
            return follower.committed_end(self.tp, self.high, self.low, timeout, lock)

        return start_on_log(self.found.offset, self.meta.log_epoch, handle.log_epoch,
                            handle.cursor, self.view_epoch, self.low, initial)
