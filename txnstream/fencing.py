"""Owner fencing: the newest claim of a partition wins, and only its records count.

The three roles that own partitions of a log fence a former owner the same way. An owner
claims its partition by writing an owner record there, and learns its *generation* from
it; every record it writes afterwards carries that generation:

=================  ===========================  =========================================
role               owner record                 generation
=================  ===========================  =========================================
coordinator        ``EPOCH`` in ``_log[p]``     the EPOCH's offset
                                                (:mod:`txnstream.coordinator.epochs`)
buffer owner       ``OWNER`` in                 the OWNER's offset
                   ``_buffer_state[s]``         (:mod:`txnstream.buffer.worker`)
pending ack        ``OWNER`` in                 above the latest one and at least the
                   ``_pending_ack[p]``          log end (:mod:`txnstream.pendingack.store`)
=================  ===========================  =========================================

A claim of a higher generation :func:`supersedes` the current one (its owner is fenced:
a zombie that wakes up finds the newer claim and stops), and a record counts only if the
current generation :func:`admits` it. :func:`write_owner_record` writes a claim and
waits for its offset. Which records carry a generation, and what a role does once
fenced, stay the role's (a coordinator's renewal EPOCH, say, is written under its
current generation and becomes the next one).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from txnstream.kafka.fetch import delivered_offset

__all__ = ["OwnerRecordWrite", "admits", "supersedes", "write_owner_record"]


def supersedes(claim: int, current: int) -> bool:
    """Whether a claim of generation ``claim`` fences the owner of generation ``current``."""
    return claim > current


def admits(generation: int, current: int) -> bool:
    """Whether a record written under ``generation`` counts while ``current`` owns."""
    return generation == current


@dataclass(frozen=True, slots=True)
class OwnerRecordWrite:
    """How writing an owner record went."""

    offset: int | None
    """Where the record landed; None if it was not delivered in time."""
    error: KafkaError | None
    """Why it was not delivered, if the producer said."""
    undelivered: int
    """Records (this one or others) still in the producer's queue after the wait."""


def write_owner_record(producer: Producer, topic: str, partition: int, key: bytes,
                       value: bytes, timeout_s: float) -> OwnerRecordWrite:
    """Produce one owner record to ``topic[partition]`` and wait up to ``timeout_s`` for it.

    The caller decides what counts as failed (and raises its own error): the offset is
    the claim's generation for the roles whose generation is its offset.
    """
    written: list[Message] = []
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        (failed.append(err) if err is not None else written.append(msg))

    producer.produce(topic, value, key=key, partition=partition, on_delivery=delivered)
    left = producer.flush(timeout_s)
    # None also when it was delivered at an offset not known (a retried write the broker
    # had taken): the claim's generation is that offset, so the caller claims again
    return OwnerRecordWrite(delivered_offset(written[0]) if written else None,
                            failed[0] if failed else None, left)
