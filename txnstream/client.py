"""``Client``: the entry point (Pulsar's ``PulsarClient`` with transactions enabled)."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from txnstream import validate
from txnstream.admin import Admin
from txnstream.config import Config, KafkaSettings
from txnstream.consumer import Consumer
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.tc_client import TransactionCoordinatorClient
from txnstream.errors import (
    ConfigError,
    InvalidTxnStatusError,
    RequestTimeoutError,
    TransactionOutcomeUnknownError,
    TxnStreamError,
)
from txnstream.kafka.native_send import NativeSpares
from txnstream.kafka.topics import cluster_metadata
from txnstream.lifecycle import DeadLetters
from txnstream.pipeline import RequestPipeline
from txnstream.producer import Producer
from txnstream.transaction import Transaction
from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["Client"]

log = logging.getLogger(__name__)

ATTACH_CLOCK_SKEW_S = 2.0
"""An attached handle's deadline counts from the coordinator's wall-clock open time;
hosts' clocks may differ (NTP keeps them within milliseconds, this covers a poorly synced
one). Added, never subtracted: the client must not refuse what the coordinator accepts."""


def _request_timeout(timeout_s: object) -> float | None:
    """A request's deadline as given (None: ``Config.request_timeout_s``), checked."""
    if timeout_s is None:
        return None
    return validate.timeout_seconds(timeout_s, "timeout_s",
                                    maximum=validate.MAX_REQUEST_TIMEOUT_S,
                                    cap="a request's deadline")


class Client:
    """Connects to Kafka; opens transactions, producers and consumers.

    ``Client("host:9092", **{"security.protocol": ...})``: librdkafka settings pass
    through to every Kafka client it makes. Pass ``config=`` for full control.
    """

    def __init__(self, bootstrap_servers: str | None = None, *, config: Config | None = None,
                 **kafka: Any) -> None:
        if bootstrap_servers is not None and not isinstance(bootstrap_servers, str):
            hint = ": pass a Config as Client(config=...)" if isinstance(
                bootstrap_servers, Config) else ""
            raise ConfigError("bootstrap_servers must be a 'host:port[,host:port...]' "
                              f"string, not {type(bootstrap_servers).__name__}{hint}")
        if config is None:
            config = Config.from_env(bootstrap_servers,
                                     kafka=KafkaSettings(kafka, origin="given to Client()"))
        elif bootstrap_servers or kafka:
            raise ConfigError("pass either config= or bootstrap_servers/librdkafka settings")
        self.config = config
        self._tc: TransactionCoordinatorClient | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._registrations = RequestPipeline()
        self._made: weakref.WeakSet[Producer | Consumer] = weakref.WeakSet()
        """Producers and consumers made here and not collected: :meth:`close` closes them."""
        self._served: set[str] = set()
        """Topics this client had served for a delayed plain send (:meth:`_serve`)."""
        self._spares = NativeSpares()
        """Native ``send_batch`` handles made ahead for the next producer (bounded)."""
        self.admin = Admin(config, lambda: self.tc)

    @property
    def tc(self) -> TransactionCoordinatorClient:
        """The coordinator client, made on first use."""
        with self._lock:
            self._check_open()
            if self._tc is None:
                self._tc = TransactionCoordinatorClient(self.config)
            return self._tc

    def new_transaction(self, timeout_s: float | None = None, tc_id: int | None = None,
                        group_key: str | None = None,
                        max_prepared_s: float | None = None) -> Transaction:
        """Open a transaction on the next coordinator (round-robin), or on ``tc_id``.

        ``group_key`` names the group commit (``END_GROUP``) it is meant for: when that
        group ends, the coordinator aborts every txn of the key left OPEN outside it.
        ``timeout_s`` (default ``Config.default_txn_timeout_s``) is a number of seconds
        from 0.001 (the coordinator counts whole ms) to ``Config.max_txn_timeout_s``;
        ``max_prepared_s`` (default ``Config.default_max_prepared_s``) how long it may
        stay prepared (``txn.prepare()``) before the coordinator aborts it, up to
        ``Config.max_prepared_s``; ``ConfigError`` naming the argument otherwise, before
        anything is taken.
        """
        prepared = None if max_prepared_s is None else validate.timeout_seconds(
            max_prepared_s, "max_prepared_s", maximum=self.config.max_prepared_s,
            cap="Config.max_prepared_s")
        txn = self._new_transaction(timeout_s, tc_id, group_key)
        txn.max_prepared_s = prepared
        return txn

    def _new_transaction(self, timeout_s: float | None, tc_id: int | None,
                         group_key: str | None) -> Transaction:
        timeout = self._txn_timeout(timeout_s)
        if tc_id is not None:
            tc_id = validate.whole_number(tc_id, "tc_id")  # its range: request() checks
        if group_key is not None:
            validate.nonempty_text(group_key, "group_key")
        if tc_id is None and group_key is None:
            # A TxnID from a reserved block, activated in the background (commit waits):
            # no round trip of its own. Its deadline counts from now on both sides.
            tc_id, seq, key = self.tc.txn_ids.take()
            txn = Transaction(self.tc, TxnID(tc_id, seq), timeout,
                              pipeline=self._registrations, key=key)
            open_ms, timeout_ms = int(time.time() * 1000), int(timeout * 1000)
            activate = self.tc.txn_ids.activation(tc_id, seq, timeout_ms, open_ms)
            if not txn.activate_in_background(open_ms, timeout_ms, activate):
                activate()
            return txn
        if tc_id is None:
            tc_id = self.tc.pick_coordinator()
        reply = self.tc.request(TcOp.NEW, tc_id, timeout_ms=int(timeout * 1000),
                                group_key=group_key)
        # Its deadline counts from now, after the reply: never before the coordinator's.
        return Transaction(self.tc, TxnID(tc_id, reply.txn_seq), timeout,
                           pipeline=self._registrations, key=_first_key(reply.txn_keys))

    def _txn_timeout(self, timeout_s: object) -> float:
        """A transaction's timeout in seconds: ``timeout_s`` checked, or the default."""
        if timeout_s is None:
            return self.config.default_txn_timeout_s
        return validate.timeout_seconds(timeout_s, "timeout_s",
                                        maximum=self.config.max_txn_timeout_s,
                                        cap="Config.max_txn_timeout_s")

    def attach_transaction(self, txn_id: TxnID | str) -> Transaction:
        """A handle on an OPEN transaction another process opened, by its id.

        ``txn_id`` is a ``TxnID`` or its text form (``str(txn.id)``, e.g. ``"(0,42)"``),
        passed from the process that opened it. Sends and acks through the handle join
        that transaction; the opener commits or aborts it. Before telling the opener it
        is done, the writer calls ``txn.flush()``: it waits for the handle's
        registrations and sends and then checks with the coordinator that the
        transaction was still OPEN after they landed, so no record can trail the
        transaction's markers unnoticed (such a record would be dropped by every
        reader). ``txn.status`` reads TIMED_OUT once the transaction's deadline (its
        coordinator open time plus its timeout) has passed.

        Raises ``ConfigError`` (a ``ValueError``) for text that is not a TxnID,
        ``InvalidTxnStatusError`` if the transaction is not OPEN,
        ``TransactionNotFoundError`` if the coordinator does not know it.
        """
        tid = validate.txn_id(txn_id, "txn_id")
        reply = self.tc.request(TcOp.GET, tid.tc_id, txn_seq=tid.least_bits)
        info = reply.txns[0]
        if info.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(tid, TxnStatus.OPEN, info.status,
                                        f"cannot attach to transaction {tid}: it is "
                                        f"{info.status.value}")
        age_s = max(0.0, time.time() - info.open_time_ms / 1000)
        return Transaction(self.tc, tid, info.timeout_ms / 1000, attached=True,
                           opened_at=time.monotonic() - age_s + ATTACH_CLOCK_SKEW_S,
                           pipeline=self._registrations, key=_first_key(reply.txn_keys))

    def complete_transaction(self, txn_id: TxnID | str, commit: bool,
                             timeout_s: float | None = None) -> TxnStatus:
        """Commit or abort a prepared transaction from any process of its owner (or an admin).

        The second phase of ``txn.prepare()`` (docs/api.md, *Prepared transactions*):
        ``txn_id`` as a ``TxnID`` or its text form ``"(tc,seq)"``. Idempotent: completing
        it again the same way returns the same status. Returns COMMITTED or ABORTED once
        the decision is durable. ``TransactionTimeoutError`` if it was aborted at its
        maximum prepared age (a commit is refused), ``InvalidTxnStatusError`` if it ended
        the other way, ``TransactionNotFoundError`` if its coordinator does not know it,
        ``TransactionOutcomeUnknownError`` if unanswered (ask again). A txn not prepared
        yet is ended by the usual rules (its opener's flush tells it where its records
        landed).
        """
        tid = validate.txn_id(txn_id, "txn_id")
        validate.flag(commit, "commit")
        try:
            self.tc.request(TcOp.END, tid.tc_id, timeout_s=_request_timeout(timeout_s),
                            txn_seq=tid.least_bits, commit=commit)
        except RequestTimeoutError as exc:
            raise TransactionOutcomeUnknownError(
                f"completing {tid} got no answer: call complete_transaction again to learn "
                "its outcome", tid) from exc
        return TxnStatus.COMMITTED if commit else TxnStatus.ABORTED

    def end_group(self, tc_id: int, group_key: str, txn_seqs: Sequence[int],
                  commit: bool = True, timeout_s: float | None = None) -> bool:
        """End the txns ``txn_seqs`` of coordinator ``tc_id`` as one group under ``group_key``.

        Committing a group is all or nothing, and idempotent by its key: a repeat (a lost
        reply asked again, or a replayed batch) commits nothing new, and the coordinator
        aborts the txns it names that are not in the group that ended first. Returns
        whether the key had already ended (``already``): True when this call ended
        nothing itself. Raises the coordinator's error (``TransactionTimeoutError``,
        ``InvalidTxnStatusError``: the group was aborted), or ``RequestTimeoutError`` if
        no reply came in time (the outcome is unknown: ask again under the same key).

        A key ``<stream>/<n>`` (``n`` decimal) is version ``n`` of its stream, as the Spark
        sink's ``<query id>/<batch id>``: commit a stream's versions in increasing order.
        Once a version's outcome is forgotten (docs/coordinator.md "Retention"), a
        commit of it or of any lower version is refused rather than risked twice.
        """
        tc_id = validate.whole_number(tc_id, "tc_id")
        validate.nonempty_text(group_key, "group_key")
        if isinstance(txn_seqs, (str, bytes)):
            raise ConfigError(f"txn_seqs must be a sequence of ints, got {txn_seqs!r:.80}")
        seqs = tuple(validate.whole_number(s, f"txn_seqs[{i}]", maximum=validate.MAX_LONG)
                     for i, s in enumerate(txn_seqs))
        validate.flag(commit, "commit")
        reply = self.tc.request(TcOp.END_GROUP, tc_id, timeout_s=_request_timeout(timeout_s),
                                group_key=group_key, group_seqs=seqs, commit=commit)
        return reply.already

    def abort_transaction(self, txn_id: TxnID | str, timeout_s: float | None = None) -> None:
        """Abort an open transaction by its id, without a handle on it.

        For a txn another process opened and passed the TxnID of. Aborting one already
        aborted is a no-op; one that committed raises ``InvalidTxnStatusError``.
        """
        tid = validate.txn_id(txn_id, "txn_id")
        self.tc.request(TcOp.END, tid.tc_id, timeout_s=_request_timeout(timeout_s),
                        txn_seq=tid.least_bits, commit=False)

    @contextmanager
    def transaction(self, timeout_s: float | None = None) -> Iterator[Transaction]:
        """Commit on normal exit, abort on an exception (which is re-raised)."""
        txn = self.new_transaction(timeout_s)
        with txn:
            yield txn

    def create_producer(self, topic: str, **kafka: Any) -> Producer:
        """A producer for ``topic``; extra librdkafka settings apply to it alone.

        Closed by :meth:`close` if not closed before.
        """
        self._check_open()
        producer = Producer(self.config, topic, serve=self._serve, spares=self._spares,
                            **kafka)
        self._made.add(producer)
        return producer

    def _serve(self, tp: TopicPartition) -> None:
        """Have the buffer owners serve ``tp``'s topic, before a delayed plain send to it.

        Readers that plan ahead (the Spark source) learn a record's due time from the
        served state; a topic no txn wrote to is not served. One empty txn registers it
        (once per client and topic; its COMMIT marker is all it writes).
        """
        if tp.topic not in self._served:
            with self.transaction() as txn:
                txn.register_partitions([tp])
            self._served.add(tp.topic)

    def subscribe(self, topics: str | Sequence[str], subscription: str,
                  initial_position: str = "earliest", **options: Any) -> Consumer:
        """A committed-only consumer; ``subscription`` is its Kafka consumer group.

        ``dead_letter_policy``: a :class:`~txnstream.lifecycle.DeadLetterPolicy` (records
        past its redelivery count go to its dead-letter topic, atomically with their ack;
        with a retry topic, the subscription reads that too, for ``reconsume_later``).
        Closed by :meth:`close` if not closed before.
        """
        self._check_open()
        policy = options.pop("dead_letter_policy", None)
        if policy is not None:
            names = [topics] if isinstance(topics, str) else list(topics)
            letters = DeadLetters(policy, names, subscription, self.create_producer,
                                  self.transaction, self._topic_names)
            options["dead_letters"], topics = letters, [*names, *letters.retry_topics]
        consumer = Consumer(self.config, self.admin, topics, subscription, initial_position,
                            **options)
        self._made.add(consumer)
        return consumer

    def close(self) -> None:
        """Close the producers and consumers made here, then the coordinator client.

        As Pulsar's ``PulsarClient.close()`` does: each producer is flushed and each
        consumer commits its cursor and leaves its group (their own ``close()``; those
        closed already are skipped). Pipelined registrations not sent yet are dropped:
        their transactions become abort-only.
        Every client is closed even if one fails; the first failure is raised after.
        Afterwards this client makes nothing new: a use raises ``TxnStreamError``.
        """
        failed: Exception | None = None
        for made in list(self._made):
            try:
                made.close()
            except Exception as exc:  # the others still close
                log.warning("closing %r: %s", made, exc)
                failed = failed or exc
        self._made.clear()
        self._spares.close()
        self._registrations.close()
        with self._lock:
            self._closed = True
            tc, self._tc = self._tc, None
        if tc is not None:
            tc.close()
        if failed is not None:
            raise failed

    def _topic_names(self) -> set[str]:
        """Every topic of the cluster (a metadata request for all creates none)."""
        from confluent_kafka.admin import AdminClient

        meta = cluster_metadata(AdminClient(self.config.admin()), self.config.admin_timeout_s,
                                f"listing the topics of {self.config.bootstrap_servers}")
        return {name for name, t in meta.topics.items() if t.error is None}

    def _check_open(self) -> None:
        if self._closed:  # a use after close() would make connections nobody closes
            raise TxnStreamError("this txnstream Client is closed: make a new one")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # the body's error is the one to see, not a close's after it
            log.warning("closing the client after an error", exc_info=True)


def _first_key(keys: Sequence[bytes]) -> bytes | None:
    """The txn key a reply gives for its one TxnID (None: the workers check no membership)."""
    return keys[0] if keys and keys[0] else None
