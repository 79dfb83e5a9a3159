"""One wait over several consumers: wake when any of them has something to read.

A committed-only consumer reads two confluent-kafka consumers: its data partitions, and
its follower's buffer-state partitions, where a commit shows up as a delta. confluent-kafka
waits on one handle at a time, so a reader that waits on its data consumer leaves a
delta that arrives meanwhile unread until that wait ends (a whole poll slice: 51 ms of
produce-to-delivery p50 at 4 partitions in ``bench.scale``, issue 37), and the reverse.

:class:`Wakeup` asks librdkafka to write a byte to one pipe whenever an op (fetched
records, an error, a rebalance) is enqueued on a watched consumer's queue and that queue
was read since its last byte (``rd_kafka_queue_io_event_enable``, through
``txnstream._native.Wake``), and waits on that pipe. The protocol of a wait: :meth:`clear`
the pipe, poll every consumer without waiting, and only if none had anything
:meth:`wait`: an op enqueued after a consumer's poll writes a byte (that poll marked its
queue read), one enqueued before it was taken by it.

Without the native module (not built, ``TXNSTREAM_NATIVE=0``, a confluent-kafka whose
handle it does not recognise) :meth:`watch` returns False and the caller waits on one
consumer at a time, as before. The queue references are released by :meth:`close`, which
must run before the consumers' own ``close()`` (librdkafka's rule).
"""

from __future__ import annotations

import logging
import os
import select
import weakref

from confluent_kafka import Consumer

from txnstream.kafka.librdkafka import native_allowed, native_librdkafka

__all__ = ["Wakeup"]

log = logging.getLogger(__name__)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Wakeup:
    """A pipe that librdkafka writes to when a watched consumer's queue gets an op."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._watches: list[object] = []
        # The fds outlive close(): a thread inside wait() must never select a closed fd
        # (or one the process has opened again under the same number)
        weakref.finalize(self, _close_fds, self._r, self._w)

    @property
    def active(self) -> bool:
        """Whether every consumer asked was watched (else wait one at a time)."""
        return bool(self._watches)

    def watch(self, *consumers: tuple[Consumer, str]) -> bool:
        """Watch every ``(consumer, client_id_prefix)``, all or none; whether watched.

        The prefix is checked against librdkafka's name of the handle (its ``client.id``
        first), a guard that the handle's layout is the one the native module knows.
        """
        mod = native_librdkafka() if native_allowed() else None
        if mod is None:
            return False
        made = []
        try:
            for consumer, prefix in consumers:
                made.append(mod.Wake(consumer, prefix, self._w))
        except (TypeError, ValueError, RuntimeError) as exc:
            log.warning("cannot watch the consumers' queues (%s): waiting on one at a time",
                        exc)
            for w in made:
                w.close()
            return False
        self._watches += made
        return True

    def clear(self) -> None:
        """Take every byte written so far (before polling the consumers)."""
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a byte; whether one came (False once closed)."""
        if not self._watches:
            return False
        try:
            ready, _, _ = select.select([self._r], [], [], max(0.0, timeout_s))
        except (OSError, ValueError):
            return False
        return bool(ready)

    def close(self) -> None:
        """Stop watching and release the queues (before the consumers close); idempotent.

        A thread inside :meth:`wait` returns at its timeout.
        """
        watches, self._watches = self._watches, []
        for w in watches:
            w.close()  # type: ignore[attr-defined]
