"""``BufferRegistrar``: a coordinator registers the data partitions txns add.

A topic becomes served by the buffer role (DESIGN.md section 6) the first time a txn
registers one of its partitions: every partition of it is registered, in the snapshot
topic (:meth:`TransactionBufferSnapshotStore.register`), before the coordinator confirms
the registration, so a reader that finds no registration knows no txn record precedes it
there. Partition 0 is always among them, also when the topic's partitions cannot be
listed: a reader that meets a txn record in a partition added to the topic later (its
registration comes with its first txn's, which may land after that txn's first record)
asks about partition 0 to learn whether the topic is transactional
(:mod:`txnstream.buffer.unregistered`). A registration that is not written is not
confirmed: the client retries its ``ADD_PARTITIONS`` and the registration is tried again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaException, Producer

from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore
from txnstream.types import TopicPartition

__all__ = ["BufferRegistrar"]

log = logging.getLogger(__name__)


class BufferRegistrar:
    """Writes each data partition's registration once, with its topic's other partitions."""

    def __init__(self, registry: TransactionBufferSnapshotStore, producer: Producer,
                 admin_timeout_s: float, write_timeout_s: float) -> None:
        """``producer`` lists a topic's partitions; ``registry`` writes registrations."""
        self._registry = registry
        self._producer = producer
        self._admin_timeout_s = admin_timeout_s
        self._write_timeout_s = write_timeout_s
        self._registered: set[TopicPartition] = set()
        """Data partitions whose registration (they are served) this worker wrote."""

    def register(self, added: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Register the partitions of ``added`` new here; those of them not written."""
        new = set(added) - self._registered
        if not new:
            return set()
        todo = set(new) | {TopicPartition(p.topic, 0) for p in new}
        for topic in {p.topic for p in new}:
            try:
                meta = self._producer.list_topics(topic, timeout=self._admin_timeout_s)
                t = meta.topics.get(topic)
                if t is not None and t.error is None:
                    todo |= {TopicPartition(topic, p) for p in t.partitions}
            except KafkaException as exc:  # the partitions asked for are registered anyway
                log.warning("registering %s: partitions unknown (%s)", topic, exc)
        todo -= self._registered
        if not self._registry.register(sorted(todo), self._write_timeout_s):
            return new
        self._registered |= todo
        return set()
