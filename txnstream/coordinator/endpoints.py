"""Where each transaction coordinator is served: ``TcEndpoint`` and ``EndpointDirectory``.

A TC's owner writes a :class:`TcEndpoint` to the compacted ``<prefix>_tc_endpoints``
topic (partition ``p`` for TC ``p``) once its EPOCH has read back, and writes it again
every ``endpoint_republish_s``; an :class:`EndpointDirectory` tails that topic for a
client, so a failover reaches every client within a fetch. The record is written by the
worker (:mod:`txnstream.coordinator.endpoint_publisher`) and read by every
:class:`~txnstream.coordinator.tc_client.TransactionCoordinatorClient`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from txnstream.codec import codec
from txnstream.config import Config
from txnstream.coordinator.transport import Endpoint
from txnstream.errors import CorruptRecordError, KafkaClientError, message_error
from txnstream.kafka.fetch import drain
from txnstream.markers import MarkerSigner
from txnstream.ratelog import RateLimitedLog

__all__ = [
    "CANDIDATES_PER_TC",
    "DIRECTORY_FETCH_WAIT_MS",
    "MAX_DISTRUSTED",
    "SET_ASIDE_S",
    "EndpointDirectory",
    "TcEndpoint",
]

log = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(log)

DIRECTORY_FETCH_WAIT_MS = 100
"""The directory's fetch wait: an idle client sends ten fetches a second, and learns a
new owner within about this long."""
CANDIDATES_PER_TC = 8
"""Endpoint records kept per TC (newest first): the fallbacks past forged ones."""
MAX_DISTRUSTED = 4096
"""Endpoint records remembered as impostors (forgotten all at once past this)."""
SET_ASIDE_S = 300.0
"""How long a record that failed a request (unreachable, or its worker said it does not
serve the TC) is tried only after every other one: a tarpit costs one attempt per this,
not one per request."""


class TcEndpoint:
    """Mirrors ``schemas/tc_endpoint.avsc``: where TC ``tc_id`` is served, and since when."""

    __slots__ = ("tc_id", "owner_id", "endpoint", "epoch_offset", "tls")

    def __init__(self, tc_id: int, owner_id: str, endpoint: Endpoint, epoch_offset: int,
                 tls: bool = False) -> None:
        self.tc_id, self.owner_id, self.endpoint = tc_id, owner_id, endpoint
        self.epoch_offset, self.tls = epoch_offset, tls

    def __repr__(self) -> str:
        return (f"TcEndpoint(tc {self.tc_id} at {self.endpoint}, owner {self.owner_id}, "
                f"epoch {self.epoch_offset})")

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("tc_endpoint").encode({
            "tc_id": self.tc_id, "owner_id": self.owner_id, "host": self.endpoint.host,
            "port": self.endpoint.port, "epoch_offset": self.epoch_offset, "tls": self.tls})

    @classmethod
    def decode(cls, data: bytes | None) -> TcEndpoint:
        """Parse; ``CorruptRecordError`` on garbage."""
        r = codec("tc_endpoint").decode(data)
        return cls(r["tc_id"], r["owner_id"], Endpoint(r["host"], r["port"]),
                   r["epoch_offset"], r["tls"])


class EndpointDirectory:
    """Where each TC is served: a tail of ``<prefix>_tc_endpoints`` in a daemon thread.

    The newest owner of a TC is the one with the highest EPOCH offset (a zombie's late
    record never displaces it). The topic is internal, but a record there steers every
    client, so none is taken on its word (DESIGN.md section 10):

    * a directory given the workers' ``signer`` (the workers' own clients) keeps only
      records whose ``txn.mac`` tag verifies: only a worker wrote them;
    * any client drops an endpoint whose worker fails to prove itself in the handshake
      (:meth:`distrust`, on :class:`~txnstream.errors.WorkerIdentityError`) and goes
      back to the newest other record of that TC, so a forged record with a huge epoch
      costs one refused connection, not the TC. It keeps the
      :data:`CANDIDATES_PER_TC` records per TC it read last for that (tried highest
      epoch first). A worker re-publishes the record of each TC it serves every
      ``endpoint_republish_s``, so a flood of forged records, or compaction keeping
      only a forged one, hides it from new clients for at most that long;
    * a record that failed a request (:meth:`set_aside`: unreachable, or its worker, a
      genuine one, said it does not serve the TC) is tried only after every other one
      for :data:`SET_ASIDE_S`, across requests, and the record that last answered a
      request (:meth:`answered`) is tried first: forged records naming a live worker or a
      tarpit cost one attempt each, not one per request, and never hide a TC whose
      owner's record is among the candidates.
    """

    def __init__(self, config: Config, num_coordinators: int,
                 on_change: Callable[[TcEndpoint], None] | None = None,
                 signer: MarkerSigner | None = None) -> None:
        self.config = config
        self._on_change = on_change
        """Called (on the tail thread) with each TC's new owner."""
        self._signer = signer
        self._candidates: dict[int, list[TcEndpoint]] = {}
        """Per TC, the records last read (highest EPOCH offset first), distrusted ones out."""
        self._arrivals: dict[int, list[TcEndpoint]] = {}
        """Per TC, the same records in the order they were read (the first is evicted)."""
        self._distrusted: set[tuple[int, int, Endpoint]] = set()
        self._set_aside: dict[tuple[int, int, Endpoint], float] = {}
        """Records that failed a request -> until when they are tried last (monotonic)."""
        self._answered: dict[int, tuple[int, Endpoint]] = {}
        """Per TC, the record (epoch, endpoint) that last answered a request."""
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._caught_up = threading.Event()
        topic = config.topics.endpoints
        self._consumer = Consumer(config.consumer(
            f"{config.topics.prefix}-endpoints-{uuid.uuid4().hex[:12]}",
            **{"fetch.wait.max.ms": DIRECTORY_FETCH_WAIT_MS}))
        parts = [KafkaTP(topic, p, OFFSET_BEGINNING) for p in range(num_coordinators)]
        self._ends = {p.partition: self._end_of(topic, p.partition) for p in parts}
        self._consumer.assign(parts)
        self._thread = threading.Thread(target=self._tail, name="txnstream-tc-endpoints",
                                        daemon=True)
        self._thread.start()

    def _end_of(self, topic: str, partition: int) -> int:
        """The partition's end now; 0 if the cluster does not say (a broker down).

        The tail then reads what it can, and lookups wait for records as they come.
        """
        try:
            return int(self._consumer.get_watermark_offsets(
                KafkaTP(topic, partition), timeout=self.config.admin_timeout_s)[1])
        except KafkaException as exc:
            _rate_limited.warning("endpoint ends", "tc endpoint directory: no end offset "
                                  "of %s[%d] (%s): not waiting to catch up", topic,
                                  partition, exc)
            return 0

    @property
    def _known(self) -> dict[int, TcEndpoint]:
        return {tc: eps[0] for tc, eps in self._candidates.items() if eps}

    def _verified(self, m: Any) -> bool:
        if self._signer is None:
            return True
        if self._signer.verify(m.topic(), m.partition(), m.value(), m.headers()):
            return True
        _rate_limited.warning(f"endpoint tag {m.partition()}", "ignoring the endpoint record "
                              "at %s[%d]@%d: its txn.mac does not verify (not written by a "
                              "worker of this cluster)", m.topic(), m.partition(), m.offset())
        return False

    def _take(self, ep: TcEndpoint) -> None:
        """Add a record to its TC's candidates (under the lock); notify a new owner."""
        with self._changed:
            eps = self._candidates.setdefault(ep.tc_id, [])
            have = eps[0] if eps else None
            if (ep.tc_id, ep.epoch_offset, ep.endpoint) in self._distrusted:
                return
            # Evict by arrival, not by epoch: a flood of forged records with huge epochs
            # cannot push out a worker's record that it re-publishes after them.
            arrived = [e for e in self._arrivals.setdefault(ep.tc_id, [])
                       if e.epoch_offset != ep.epoch_offset and e in eps] + [ep]
            del arrived[:-CANDIDATES_PER_TC]
            self._arrivals[ep.tc_id] = arrived
            eps[:] = sorted(arrived, key=lambda e: -e.epoch_offset)
            newer = have is None or ep.epoch_offset > have.epoch_offset
            good = self._answered.get(ep.tc_id)
            if good is not None and ep.epoch_offset > good[0]:
                del self._answered[ep.tc_id]  # a failover's new owner is tried first
            if eps[0] is ep:
                self._changed.notify_all()
        if newer and have is not None and self._on_change is not None:
            self._on_change(ep)

    def has_fallback(self, ep: TcEndpoint) -> bool:
        """Whether TC ``ep.tc_id`` has another record, at another address, to try."""
        with self._changed:
            return any(e.endpoint != ep.endpoint
                       for e in self._candidates.get(ep.tc_id, ()) if e is not ep)

    def distrust(self, ep: TcEndpoint) -> None:
        """``ep``'s worker did not prove itself: never use that record again."""
        with self._changed:
            if len(self._distrusted) >= MAX_DISTRUSTED:
                self._distrusted.clear()
            self._distrusted.add((ep.tc_id, ep.epoch_offset, ep.endpoint))
            eps = self._candidates.get(ep.tc_id, [])
            eps[:] = [e for e in eps if e is not ep and not (
                e.epoch_offset == ep.epoch_offset and e.endpoint == ep.endpoint)]
            self._changed.notify_all()

    def _tail(self) -> None:
        pending = {p for p, end in self._ends.items() if end > 0}
        if not pending:
            self._caught_up.set()
        while not self._closed.is_set():
            try:
                msgs = drain(self._consumer, 500, 0.1)
            except RuntimeError:  # closed under us
                return
            for m in msgs:
                try:
                    if message_error(m, "tc endpoint directory", log):
                        continue
                except KafkaClientError as exc:
                    log.error("tc endpoint directory stopped: %s", exc)
                    return
                if pending and m.offset() + 1 >= self._ends.get(m.partition(), 0):
                    pending.discard(m.partition())
                if not self._verified(m):
                    continue
                try:
                    ep = TcEndpoint.decode(m.value())
                except CorruptRecordError as exc:
                    _rate_limited.error(f"endpoint corrupt {m.partition()}", "skipping a bad "
                                        "endpoint record at %s[%d]@%d: %s", m.topic(),
                                        m.partition(), m.offset(), exc)
                    continue
                if ep.tc_id != m.partition():
                    _rate_limited.error(f"endpoint tc {m.partition()}", "skipping the endpoint "
                                        "record at %s[%d]@%d: it names coordinator %d",
                                        m.topic(), m.partition(), m.offset(), ep.tc_id)
                    continue
                self._take(ep)
            if pending and not msgs:
                for p in list(pending):
                    [at] = self._consumer.position([KafkaTP(self.config.topics.endpoints, p)])
                    if at.offset >= self._ends[p]:
                        pending.discard(p)
            if not pending and not self._caught_up.is_set():
                self._caught_up.set()
                with self._changed:
                    self._changed.notify_all()

    def set_aside(self, ep: TcEndpoint) -> None:
        """``ep`` failed a request: try it after every other record, for a while."""
        key = (ep.tc_id, ep.epoch_offset, ep.endpoint)
        with self._changed:
            if len(self._set_aside) >= MAX_DISTRUSTED:
                self._set_aside.clear()
            self._set_aside[key] = time.monotonic() + SET_ASIDE_S
            if self._answered.get(ep.tc_id) == key[1:]:
                del self._answered[ep.tc_id]

    def answered(self, ep: TcEndpoint) -> None:
        """``ep``'s worker answered a request of its TC: try it first from now on."""
        key = (ep.tc_id, ep.epoch_offset, ep.endpoint)
        with self._changed:
            self._answered[ep.tc_id] = key[1:]
            self._set_aside.pop(key, None)

    def lookup(self, tc_id: int, timeout_s: float, newer_than: int | None = None,
               skip: frozenset[tuple[int, Endpoint]] = frozenset()) -> TcEndpoint | None:
        """TC ``tc_id``'s owner, waiting up to ``timeout_s`` for one.

        The record that last answered a request first, then the others newest first;
        ``skip`` (``(epoch, endpoint)`` records this request could not use) and records
        set aside come last. With ``newer_than`` (an EPOCH offset), waits until some
        record is newer, or one that is neither skipped nor set aside comes; after the
        wait, the best known one, or None.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            # Not before the tail has read what the topic held when it began: an early
            # record (an owner long gone, its address perhaps another process's now) is
            # no answer while the newest one is a few ms of reading away.
            while not self._caught_up.is_set() and time.monotonic() < deadline:
                self._changed.wait(min(deadline - time.monotonic(), 0.05))
            while True:
                ep, usable = self._best(tc_id, skip)
                if ep is not None and (usable or newer_than is None
                                       or ep.epoch_offset > newer_than):
                    return ep
                left = deadline - time.monotonic()
                if left <= 0:
                    return ep
                self._changed.wait(min(left, 1.0))

    def _best(self, tc_id: int, skip: frozenset[tuple[int, Endpoint]]
              ) -> tuple[TcEndpoint | None, bool]:
        """The record to try next (under the lock), and whether it is a fresh one.

        Fresh: neither skipped by the request nor set aside.
        """
        eps = self._candidates.get(tc_id, ())
        now = time.monotonic()

        def fresh(e: TcEndpoint) -> bool:
            if (e.epoch_offset, e.endpoint) in skip:
                return False
            until = self._set_aside.get((tc_id, e.epoch_offset, e.endpoint))
            return until is None or until <= now

        good = self._answered.get(tc_id)
        order = sorted(eps, key=lambda e: (e.epoch_offset, e.endpoint) != good)  # stable
        ep = next((e for e in order if fresh(e)), None)
        if ep is not None:
            return ep, True
        ep = next((e for e in order if (e.epoch_offset, e.endpoint) not in skip),
                  order[0] if order else None)
        return ep, False

    def known(self) -> dict[int, TcEndpoint]:
        """Every TC's owner known now."""
        with self._changed:
            return dict(self._known)

    def close(self) -> None:
        """Stop tailing."""
        self._closed.set()
        self._thread.join(2)
        self._consumer.close()
