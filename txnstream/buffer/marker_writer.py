"""``MarkerWriter``: the markers a buffer owner writes itself.

An owner writes a marker where the coordinator's will never come: an ABORT for a txn
its fold ended without one (:meth:`MarkerWriter.abort_ended`), and the marker the
ongoing-txn check calls for (:mod:`txnstream.buffer.ongoing`). With the workers' secret
every marker is signed (:class:`~txnstream.markers.MarkerSigner`), so it counts in the
owners' folds. A marker is never written to a topic that does not exist
(:data:`~txnstream.kafka.topics.NO_AUTO_CREATE`); one whose partition is gone is dropped,
any other failure is logged and the next check writes it again.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from txnstream.kafka.topics import PartitionCatalog, says_gone
from txnstream.markers import MarkerKind, MarkerSigner, TxnMarker, produce_marker
from txnstream.ratelog import RateLimitedLog
from txnstream.types import TopicPartition, TxnID

__all__ = ["MarkerWriter"]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)


class MarkerWriter:
    """Produces markers to data partitions with the owner's producer."""

    def __init__(self, producer: Producer, partitions: PartitionCatalog) -> None:
        """``partitions`` confirms that a partition a marker failed on no longer exists."""
        self._producer = producer
        self._partitions = partitions
        self.signer: MarkerSigner | None = None
        """Signs every marker once the owner has the workers' key."""
        self.written = 0
        """Markers produced (their delivery is not awaited)."""

    def abort_ended(self, tp: TopicPartition, txns: dict[TxnID, int]) -> None:
        """ABORT markers for txns the fold ended here without one.

        The argument of :mod:`txnstream.buffer.ongoing` for the ongoing-txn check makes
        them safe.
        """
        for txn_id, lwm in txns.items():
            self.write(tp, TxnMarker(txn_id, MarkerKind.ABORT, lwm))
        self._producer.poll(0)

    def write(self, tp: TopicPartition, marker: TxnMarker) -> None:
        """Produce ``marker`` at ``tp`` (signed with the workers' key, if any).

        Never creates the topic; a marker that fails is reported by :meth:`_failed`.
        """
        def delivered(err: KafkaError | None, _m: Message) -> None:
            if err is not None:
                self._failed(tp, marker, err)
        try:
            produce_marker(self._producer, tp, marker, self.signer, on_delivery=delivered)
            self.written += 1
        except (KafkaException, BufferError) as exc:
            self._failed(tp, marker, exc)

    def flush(self, timeout_s: float) -> None:
        """Wait for the markers produced (and the owner's other records)."""
        self._producer.flush(timeout_s)

    def _failed(self, tp: TopicPartition, marker: TxnMarker, err: object) -> None:
        """A marker not written: dropped if its partition is gone, else written next check.

        Gone: the error says the partition does not exist and the cluster confirms it.
        """
        if says_gone(err) and self._partitions.gone(tp):
            _rate_limited.warning(f"gone {tp}", "%s: %s marker of %s dropped: the partition "
                                  "no longer exists", tp, marker.kind.value, marker.txn_id)
            return
        _rate_limited.warning(f"marker {tp}", "%s: %s marker of %s not written: %s", tp,
                              marker.kind.value, marker.txn_id, err)
