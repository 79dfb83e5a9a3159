"""A producer's sends of one transaction, and its two ways to librdkafka.

:class:`TxnSends` is what a transaction's sends through one
:class:`~txnstream.producer.Producer` share and count (outstanding records, their
offsets for :mod:`txnstream.fate`, the txn's headers per partition).

:class:`SendPaths` is the second way to librdkafka ``send_batch`` takes where it can: a
producer handle of txnstream's own driven from C (:mod:`txnstream.kafka.native_send`),
beside the Producer's confluent-kafka handle, and the order kept between the two. Each
partition keeps the order of a producer's calls (from one thread) because a handle
writes only once the other has nothing in flight: a batch goes natively only once
confluent-kafka's handle is drained (else through it, waiting at most
:data:`QUEUE_FULL_TIMEOUT_S`), and a send through confluent-kafka first waits for the
native handle's records (:meth:`SendPaths.wait_native`). So a producer that mixes
``send()`` and ``send_batch()`` pays a flush at each switch; one that only batches pays
none. The native handle costs its own broker connections and producer id, made at the
producer's first batch, or taken then from the client's spare made ahead
(:class:`~txnstream.kafka.native_send.NativeSpares`).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from confluent_kafka import KafkaError, KafkaException, Message

from txnstream.errors import TxnStreamError
from txnstream.kafka.native_send import NativeSender, NativeSpares, Tally
from txnstream.membership import txn_headers

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from confluent_kafka import Producer as KafkaProducer

    from txnstream.transaction import Transaction

__all__ = ["FLUSH_SLICE_S", "POLL_EVERY", "QUEUE_FULL_TIMEOUT_S", "KafkaHeaders",
           "SendPaths", "TxnSends"]

KafkaHeaders = list[tuple[str, str | bytes | None]]
"""Headers as confluent-kafka's ``produce`` takes them."""

QUEUE_FULL_TIMEOUT_S = 30.0
"""How long a send waits for room in librdkafka's queue before ``BufferError`` reaches
the caller; as long as a commit would wait for the same sends."""

POLL_EVERY = 256
"""Serve delivery callbacks every this many transactional sends: poll() per send cost
more than the produce itself, and commit() serves the rest while it waits."""

FLUSH_SLICE_S = 0.005
"""How long one wait of ``flush_transaction`` lasts before it counts the txn's sends again:
short, since other txns' sends may keep librdkafka's queue from emptying."""



class TxnSends:
    """One transaction's sends through one producer, and what each of them reuses.

    ``sent`` counts the records handed to librdkafka (changed under the producer's
    lock); each delivery report appends to ``acks`` (``list.append`` is atomic, so a
    report takes no lock), and :meth:`outstanding` folds them into ``acked``.
    """

    __slots__ = ("headers", "registered", "sent", "acked", "acks", "offsets", "delivered",
                 "tally", "_topic", "_txn")

    def __init__(self, topic: str, txn: Transaction) -> None:
        self._topic, self._txn = topic, txn
        self.headers: dict[int, KafkaHeaders] = {}
        """Partition -> the txn's headers there (``txn.id``, ``txn.tag``): made once each."""
        self.registered: set[int] = set()
        """Partitions ``txn.register_partitions`` accepted: later sends skip the call."""
        self.sent = 0
        self.acked = 0
        self.acks: list[KafkaError | None] = []
        self.offsets: dict[int, array[int]] = {}
        """Partition -> where each landed (txnstream.fate): made with its headers."""
        self.tally: Tally | None = None
        """The reports of its records sent natively (``send_batch``), gathered in C."""
        ack, offsets = self.acks.append, self.offsets

        def delivered(err: KafkaError | None, msg: Message) -> None:  # once per record
            ack(err)
            if err is None:
                if (off := msg.offset()) is not None:
                    offsets[msg.partition()].append(off)  # type: ignore[index]
                else:  # a retried write the broker had taken: no offset given
                    txn.delivered.unknown(topic, msg.partition())  # type: ignore[arg-type]
            else:
                txn.mark_abort_only(TxnStreamError(
                    f"send to {topic}-{msg.partition()} failed: {err}", txn.id))

        self.delivered = delivered

    def headers_at(self, partition: int) -> KafkaHeaders:
        """The txn's headers for a record at ``partition`` (made at its first record)."""
        h = self.headers.get(partition)
        if h is None:
            txn = self._txn
            self.offsets[partition] = txn.delivered.offsets_of(self._topic, partition)
            h = self.headers[partition] = txn_headers(txn.id, txn.key, self._topic, partition)
        return h

    def outstanding(self) -> int:
        """Sends not acknowledged yet (producer lock held); keeps ``acks`` short."""
        n = len(self.acks)
        del self.acks[:n]  # reports appended meanwhile stay, after the n deleted
        self.acked += n
        if self.tally is not None:
            self.acked += self._take_native()
        return self.sent - self.acked

    def _take_native(self) -> int:
        """Take the native reports since the last take; returns how many.

        What :meth:`delivered` does for each record: offsets kept, those without one
        counted as unknown, the first error making the txn abort-only.
        """
        acked, offsets, unknown, error = self.tally.take()  # type: ignore[union-attr]
        txn, topic = self._txn, self._topic
        if offsets:
            for part, raw in offsets.items():
                self.offsets[part].frombytes(raw)  # made by headers_at before its sends
        if unknown:  # retried writes the broker had taken: no offset given
            for part, k in unknown.items():
                for _ in range(k):
                    txn.delivered.unknown(topic, part)
        if error is not None:
            code, part = error
            txn.mark_abort_only(TxnStreamError(
                f"send to {topic}-{part} failed: {KafkaError(code)}", txn.id))
        return acked


class SendPaths:
    """A producer's native way to librdkafka for ``send_batch``, and its order with the other.

    Made by the :class:`~txnstream.producer.Producer` with its librdkafka ``settings``;
    the native handle is made at the first batch (``lock``: the producer's).
    """

    def __init__(self, settings: Mapping[str, Any], topic: str, lock: threading.Lock,
                 spares: NativeSpares | None = None) -> None:
        self._settings, self._topic, self._lock = settings, topic, lock
        self._spares = spares
        """The client's handles made ahead (:class:`~txnstream.kafka.native_send.NativeSpares`)."""
        self._native: NativeSender | None | Literal[False] = None
        """The native handle (None: not made yet; False: none, or closed)."""
        self.used = False
        """The native handle may have records in flight: a send through confluent-kafka
        calls :meth:`wait_native` first."""

    def native(self, kafka: KafkaProducer) -> NativeSender | None:
        """The native handle beside ``kafka`` (made at the first call), or None."""
        native = self._native
        if native is None:
            with self._lock:
                if self._native is None:
                    self._native = NativeSender.for_producer(
                        kafka, self._settings, self._topic, self._spares) or False
                native = self._native
        return native or None

    def send(self, kafka: KafkaProducer, values: Sequence[bytes | None],
             partitions: Sequence[int], keys: Sequence[bytes | None] | None,
             sends: TxnSends, n: int, delay: tuple[str, bytes] | None,
             uncount: Callable[[int], None]) -> bool:
        """Send the batch natively; False (nothing handed) where the Python path must.

        That is: no native handle; confluent-kafka's handle not drained within
        :data:`QUEUE_FULL_TIMEOUT_S`; a value or key that is not bytes or None
        (confluent-kafka takes a str). ``uncount(k)``: ``k`` records counted on ``sends``
        were never handed to librdkafka (a refused record, an interrupt).
        """
        native = self.native(kafka)
        if native is None or not _drained(kafka):
            return False
        headers_at = sends.headers_at
        hdrs = {p: [*headers_at(p), delay] if delay is not None else headers_at(p)
                for p in set(partitions)}
        with self._lock:
            if sends.tally is None:
                sends.tally = native.tally()
        tally = sends.tally
        self.used = True
        i = 0
        try:
            while i < n:  # queue full: the call returns every WAIT_MS, then goes on
                i, err = native.produce(tally, values, keys, partitions, hdrs, i)
                if err:
                    raise KafkaException(KafkaError(err))
        except TypeError:
            if i:
                uncount(n - i)
                raise
            return False
        except BaseException:
            uncount(n - i)
            raise
        return True

    def wait_native(self) -> None:
        """Wait until the native handle's records are reported, so none is overtaken.

        Called before a record goes through confluent-kafka while :attr:`used`.
        ``BufferError`` if they are not within :data:`QUEUE_FULL_TIMEOUT_S`, as for a
        queue that stays full.
        """
        self.used = False  # cleared first: a batch sent meanwhile sets it again
        native = self._native
        if not native:
            return
        deadline = time.monotonic() + QUEUE_FULL_TIMEOUT_S
        while native.pending():
            if time.monotonic() > deadline:
                self.used = True
                raise BufferError(f"{native.pending()} records sent natively to "
                                  f"{self._topic} not delivered within "
                                  f"{QUEUE_FULL_TIMEOUT_S:.0f}s: a record sent now would "
                                  "overtake them")
            native.flush(FLUSH_SLICE_S)

    def partitions(self, timeout_s: float) -> int | None:
        """The topic's partition count as the native handle sees it, its metadata refreshed.

        None without a native handle; -1 if the cluster did not say.
        """
        native = self._native
        if not native:
            return None
        try:
            return native.partitions(timeout_s)
        except RuntimeError:
            return -1

    def flush_slice(self) -> bool:
        """One short flush of the native handle; False if it has none."""
        native = self._native
        if not native:
            return False
        native.flush(FLUSH_SLICE_S)
        return True

    def flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for every native record."""
        if self._native:
            self._native.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Flush and close the native handle (a later batch goes through Python)."""
        native, self._native = self._native, False
        if native:
            native.close(timeout_s)


def _drained(kafka: KafkaProducer) -> bool:
    """Whether confluent-kafka's handle has nothing in flight (then the native may write).

    Waits for it up to :data:`QUEUE_FULL_TIMEOUT_S`.
    """
    if not len(kafka):
        return True
    deadline = time.monotonic() + QUEUE_FULL_TIMEOUT_S
    while len(kafka):
        if time.monotonic() > deadline:
            return False
        kafka.flush(FLUSH_SLICE_S)
    return True
