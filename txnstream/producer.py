"""``Producer``: plain and transactional sends to one topic (Pulsar's ``Producer``).

A transactional send (``txn=...``) first registers its partition with the coordinator
(once per transaction and partition, cached on the transaction; pipelined, in the
background, once the client has registered the topic: see ``txnstream.transaction``),
then writes the record straight into the real partition with the ``txn.id`` header.
Committed-only readers hold it back until the coordinator's COMMIT marker follows; an
ABORT marker drops it.

Many transactions may be open at once on one producer: outstanding sends are counted
per transaction, and ``Transaction.commit()`` waits only for its own. A failed send makes
its transaction abort-only.

The per-record cost is kept close to a plain ``produce()``: each transaction's sends
through a producer share one :class:`TxnSends` (its ``txn.id`` header list, one delivery
callback, the partitions already registered), so a send builds no closure and no header
list, skips ``register_partitions`` for a known partition, and takes the producer's lock
once (to count itself); a delivery report only appends to a list. ``send_batch`` goes
further where the native send loads: the whole batch is handed to a librdkafka handle of
txnstream's own in one C call, and its delivery reports are counted in C
(:mod:`txnstream.send_paths`, which also keeps each partition's order between the two
handles).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka import Producer as KafkaProducer

from txnstream import validate
from txnstream.config import check_txn_producer
from txnstream.delayed import delay_header
from txnstream.errors import ConfigError, KafkaClientError, TxnStreamError, classify_kafka_error
from txnstream.kafka.clients import close_producer
from txnstream.kafka.partitioning import murmur2_partition, murmur2_partitions
from txnstream.kafka.topics import cluster_metadata
from txnstream.markers import RESERVED_HEADERS
from txnstream.send_paths import (
    FLUSH_SLICE_S,
    POLL_EVERY,
    QUEUE_FULL_TIMEOUT_S,
    KafkaHeaders,
    SendPaths,
    TxnSends,
)
from txnstream.types import TopicPartition

if TYPE_CHECKING:
    from txnstream.config import Config
    from txnstream.kafka.native_send import NativeSpares
    from txnstream.transaction import Transaction

__all__ = ["Producer", "murmur2_partition"]

_TxnSends = TxnSends  # its old name (tests)

Headers = Sequence[tuple[str, bytes | None]] | None
"""A record's own headers; a None value is a header without a value, as Kafka allows."""

FLUSH_TIMEOUT_S = 30.0
"""How long commit() waits for a txn's sends; longer than librdkafka's delivery timeout
would be pointless, shorter would abort healthy but slow transactions."""


TOPIC_WAIT_S = 5.0
"""How long a new producer waits for its topic's metadata (a topic just created may be
unknown, or without leaders, to the broker answering for a moment)."""


def _count(kafka: KafkaProducer, topic: str, timeout_s: float, where: str) -> int:
    """``topic``'s partition count as the cluster (``where``) says now; 0 if it does not.

    ``KafkaClientError`` if the cluster does not answer (:func:`cluster_metadata`).
    """
    tmeta = cluster_metadata(kafka, timeout_s, f"a producer of topic {topic!r} on {where}",
                             topic).topics.get(topic)
    return len(tmeta.partitions) if tmeta is not None and tmeta.error is None else 0


def _partitions_of(kafka: KafkaProducer, topic: str, timeout_s: float, where: str) -> int:
    """``topic``'s partition count, waiting up to :data:`TOPIC_WAIT_S` for its metadata.

    Java's producer waits for a topic's metadata too (``max.block.ms``); a topic still
    unknown then is a ``ConfigError`` naming it.
    """
    deadline = time.monotonic() + min(TOPIC_WAIT_S, timeout_s)
    while True:
        if n := _count(kafka, topic, timeout_s, where):
            return n
        if time.monotonic() >= deadline:
            raise ConfigError(f"topic {topic!r} does not exist on {where}")
        time.sleep(0.1)


IN_FLIGHT = "max.in.flight.requests.per.connection"
IN_FLIGHT_NAMES = (IN_FLIGHT, "max.in.flight")
"""librdkafka's name of the setting, and its alias."""
DATA_IN_FLIGHT = 1
"""Produce requests a data producer has in flight per broker connection, unless the user
sets it. librdkafka's idempotent producer makes a new request for a partition only while
fewer than five of its records are in flight there, yet wakes its broker thread at once
for records ready to send behind them: it polls with a zero timeout until the broker
answers, a core per producer for as long as the broker takes (on a machine the broker
shares, the spinning producers slowed it further: 4 of 6 rounds of ``send_batch`` at a
tenth of their rate, docs/architecture.md). With one request in flight, the next one
waits in the connection's queue and the thread sleeps; a partition makes no more than
one request at a time anyway once five of its records are in flight. It still spins for
a topic with one partition on the broker (nothing else to queue): librdkafka's."""


def data_producer_settings(config: Config, **kafka: object) -> dict[str, object]:
    """The settings of a data producer's handles (confluent-kafka's and the native one).

    ``Config.producer()``, with at most :data:`DATA_IN_FLIGHT` requests in flight per
    connection unless ``kafka`` or ``config.kafka`` set it.
    """
    settings = config.producer(**kafka)
    if not any(name in kafka or name in config.kafka for name in IN_FLIGHT_NAMES):
        settings[IN_FLIGHT] = DATA_IN_FLIGHT
    return settings


class Producer:
    """Sends to one topic; thread-safe; use ``client.create_producer(topic)``.

    Made for txns, so it refuses, before connecting, librdkafka settings that would let
    a record count as delivered without being durable (``acks`` other than all,
    ``enable.idempotence`` off: ``ConfigError`` naming the setting and where it came
    from), as Kafka refuses them for a transactional producer.
    """

    def __init__(self, config: Config, topic: str,
                 serve: Callable[[TopicPartition], None] | None = None,
                 spares: NativeSpares | None = None, **kafka: object) -> None:
        self.topic = topic
        self._serve = serve
        """Has the topic served before a delayed plain send (``Client._serve``)."""
        check_txn_producer(kafka, f"given to create_producer({topic!r})")
        self._settings = data_producer_settings(config, **kafka)
        self._kafka = KafkaProducer(self._settings)
        self._closed = False
        self._lock = threading.Lock()
        self._paths = SendPaths(self._settings, topic, self._lock, spares)
        """``send_batch``'s native way to librdkafka, and its order with ``send``."""
        self._timeout_s = config.admin_timeout_s
        self._where = config.bootstrap_servers
        self.num_partitions = _partitions_of(self._kafka, topic, config.admin_timeout_s,
                                             config.bootstrap_servers)
        self._rr = itertools.count()
        self._outstanding: dict[Transaction, TxnSends] = {}
        """Per transaction handle (an identity hash: cheaper than a TxnID's); dropped once
        all its sends are acknowledged, by its flush or by the next txn's first send."""
        self._sends = 0

    def _partition_for(self, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            partition = validate.partition_index(partition, "partition")
            if partition >= self.num_partitions and not self._grown(partition):
                raise self._no_partition(partition)
            return partition
        if key is not None:
            return murmur2_partitions((key,), self.num_partitions)[0]
        return next(self._rr) % self.num_partitions

    def partitions_for(self, keys: Sequence[bytes | None]) -> list[int]:
        """The partition :meth:`send` would pick for each of ``keys``, for :meth:`send_batch`.

        A key's is Java's (``murmur2``), as for a keyed :meth:`send`; ``None``'s the next
        in turn.
        """
        n, rr = self.num_partitions, self._rr
        parts = murmur2_partitions(keys, n)
        if -1 in parts:  # keyless: each the next in turn
            parts = [next(rr) % n if p < 0 else p for p in parts]
        return parts

    def _grown(self, partition: int) -> bool:
        """Whether ``partition``, beyond the count this producer knew, exists now.

        As Java's producer does for a partition its metadata lacks, asks the cluster
        again (both librdkafka handles, so each can produce to it) for up to
        :data:`TOPIC_WAIT_S`: partitions just added reach the broker answering a moment
        later. :attr:`num_partitions` follows what both handles know.
        """
        deadline = time.monotonic() + min(TOPIC_WAIT_S, self._timeout_s)
        while True:
            known = _count(self._kafka, self.topic, self._timeout_s, self._where)
            native = self._paths.partitions(self._timeout_s)
            if native is not None:
                known = min(known, native)
            with self._lock:  # never lowered by a slower thread's older answer
                self.num_partitions = max(self.num_partitions, known)
            if partition < self.num_partitions:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _refused(self, exc: KafkaException, parts: Sequence[int],
                 txn: Transaction | None) -> KafkaClientError:
        """A record librdkafka refused, as txnstream's error naming topic and partitions.

        A topic deleted under the producer is refused with ``_UNKNOWN_TOPIC``.
        """
        named = ",".join(map(str, parts[:8])) + (",..." if len(parts) > 8 else "")
        return KafkaClientError(f"send to {self.topic}-{named} refused: {exc.args[0]}",
                                classify_kafka_error(exc), txn.id if txn else None)

    def _no_partition(self, partition: int) -> ConfigError:
        return ConfigError(f"partition {partition} does not exist: {self.topic} has "
                           f"{self.num_partitions} (0..{self.num_partitions - 1})")

    def send(self, value: bytes | None, key: bytes | str | None = None,
             txn: Transaction | None = None, partition: int | None = None,
             headers: Headers = None, deliver_after: object = None,
             deliver_at: object = None) -> int:
        """Send one record (asynchronously); returns the partition it goes to.

        With ``txn``: raises ``InvalidTxnStatusError`` before writing anything if the
        transaction is not OPEN; registers the partition with the coordinator first
        (:meth:`Transaction.register_partitions`: awaited for the topic's first
        registration by this client, else pipelined and awaited by the commit).

        ``deliver_after`` (a ``timedelta`` or seconds) or ``deliver_at`` (epoch ms or an
        aware ``datetime``): readers deliver it no earlier than then; in a txn
        ``deliver_after`` counts from the commit (:mod:`txnstream.delayed`).

        ``KafkaClientError`` naming the topic if librdkafka refuses the record (a topic
        deleted under the producer).
        """
        kbytes = key.encode() if isinstance(key, str) else key
        part = self._partition_for(kbytes, partition)
        if headers:
            for name, _ in headers:
                if name in RESERVED_HEADERS:
                    raise ConfigError(f"header {name!r} is reserved for txnstream")
        delay = None
        if deliver_after is not None or deliver_at is not None:
            delay = delay_header(deliver_after, deliver_at, txn is not None,
                                 int(time.time() * 1000))
            headers = [*(headers or ()), delay]  # type: ignore[list-item]
        try:
            return self._send(value, kbytes, part, txn, headers, delay)
        except KafkaException as exc:
            raise self._refused(exc, [part], txn) from exc

    def _send(self, value: bytes | None, kbytes: bytes | None, part: int,
              txn: Transaction | None, headers: Headers,
              delay: tuple[str, bytes] | None) -> int:
        if self._paths.used:
            self._paths.wait_native()
        if txn is None:
            if delay is not None and self._serve is not None:
                self._serve(TopicPartition(self.topic, part))
            self._kafka.produce(self.topic, value, kbytes, partition=part,
                                headers=list(headers) if headers else None)
            self._kafka.poll(0)
            return part
        known = self._outstanding.get(txn)  # a dict read: no lock
        if known is None or part not in known.registered:
            txn.register_partitions([TopicPartition(self.topic, part)])
        with txn.sending():  # an end waits for this block; none starts after it
            sends = self._count(txn, 1)
            try:
                ours = sends.headers_at(part)
                self._produce(value, kbytes, part, [*headers, *ours] if headers else ours,
                              sends.delivered)
            except BaseException:
                self._uncount(sends, 1)  # never handed to librdkafka: not outstanding
                raise
        sends.registered.add(part)
        if not self._sends % POLL_EVERY:  # callbacks are also served by the txn's flush
            self._kafka.poll(0)
        return part

    def _produce(self, value: bytes | None, key: bytes | None, part: int,
                 headers: KafkaHeaders,
                 on_delivery: Callable[[KafkaError | None, Message], None]) -> None:
        """``produce()``, waiting while librdkafka's queue is full (up to a deadline)."""
        deadline: float | None = None  # taken only once the queue is full: rarely
        while True:
            try:
                self._kafka.produce(self.topic, value, key, partition=part, headers=headers,
                                    on_delivery=on_delivery)
                return
            except BufferError:
                if deadline is None:
                    deadline = time.monotonic() + QUEUE_FULL_TIMEOUT_S
                elif time.monotonic() > deadline:
                    raise
                self._kafka.poll(0.05)  # let it drain

    def prepare_batches(self) -> None:
        """Make now what :meth:`send_batch` would make at its first call.

        Where the native send loads, its librdkafka handle is made at the first batch,
        and that batch's delivery waits for the handle's connections and producer id (half
        a second of the exactly-once processor's first checkpoint). A producer that will
        send batches calls this while it does other things (joins a group). Idempotent.
        """
        self._paths.native(self._kafka)

    def send_batch(self, values: Sequence[bytes | None], partitions: Sequence[int],
                   txn: Transaction, keys: Sequence[bytes | None] | None = None,
                   deliver_after: object = None, deliver_at: object = None) -> None:
        """Send many records of ``txn``, ``values[i]`` to ``partitions[i]`` (asynchronously).

        What :meth:`send` does for each, at a fraction of the cost: the distinct
        partitions are registered in one request and one delivery callback serves all.
        The caller chooses the partitions (:func:`murmur2_partition` for keyed records).
        ``ValueError`` if the lengths differ, ``ConfigError`` for a partition the topic
        does not have, ``InvalidTxnStatusError`` if ``txn`` is not OPEN,
        ``KafkaClientError`` naming the topic if librdkafka refuses the records. A delay
        (``deliver_after``, ``deliver_at``: as :meth:`send`'s) applies to every record.
        Example: docs/api.md.
        """
        delay = None if deliver_after is None and deliver_at is None else \
            delay_header(deliver_after, deliver_at, True, int(time.time() * 1000))
        n = len(values)
        if len(partitions) != n or (keys is not None and len(keys) != n):
            raise ValueError(f"send_batch: {n} values, {len(partitions)} partitions and "
                             f"{'no' if keys is None else len(keys)} keys")
        if not n:
            return
        partitions = self._checked_partitions(partitions)
        used = sorted(set(partitions))
        if used[-1] >= self.num_partitions and not self._grown(used[-1]):
            raise self._no_partition(used[-1])
        txn.register_partitions([TopicPartition(self.topic, p) for p in used])
        with txn.sending(n):
            try:
                self._send_batch(values, partitions, keys, self._count(txn, n), n, delay)
            except KafkaException as exc:
                raise self._refused(exc, used, txn) from exc

    @staticmethod
    def _checked_partitions(partitions: Sequence[int]) -> Sequence[int]:
        """``partitions`` if every one is an int partition index, else a checked copy.

        Checked before anything is registered or sent. The common case (plain ints, as
        ``murmur2_partition`` or a ``tolist()`` gives) costs one pass in C; anything
        else (a bool, a float, numpy ints) is checked one by one, naming its index.
        """
        if isinstance(partitions, (str, bytes)):
            raise ConfigError(f"partitions must be a sequence of ints, got {partitions!r:.80}")
        if set(map(type, partitions)) == {int} \
                and 0 <= min(partitions) and max(partitions) <= validate.MAX_PARTITION:
            return partitions
        return [validate.partition_index(p, f"partitions[{i}]")
                for i, p in enumerate(partitions)]

    def _send_batch(self, values: Sequence[bytes | None], partitions: Sequence[int],
                    keys: Sequence[bytes | None] | None, sends: TxnSends, n: int,
                    delay: tuple[str, bytes] | None = None) -> None:
        """Hand the ``n`` records, counted on ``sends``, to librdkafka.

        Natively where the native send loads (:class:`~txnstream.send_paths.SendPaths`
        says when, and how the order with :meth:`send` is kept), else through
        confluent-kafka.
        """
        if self._paths.send(self._kafka, values, partitions, keys, sends, n, delay,
                            partial(self._uncount, sends)):
            return
        if self._paths.used:
            self._paths.wait_native()
        self._send_python(values, partitions, keys, sends, n, delay)

    def _send_python(self, values: Sequence[bytes | None], partitions: Sequence[int],
                     keys: Sequence[bytes | None] | None, sends: TxnSends, n: int,
                     delay: tuple[str, bytes] | None = None) -> None:
        """The batch through confluent-kafka: a ``produce()`` and a report per record."""
        by_part, headers_at, delivered = sends.headers, sends.headers_at, sends.delivered
        if delay is not None:  # the txn's headers and the delay, made once per partition
            by_part = {p: [*headers_at(p), delay] for p in set(partitions)}
        produce, poll, topic = self._kafka.produce, self._kafka.poll, self.topic
        sent = 0
        try:
            for value, key, part in zip(values, keys if keys is not None else [None] * n,
                                        partitions, strict=True):
                hdrs = by_part.get(part) or headers_at(part)
                while True:
                    try:
                        produce(topic, value, key, partition=part, headers=hdrs,
                                on_delivery=delivered)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        poll(0.05)
                sent += 1
                if sent % POLL_EVERY == 0:
                    poll(0)
        except BaseException:
            self._uncount(sends, n - sent)  # never handed to librdkafka: not outstanding
            raise

    def _count(self, txn: Transaction, n: int) -> TxnSends:
        """Count ``n`` sends of ``txn`` as outstanding (inside ``txn.sending()``)."""
        with self._lock:
            sends = self._outstanding.get(txn)
            if sends is not None:
                sends.sent += n
                self._sends += n
                if len(sends.acks) >= POLL_EVERY:
                    sends.outstanding()
                return sends
            self._sweep()
            sends = self._outstanding[txn] = TxnSends(self.topic, txn)
            sends.sent = n
            self._sends += n
        # Inside txn.sending(), so before any end runs the flushers: one per producer and
        # txn, not one per record.
        txn.add_flusher(partial(self.flush_transaction, txn), key=self)
        return sends

    def _uncount(self, sends: TxnSends, n: int) -> None:
        with self._lock:
            sends.sent -= n

    def _sweep(self) -> None:
        """Drop the bookkeeping of txns whose sends are all acknowledged (lock held).

        So a txn that is never flushed (abandoned, timed out) leaves nothing behind. A
        later send of such a txn counts itself on a new ``TxnSends``: counting and
        dropping both happen under the lock, so no send is counted on a dropped one.
        """
        for txn in [t for t, sends in self._outstanding.items() if not sends.outstanding()]:
            del self._outstanding[txn]

    def tracked_txns(self) -> int:
        """Txns with send bookkeeping (a bound test reads it)."""
        with self._lock:
            return len({txn.id for txn in self._outstanding})

    def flush_transaction(self, txn: Transaction, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until every send of ``txn`` through this producer is acknowledged.

        Waits for this transaction's sends only (serving delivery callbacks meanwhile),
        not for every send of the producer as ``flush()`` would: those made through any
        handle on the same TxnID (``attach_transaction``) in this process. It waits in
        short librdkafka ``flush()`` calls, not ``poll()``: while one runs, librdkafka
        sends what it holds back for ``linger.ms`` at once (as Kafka's
        ``commitTransaction()`` flushes), so a commit does not wait out the linger.
        """
        txn_id = txn.id
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                left = native_left = 0
                for handle, sends in list(self._outstanding.items()):
                    if handle.id == txn_id:
                        n = sends.outstanding()
                        if n:
                            left += n
                            if sends.tally is not None:
                                native_left += sends.tally.outstanding
                        else:
                            del self._outstanding[handle]
            if not left:
                return
            if time.monotonic() > deadline:
                raise TxnStreamError(f"{left} sends of {txn_id} to {self.topic} not "
                                     f"acknowledged within {timeout_s:.0f}s", txn_id)
            native = native_left > 0 and self._paths.flush_slice()
            if left > native_left or not native:
                self._kafka.flush(FLUSH_SLICE_S)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait for every outstanding send."""
        deadline = time.monotonic() + timeout_s
        self._paths.flush(timeout_s)
        self._kafka.flush(max(0.0, deadline - time.monotonic()))

    def close(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Flush, then close the Kafka producer; a second call does nothing.

        A send not delivered within ``timeout_s`` is dropped; its transaction can then
        only abort.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self._paths.close(timeout_s)
        close_producer(self._kafka, max(0.0, deadline - time.monotonic()))
