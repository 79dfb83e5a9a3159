"""A message past its first delivery: redelivery counts and dead letters (issue 38).

Pulsar's consumer lifecycle, on the pending-ack log:

* **Redelivery count** (:attr:`~txnstream.message.Message.redelivery_count`): how many
  times a record came back to its subscription unacked. An aborted txn's acks give
  their records back (the count is kept by the ``ABORT_MARK`` the coordinator logs, so
  it survives a crash of the consumer, a rebalance and a worker restart); a negative
  ack or ``redeliver_unacknowledged`` logs a ``REDELIVERED`` record. Pulsar keeps its
  count in the broker's memory, where a restart or a topic move resets it. What no
  record says: a consumer that dies holding records it received outside any txn gives
  them to the next owner with their count unchanged (Pulsar's counts those).
* **Dead letters** (:class:`DeadLetterPolicy`): a record whose count is past
  ``max_redeliver_count`` is not handed out again; it is written to the dead-letter
  topic and acked **in one txnstream transaction**, so it is never lost between the two
  and never both delivered again and dead-lettered (Pulsar's client sends it and then
  acks it: two steps). If that transaction fails, its ack comes back as for any aborted
  txn, and the record is dead-lettered at its next turn.

* **Retry letters** (``reconsume_later``): a record the application wants again later
  is written to the retry topic, to be delivered no earlier than its delay
  (:mod:`txnstream.delayed`), and acked, **in one txn** (the caller's, or one of its
  own). The subscription reads the retry topic too. Each retry counts one more
  ``RECONSUMETIMES``; past ``max_redeliver_count`` the record is dead-lettered instead
  (Pulsar's rule). A record read back from the retry topic is retried again, and
  dead-lettered, as of its original topic.

The dead-letter record keeps the original's key, value and headers, and adds where it
came from and why (:data:`DLQ_HEADERS`); a retry letter keeps them too and adds
:data:`RETRY_HEADERS`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txnstream import metrics, validate
from txnstream.delayed import delay_header
from txnstream.errors import ConfigError, TxnStreamError
from txnstream.message import Message
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind

if TYPE_CHECKING:
    from txnstream.delivery import PartitionDelivery
    from txnstream.pendingack.store import PendingAckStore
    from txnstream.producer import Producer
    from txnstream.transaction import Transaction
    from txnstream.types import TopicPartition

__all__ = ["DLQ_HEADERS", "RETRY_HEADERS", "DeadLetterPolicy", "DeadLetters", "Redeliveries",
           "dead_letter_topic_of", "retry_letter_topic_of"]

log = logging.getLogger(__name__)

MAX_REDELIVER_COUNT = 1_000_000
"""The largest ``max_redeliver_count`` taken (more is no dead-letter policy at all)."""

DLQ_HEADERS = ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "REAL_SUBSCRIPTION", "REDELIVERY_COUNT")
"""What a dead-letter record carries after the original's own headers: its topic (Pulsar's
``REAL_TOPIC``), ``topic-partition@offset`` (``ORIGIN_MESSAGE_ID``), the subscription
that gave up on it, and its redelivery count then."""

RETRY_HEADERS = ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUMETIMES", "DELAY_TIME")
"""What a retry letter carries after the original's own headers (Pulsar's names): its
original topic and ``topic-partition@offset`` (kept from the first retry on), how many
times it was retried, and its delay in ms."""

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""A legal Kafka topic name."""


def dead_letter_topic_of(topic: str, subscription: str) -> str:
    """Pulsar's default dead-letter topic of ``topic`` for ``subscription``."""
    return f"{topic}-{subscription}-DLQ"


def retry_letter_topic_of(topic: str, subscription: str) -> str:
    """Pulsar's default retry topic of ``topic`` for ``subscription``."""
    return f"{topic}-{subscription}-RETRY"


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """Pulsar's ``DeadLetterPolicy``: where a record goes past its redeliveries.

    Past ``max_redeliver_count`` redeliveries a record goes to ``dead_letter_topic``
    (default ``<topic>-<subscription>-DLQ``, which must exist), atomically with its ack.
    ``retry_letter_topic`` (or ``enable_retry``: Pulsar's default name,
    ``<topic>-<subscription>-RETRY``; it must exist) turns on ``reconsume_later``: the
    subscription then reads it too.
    """

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    retry_letter_topic: str | None = None
    enable_retry: bool = False

    def __post_init__(self) -> None:
        validate.positive_int(self.max_redeliver_count,
                              "dead_letter_policy.max_redeliver_count", MAX_REDELIVER_COUNT)
        if self.dead_letter_topic is not None:
            _check_topic_name(self.dead_letter_topic, "dead_letter_policy.dead_letter_topic")
        if self.retry_letter_topic is not None:
            _check_topic_name(self.retry_letter_topic, "dead_letter_policy.retry_letter_topic")
        if not isinstance(self.enable_retry, bool):
            raise ConfigError(f"dead_letter_policy.enable_retry must be True or False, got "
                              f"{self.enable_retry!r}")

    @property
    def retries(self) -> bool:
        """Whether ``reconsume_later`` is on."""
        return self.enable_retry or self.retry_letter_topic is not None

    def topic_for(self, topic: str, subscription: str) -> str:
        """Where ``topic``'s dead letters of ``subscription`` go."""
        return self.dead_letter_topic or dead_letter_topic_of(topic, subscription)

    def retry_topic_for(self, topic: str, subscription: str) -> str:
        """Where ``topic``'s retry letters of ``subscription`` go."""
        return self.retry_letter_topic or retry_letter_topic_of(topic, subscription)


def _check_topic_name(name: object, option: str) -> str:
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"{option} must be a Kafka topic name (letters, digits, '.', "
                          f"'_', '-'; at most 249), got {name!r}")
    return name


class Redeliveries:
    """A consumer's records handed out again: each with its count one up, logged.

    ``readers``: the consumer's partitions (``GroupMember.readers``); every method runs
    under the consumer's lock.
    """

    def __init__(self, readers: dict[TopicPartition, PartitionDelivery],
                 acks: PendingAckStore, subscription: str, member_id: str) -> None:
        self._readers = readers
        self._acks = acks
        self._subscription = subscription
        self._member_id = member_id

    def bump(self, msgs: Iterable[Message]) -> list[Message]:
        """``msgs`` come back: the messages to queue.

        Each unacked one counted once more (others as they are), logged in a
        ``REDELIVERED`` record per partition and new count (its ``cursor`` field).
        """
        by_tp: dict[TopicPartition, list[Message]] = {}
        for m in msgs:
            by_tp.setdefault(m.tp, []).append(m)
        out: list[Message] = []
        for tp, ms in by_tp.items():
            r = self._readers.get(tp)
            back = r.came_back(ms) if r is not None else []
            mine = {m.offset for m in back}
            out += back + [m for m in ms if m.offset not in mine]
            if not back or r is None or r.handle is None:
                continue
            metrics.REDELIVERED.labels(self._subscription).inc(len(back))
            by_count: dict[int, list[int]] = {}
            for m in back:
                by_count.setdefault(m.redelivery_count, []).append(m.offset)
            for count, offsets in by_count.items():  # the new count: a replay sets it
                self._acks.append_plain(PendingAckEntry(
                    PendingAckKind.REDELIVERED, self._subscription, tp.topic, tp.partition,
                    None, tuple(sorted(offsets)), r.handle.generation, self._member_id,
                    cursor=count))
        return out


class DeadLetters:
    """A consumer's dead-letter writer (:class:`DeadLetterPolicy`).

    Made by ``client.subscribe``: every dead-letter topic is checked there (it exists,
    and is none of the subscribed topics), so a bad policy is refused before anything
    is read. ``create_producer``, ``transaction`` and ``topic_names`` (the cluster's) are
    the client's.
    """

    def __init__(self, policy: DeadLetterPolicy, topics: Sequence[str], subscription: str,
                 create_producer: Callable[[str], Producer],
                 transaction: Callable[[], AbstractContextManager[Transaction]],
                 topic_names: Callable[[], set[str]]) -> None:
        if not isinstance(policy, DeadLetterPolicy):
            raise ConfigError(f"dead_letter_policy must be a txnstream.DeadLetterPolicy, "
                              f"got {type(policy).__name__}")
        self.policy = policy
        self._transaction = transaction
        self._subscription = subscription
        self._lock = threading.Lock()
        self._producers: dict[str, Producer] = {}
        existing = topic_names()  # a producer's metadata request would create a topic
        self._dlq: dict[str, str] = {}
        """Topic read (a retry topic too) -> its dead-letter topic."""
        self._retry: dict[str, str] = {}
        """Original topic -> its retry topic (``reconsume_later``)."""
        for t in topics:
            self._dlq[t] = self._checked(t, topics, existing, create_producer, retry=False)
            if policy.retries:
                self._retry[t] = self._checked(t, topics, existing, create_producer, True)
                self._dlq[self._retry[t]] = self._dlq[t]
        self.retry_topics = sorted(set(self._retry.values()) - set(topics))
        """What the subscription reads besides its topics (retry letters come back)."""
        self._ack: Callable[[list[Message], Transaction], None] | None = None
        self.dead_lettered = 0
        """Records this consumer dead-lettered (their txn committed)."""
        self.retried = 0
        """Records this consumer wrote to a retry topic in a txn of its own (committed)."""

    def _checked(self, t: str, topics: Sequence[str], existing: set[str],
                 create_producer: Callable[[str], Producer], retry: bool) -> str:
        """``t``'s dead-letter (or retry) topic, checked, with a producer for it."""
        policy, sub = self.policy, self._subscription
        if retry:
            name, kind = policy.retry_topic_for(t, sub), "retry"
            given = policy.retry_letter_topic
        else:
            name, kind = policy.topic_for(t, sub), "dead-letter"
            given = policy.dead_letter_topic
        field = "retry_letter_topic" if retry else "dead_letter_topic"
        option = (f"dead_letter_policy.{field}" if given
                  else f"dead_letter_policy (default {kind} topic of {t!r})")
        _check_topic_name(name, option)
        if name in topics:
            raise ConfigError(f"{option}: {name!r} is a topic this subscription reads; "
                              f"a {kind} letter would come back to it as a new record")
        if retry and name == policy.topic_for(t, sub):
            raise ConfigError(f"{option}: {name!r} is the dead-letter topic too")
        if name not in existing:
            raise ConfigError(f"{option}: topic {name!r} does not exist; create it first")
        if name not in self._producers:
            self._producers[name] = create_producer(name)
        return name

    def bind(self, ack: Callable[[list[Message], Transaction], None]) -> None:
        """``ack(msgs, txn)``: the consumer's ack of one partition's records in a txn."""
        self._ack = ack

    def due(self, msg: Message) -> bool:
        """Whether ``msg`` is past the policy's count: dead-lettered, not handed out."""
        return msg.redelivery_count > self.policy.max_redeliver_count

    def divert(self, msgs: list[Message],
               give_back: Callable[[list[Message]], object]) -> list[Message]:
        """Dead-letter those of ``msgs`` past the count; the others, to hand out.

        One txn writes them to their dead-letter topics and acks them. If it fails
        they are given back (``give_back``: negatively acked, counted once more) and
        tried again at their next turn; the error is logged, never raised to the reader.
        """
        dead = [m for m in msgs if self.due(m)]
        if not dead:
            return msgs
        with self._lock:  # one dead-letter txn of this consumer at a time
            try:
                self._write(dead)
            except Exception as exc:  # noqa: BLE001 - a reader's receive() must go on
                log.error("dead-lettering %d records of %r (first %s@%d) failed, given "
                          "back for another try: %r", len(dead), self._subscription,
                          dead[0].tp, dead[0].offset, exc)
                for m in dead:
                    try:
                        give_back([m])
                    except TxnStreamError as gone:  # revoked meanwhile: its next owner's
                        log.info("%s@%d not given back: %s", m.tp, m.offset, gone)
            else:
                self.dead_lettered += len(dead)
                metrics.DEAD_LETTERED.labels(self._subscription).inc(len(dead))
                log.warning("dead-lettered %d records of %r past %d redeliveries (first "
                            "%s@%d)", len(dead), self._subscription,
                            self.policy.max_redeliver_count, dead[0].tp, dead[0].offset)
        return [m for m in msgs if not self.due(m)]

    def _write(self, dead: list[Message]) -> None:
        """One txn: every record to its dead-letter topic, and its ack (commit or abort)."""
        assert self._ack is not None, "DeadLetters.bind() was not called"
        by_tp: dict[TopicPartition, list[Message]] = {}
        with self._transaction() as txn:
            for m in dead:
                self._producers[self._dlq[m.topic]].send(m.value, m.key, txn=txn,
                                                         headers=self.headers_of(m))
                by_tp.setdefault(m.tp, []).append(m)
            for ms in by_tp.values():
                self._ack(ms, txn)

    def reconsume_later(self, msg: Message, delay: object, txn: Transaction | None) -> None:
        """Write ``msg`` to its retry topic, due after ``delay``, and ack it, in one txn.

        ``txn``: the caller's (its commit decides both), else one of this consumer's,
        committed here. Past ``max_redeliver_count`` retries it is dead-lettered
        instead. ``ConfigError`` if retries are off or ``delay`` is not a delay.
        """
        assert self._ack is not None, "DeadLetters.bind() was not called"
        if not self.policy.retries:
            raise ConfigError("reconsume_later needs retries on: set "
                              "dead_letter_policy.retry_letter_topic or enable_retry=True")
        try:
            after = delay_header(delay, None, True, 0)
        except ConfigError as exc:
            raise ConfigError(f"reconsume_later delay: {exc}") from None
        assert after is not None
        own = dict(msg.headers)
        real = own.get("REAL_TOPIC", b"").decode(errors="replace") or msg.topic
        if real not in self._retry:  # not a header of ours: the topic it was read from
            real = msg.topic if msg.topic in self._retry else self._original_of(msg)
        times = _count_header(own.get("RECONSUMETIMES")) + 1
        with (self._transaction() if txn is None else nullcontext(txn)) as t:
            if times > self.policy.max_redeliver_count:
                self._producers[self._dlq[real]].send(msg.value, msg.key, txn=t,
                                                      headers=self.headers_of(msg))
            else:
                origin = own.get("ORIGIN_MESSAGE_ID") \
                    or f"{msg.topic}-{msg.partition}@{msg.offset}".encode()
                kept = [(k, v) for k, v in msg.headers if k not in RETRY_HEADERS]
                self._producers[self._retry[real]].send(
                    msg.value, msg.key, txn=t, deliver_after=delay, headers=[
                        *kept, ("REAL_TOPIC", real.encode()), ("ORIGIN_MESSAGE_ID", origin),
                        ("RECONSUMETIMES", str(times).encode()), ("DELAY_TIME", after[1])])
            self._ack([msg], t)
        if txn is not None:
            return  # counted by nothing here: the caller's txn may still abort
        if times > self.policy.max_redeliver_count:
            self.dead_lettered += 1
            metrics.DEAD_LETTERED.labels(self._subscription).inc()
        else:
            self.retried += 1
            metrics.RETRIED.labels(self._subscription).inc()

    def _original_of(self, msg: Message) -> str:
        for t, retry in self._retry.items():
            if retry == msg.topic:
                return t
        raise TxnStreamError(f"cannot reconsume {msg.tp}@{msg.offset} later: {msg.topic!r} "
                             f"is not a topic subscription {self._subscription!r} reads")

    def headers_of(self, m: Message) -> list[tuple[str, bytes]]:
        """The dead-letter record's headers: the original's, then where and why."""
        return [*[(k, v) for k, v in m.headers if k not in DLQ_HEADERS],
                ("REAL_TOPIC", dict(m.headers).get("REAL_TOPIC") or m.topic.encode()),
                ("ORIGIN_MESSAGE_ID", dict(m.headers).get("ORIGIN_MESSAGE_ID")
                 or f"{m.topic}-{m.partition}@{m.offset}".encode()),
                ("REAL_SUBSCRIPTION", self._subscription.encode()),
                ("REDELIVERY_COUNT", str(m.redelivery_count).encode())]


def _count_header(raw: bytes | None) -> int:
    """A ``RECONSUMETIMES`` value; one that does not parse counts as none (0)."""
    if raw is None or not raw.isdigit() or len(raw) > 9:
        return 0
    return int(raw)
