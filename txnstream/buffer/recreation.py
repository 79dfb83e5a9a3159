"""Whether a served partition's log is still the one its owner folded (a recreated topic).

A data topic can be deleted and created again with the same name while workers run (or
while they are down). The new log starts again at offset 0, so the owner's fold state
(:class:`~txnstream.buffer.transaction_buffer.TransactionBuffer`: ``last_offset``,
``max_read_position``, hidden offsets, aborted spans, ongoing txns) says nothing true
about it: readers following it would stall (the served ``max_read_position`` is above
the new log's end) or skip and deliver the wrong records. The same holds for a log
truncated below the fold position (an unclean leader election).

:class:`LogIdentity` decides, per partition, from what the owner sees at each check
(pure: no I/O, ``tests/unit/buffer/test_recreation.py``):

* the topic's id (Kafka's, ``AdminClient.describe_topics``) differs from the one the
  state was folded on: a new topic, at once, whatever its offsets;
* else the partition's log exists and ends below the next offset to fold (its high
  watermark < ``last_offset + 1``) at two checks in a row: recreated (the id unknown)
  or truncated. The second check keeps one stale or transient answer (a leader moving)
  from restarting a healthy partition;
* nothing known (the topic deleted and not back, a metadata error,
  ``UNKNOWN_TOPIC_OR_PART``): nothing decided, the state is kept. A topic that stays
  deleted is simply served no further records.

The owner then restarts the partition's state from the new log's start with the log
epoch one higher and publishes a snapshot at once (:mod:`txnstream.buffer.worker`);
readers reload from it (:attr:`~txnstream.buffer.served.BufferView.log_epoch`).

:class:`TopicIds` asks the broker for topic ids (natively where it can): an error, a
missing topic or no admin client means "not known", never "changed".
:class:`LogRestarts` is the owner's side: its periodic check, and the state a newly
served partition's fold starts from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from txnstream.buffer.snapshot import TransactionBufferSnapshot, restore
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.kafka.librdkafka import native_librdkafka
from txnstream.types import TopicPartition

if TYPE_CHECKING:  # readers (the Spark source's planner) use TopicIds without the owner's
    # publisher, whose metrics import prometheus_client
    from txnstream.buffer.publisher import ServedPartition
    from txnstream.config import Config
    from txnstream.kafka.clients import KafkaClientFactory

__all__ = ["LogIdentity", "LogRestarts", "Restart", "TopicIds", "CONFIRM_CHECKS",
           "RECREATION_CHECK_S", "fresh_state", "idle_consumer"]

log = logging.getLogger(__name__)

RECREATION_CHECK_S = 1.0
"""How often an owner checks its served partitions' logs against their folds: one
``describe_topics`` of the served topics and the fetcher's cached high watermarks (the
broker is asked only about a log that seems to end below its fold). Readers of a
recreated topic wait for about two of these."""
CONFIRM_CHECKS = 2
"""Checks in a row that must see the log end below the fold position (same or unknown
topic id) before the state restarts: one answer may be stale or transient."""
IDS_TIMEOUT_S = 1.0
"""Longest wait for one DescribeTopics. librdkafka sends it to the broker its metadata
names controller and, while that broker is down, wakes the request at every state change
of any of the handle's brokers, each wake trying the dead broker again: the handle's
thread for that broker and its main thread burn most of a core for as long as the request
waits (0.8 of a core, for the whole 15 s ``admin_timeout_s``, in every broker kill of a
hostile soak). ``tests/fault/test_topic_ids_spin.py``."""
UNANSWERED_WAIT_S = (3.0, 30.0)
"""After a DescribeTopics that got no answer, how long no id is asked (doubling from the
first to the second with each in a row): the next one first asks the handle's metadata
anew, which in KRaft names a random live broker controller, and no longer the dead one
once the controllers have fenced it (``broker.session.timeout.ms``: 9 s by default, 6 s
in ``txnstream cluster``). Meanwhile the ids are unknown, and a recreated topic is found
by its offsets alone."""
ADMIN_RETRY_S = 60.0
"""After the admin client could not be made, how long topic ids stay unknown before it
is tried again (the high-watermark rule works meanwhile)."""


@dataclass(frozen=True, slots=True)
class Restart:
    """Why a partition's state restarts: its log is not the one folded."""

    reason: str
    """Words for the log line: the topic id changed, or the log ends below the fold."""
    high: int
    """The new log's end (high watermark) as seen, or -1 if not known."""


class LogIdentity:
    """Per served partition: whether its log is still the one folded (module docstring)."""

    def __init__(self, confirm_checks: int = CONFIRM_CHECKS) -> None:
        self.confirm_checks = confirm_checks
        self._below: dict[TopicPartition, int] = {}
        """Checks in a row that saw ``tp``'s log end below its fold position."""

    def check(self, tp: TopicPartition, next_offset: int, high: int, folded_id: str,
              current_id: str) -> Restart | None:
        """One check of ``tp``: a :class:`Restart` if its state must restart, else None.

        ``next_offset`` is the next offset the fold expects (``last_offset + 1``);
        ``high`` the log's high watermark now (negative: not known); ``folded_id`` the
        topic id the state was folded on and ``current_id`` the topic's id now (each ""
        when not known).
        """
        if folded_id and current_id and folded_id != current_id:
            self._below.pop(tp, None)
            return Restart(f"its topic id changed ({folded_id} -> {current_id})", high)
        if high < 0:  # no answer (deleted, not back yet, metadata error): keep counting
            return None
        if high >= next_offset:
            self._below.pop(tp, None)
            return None
        seen = self._below.get(tp, 0) + 1
        if seen < self.confirm_checks:
            self._below[tp] = seen
            return None
        del self._below[tp]
        return Restart(f"its log ends at {high}, below the fold position {next_offset}",
                       high)

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` restarted or is no longer served: its count starts over."""
        self._below.pop(tp, None)


class TopicIds:
    """Kafka topic ids, asked of the broker.

    Where the native module loads, through a consumer of its own that ``idle`` makes (a
    consumer and its ``client.id``, with nothing assigned: a request on a consumer that
    fetches waits behind its fetch parked on the broker, up to ``fetch.wait.max.ms``,
    and the owner asks at each partition it starts serving): one DescribeTopics on that
    handle, of which only names and ids are read (``txnstream._native.topic_ids``).
    confluent-kafka's ``describe_topics`` builds a Python object per partition, replica
    and ISR member: for a topic of 1,024 partitions, 6.2 ms of CPU a call, once a second
    on every buffer owner. Otherwise (or once the native call refuses the consumer),
    through ``AdminClient.describe_topics``. Both give the same answers
    (``tests/integration/buffer/test_topic_ids.py``).
    """

    def __init__(self, make_admin: Callable[[], AdminClient], timeout_s: float,
                 idle: Callable[[], tuple[Consumer, str]] | None = None) -> None:
        """``make_admin`` and ``idle`` are called at the first question asked.

        ``make_admin`` again after a failure; the consumer ``idle`` makes is this object's
        to close.
        """
        self._make_admin = make_admin
        self._timeout_s = timeout_s
        self._admin: AdminClient | None = None
        self._retry_at = 0.0
        self._idle = idle if native_librdkafka() is not None else None
        self._through: tuple[Consumer, str] | None = None
        self._unanswered = 0
        """DescribeTopics in a row that got no answer."""
        self._quiet_until = 0.0

    @property
    def native(self) -> bool:
        """Whether the ids are asked through the native module."""
        return self._idle is not None

    def get(self, topics: Iterable[str]) -> dict[str, str]:
        """Each topic's id (Kafka's base64 text); a topic with no answer is left out."""
        names = sorted(set(topics))
        if not names or time.monotonic() < self._quiet_until:
            return {}
        if self._unanswered:  # the controller it asked may be down: learn the current one
            self._refresh(names[0])
        got = None
        if self._idle is not None:
            got = self._get_native(names)
        if got is None:
            got = self._get_admin(names)
        ids, answered = got
        if answered:
            self._unanswered = 0
        else:
            self._unanswered += 1
            wait = min(UNANSWERED_WAIT_S[0] * 2 ** (self._unanswered - 1), UNANSWERED_WAIT_S[1])
            self._quiet_until = time.monotonic() + wait
        return ids

    def _wait_s(self) -> float:
        return min(self._timeout_s, IDS_TIMEOUT_S)

    def _refresh(self, topic: str) -> None:
        """Ask the handle's metadata anew (one topic's): it names the controller."""
        handle: Any = self._through[0] if self._through is not None else self._admin
        if handle is None:
            return
        try:
            handle.list_topics(topic, timeout=self._wait_s())
        except (KafkaException, RuntimeError) as exc:
            log.debug("metadata for the topic ids' controller: %s", exc)

    def _get_admin(self, names: list[str]) -> tuple[dict[str, str], bool]:
        """The ids through the admin client; whether any answer came."""
        admin = self._admin_()
        if admin is None:
            return {}, True  # not asked: nothing waited on a broker
        try:
            futures = admin.describe_topics(TopicCollection(names),
                                            request_timeout=self._wait_s())
        except Exception as exc:  # no word on any of them: nothing is decided on it
            log.debug("topic ids of %s: %s", names, exc)
            return {}, False
        out: dict[str, str] = {}
        answered = False
        for name, fut in futures.items():
            try:
                desc = fut.result(self._wait_s() + 1.0)
            except KafkaException as exc:  # deleted, not authorized: an answer; timed out: not
                log.debug("topic id of %s: %s", name, exc)
                answered |= exc.args[0].code() != KafkaError._TIMED_OUT
                continue
            except Exception as exc:  # noqa: BLE001 - no word on it
                log.debug("topic id of %s: %s", name, exc)
                continue
            answered = True
            if desc.topic_id is not None and str(desc.topic_id):
                out[name] = str(desc.topic_id)
        return out, answered

    def _get_native(self, names: list[str]) -> tuple[dict[str, str], bool] | None:
        """The ids through the idle consumer, and whether an answer came.

        None if the native call refuses the consumer (it is never asked again).
        """
        mod = native_librdkafka()
        assert mod is not None and self._idle is not None
        try:
            if self._through is None:
                self._through = self._idle()
            consumer, client_id = self._through
            ids, why = mod.topic_ids(consumer, client_id, names,
                                     max(0, int(self._wait_s() * 1000)))
        except (KafkaException, TypeError, ValueError, RuntimeError) as exc:
            log.info("topic ids are asked through an admin client from now on: the "
                     "native call through %s refused (%s)", self._through, exc)
            self._drop_native()
            return None
        if why is not None:  # no word on any of them: nothing is decided on it
            log.debug("topic ids of %s: %s", names, why)
        return dict(ids), why is None

    def _drop_native(self) -> None:
        through, self._through, self._idle = self._through, None, None
        if through is not None:
            try:
                through[0].close()
            except RuntimeError:  # closed already
                pass

    def close(self) -> None:
        """Close the idle consumer and drop the admin client (no more reconnecting).

        An admin client has no ``close()``: librdkafka destroys it when the last
        reference goes. Asked again after, no id is known.
        """
        self._drop_native()
        self._admin = None
        self._retry_at = float("inf")

    def _admin_(self) -> AdminClient | None:
        if self._admin is None and time.monotonic() >= self._retry_at:
            try:
                self._admin = self._make_admin()
            except Exception as exc:
                self._retry_at = time.monotonic() + ADMIN_RETRY_S
                log.info("topic ids not known (%s): a recreated topic is found by its "
                         "offsets alone", exc)
        return self._admin


def idle_consumer(kafka: KafkaClientFactory, config: Config,
                  member: str) -> Callable[[], tuple[Consumer, str]]:
    """A maker of the consumer :class:`TopicIds` asks through: nothing is ever assigned to it."""
    client_id = f"tb-ids-{member}"
    return lambda: (kafka.consumer(config.consumer(f"{config.topics.prefix}-tb-ids",
                                                   **{"client.id": client_id})), client_id)


class LogRestarts:
    """A buffer owner's side: its check, and where a partition's fold starts.

    The fold starts from a snapshot, or from the log start (one epoch up if the snapshot
    was taken on another topic). Logs the WARNING of each restart.
    """

    def __init__(self, data: Consumer, topic_ids: TopicIds, member: str,
                 timeout_s: float) -> None:
        """``data``: the owner's data consumer (its cached watermarks, and queries)."""
        self.identity = LogIdentity()
        self.topic_ids = topic_ids
        self._data = data
        self._member = member
        self._timeout_s = timeout_s
        self.restarts = 0
        """Partitions whose state restarted on a new log."""

    def start_state(self, tp: TopicPartition, snap: TransactionBufferSnapshot | None,
                    low: int, topic_id: str) -> tuple[TransactionBuffer, bool]:
        """``tp``'s state to fold on from, and whether it needs a snapshot at once.

        ``snap`` (the newest) if it lies at or above the log start ``low`` and was taken
        on this topic (``topic_id``: its id now, "" if not known); else an empty fold
        from ``low``, a log epoch above ``snap``'s if it was another topic's.
        """
        why = None
        if snap is not None:  # the topic id alone decides here: no offsets confirmed yet
            why = self.identity.check(tp, snap.position + 1, -1, snap.topic_id, topic_id)
        if snap is not None and why is None and snap.position >= low - 1:
            buf = restore(snap)
            buf.topic_id = buf.topic_id or topic_id
            return buf, False
        epoch = 0 if snap is None else snap.log_epoch + (why is not None)
        if snap is not None and why is not None:
            self.warn(tp, snap.position, snap.max_read_position, why, low, -1, epoch)
        return fresh_state(tp, low, epoch, topic_id), True

    def check(self, served: Mapping[TopicPartition, ServedPartition]
              ) -> list[tuple[TopicPartition, Restart, str]]:
        """The served partitions whose state must restart: (tp, why, its topic id now)."""
        if not served:
            return []
        ids = self.topic_ids.get(tp.topic for tp in served)
        out = []
        for tp, s in list(served.items()):
            buf = s.buf
            ktp = KafkaTP(tp.topic, tp.partition)
            try:  # a partition its topic no longer has (created again with fewer) raises
                high = self._data.get_watermark_offsets(ktp, cached=True)[1]
                if 0 <= high <= buf.last_offset:  # below the fold, as last fetched: ask
                    high = self._data.get_watermark_offsets(ktp, timeout=self._timeout_s)[1]
            except KafkaException as exc:  # deleted again, leader moving, gone: no word
                log.debug("%s: log end unknown: %s", tp, exc)
                high = -1
            topic_id = ids.get(tp.topic, "")
            why = self.identity.check(tp, buf.last_offset + 1, high, buf.topic_id, topic_id)
            if why is not None:
                out.append((tp, why, topic_id))
            elif not buf.topic_id and topic_id and high > buf.last_offset:
                buf.topic_id = topic_id  # first known (a snapshot of an earlier version)
        return out

    def warn(self, tp: TopicPartition, folded: int, max_read: int, why: Restart, low: int,
             high: int, epoch: int) -> None:
        """The WARNING of a restart, naming both logs' offsets."""
        self.restarts += 1
        end = high if high >= 0 else why.high
        log.warning("buffer worker %s: %s was recreated or truncated (%s): the old log was "
                    "folded to offset %d (max read position %d); the new log starts at %d "
                    "and ends at %s: serving it from %d as log epoch %d (readers reload "
                    "from its snapshot)", self._member, tp, why.reason, folded, max_read, low,
                    end if end >= 0 else "?", low, epoch)


def fresh_state(tp: TopicPartition, low: int, log_epoch: int,
                topic_id: str) -> TransactionBuffer:
    """An empty fold of ``tp``'s log from its start ``low`` on."""
    buf = TransactionBuffer(tp, log_epoch=log_epoch, topic_id=topic_id)
    buf.last_offset = low - 1
    buf.max_read_position = low - 1
    return buf
