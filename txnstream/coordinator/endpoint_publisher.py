"""``EndpointPublisher``: a worker tells clients where the TCs it serves are reached.

Each TC this worker serves gets a :class:`~txnstream.coordinator.endpoints.TcEndpoint`
record in partition ``tc_id`` of the compacted ``<prefix>_tc_endpoints`` topic (key: the
TC id), signed with the workers' key when there is one, so the workers' own clients
take no forged one (DESIGN.md section 10):

* when the TC starts serving (its EPOCH read back), so a client never finds an owner
  that cannot serve yet; a client that reaches an owner fenced since is told
  ``NotCoordinatorError``;
* again every ``endpoint_republish_s`` for every TC still served: clients keep the
  records they read last, so a forged record written after the genuine one hides it for
  at most that long;
* again at the next turn after a write that failed (refused or not delivered).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.ownership import TcIncarnation
from txnstream.coordinator.transport import Endpoint
from txnstream.markers import TXN_MAC_HEADER, MarkerSigner

__all__ = ["EndpointPublisher"]

log = logging.getLogger(__name__)


class EndpointPublisher:
    """Writes the endpoint records of worker ``worker_id``'s TCs to ``topic``."""

    def __init__(self, producer: Producer, topic: str, worker_id: str, address: Endpoint,
                 tls: bool, republish_s: float) -> None:
        self._producer = producer
        self._topic = topic
        self._worker_id = worker_id
        self.address = address
        """Where clients reach this worker (the address in every record)."""
        self._tls = tls
        self._republish_s = republish_s
        self.signer: MarkerSigner | None = None
        """Tags each record (``txn.mac``) once the worker has the workers' key."""
        self._unpublished: set[int] = set()
        """TC ids whose endpoint record is not written yet (retried every turn)."""
        self._republish_at_ms = int(time.time() * 1000) + int(republish_s * 1000)

    def add(self, tc_id: int) -> None:
        """TC ``tc_id`` needs its record written (it started serving)."""
        self._unpublished.add(tc_id)

    def discard(self, tc_id: int) -> None:
        """TC ``tc_id`` is no longer served here: no record of it is due."""
        self._unpublished.discard(tc_id)

    def turn(self, now_ms: int, tcs: Mapping[int, TcIncarnation],
             serving: Iterable[int]) -> None:
        """Mark every TC in ``serving`` due when the republish interval is up; write due ones."""
        if now_ms >= self._republish_at_ms:
            self._republish_at_ms = now_ms + int(self._republish_s * 1000)
            self._unpublished.update(serving)
        if self._unpublished:
            self.publish(tcs)

    def publish(self, tcs: Mapping[int, TcIncarnation]) -> None:
        """Write the record of every due TC of ``tcs`` (retried if refused).

        Written after the EPOCH read back, so a client never finds an owner that cannot
        serve yet; a client that reaches an owner fenced since is told NotCoordinator.
        """
        for tc_id in list(self._unpublished):
            tc = tcs.get(tc_id)
            if tc is None or tc.epoch_write is None:
                self._unpublished.discard(tc_id)
                continue
            rec = TcEndpoint(tc_id, self._worker_id, self.address, tc.epoch_write, self._tls)
            value = rec.encode()
            signer = self.signer
            tag: list[tuple[str, str | bytes | None]] | None = None if signer is None else [
                (TXN_MAC_HEADER, signer.tag(self._topic, tc_id, value))]

            def delivered(err: KafkaError | None, _m: Message, tc_id: int = tc_id) -> None:
                if err is not None:
                    log.warning("tc %d: endpoint not published (%s); retrying", tc_id, err)
                    if tc_id in tcs:
                        self._unpublished.add(tc_id)
            try:
                self._producer.produce(self._topic, value, key=str(tc_id).encode(),
                                       partition=tc_id, headers=tag, on_delivery=delivered)
                self._unpublished.discard(tc_id)
            except (KafkaException, BufferError) as exc:
                log.warning("tc %d: endpoint not published (%s); retrying", tc_id, exc)
        self._producer.poll(0)
