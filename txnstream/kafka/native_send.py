"""A librdkafka producer of txnstream's own, driven from C, for ``Producer.send_batch``.

``txnstream._native_send`` (``txnstream/_native_send.c``, built when the package installs)
hands a batch of records to librdkafka in one call, without a Python object per record
or per delivery report: each transaction's records are counted on a :class:`Tally`
whose delivery reports (acknowledgements, offsets per partition, the first error) are
gathered in C, by the handle's own poll thread, and taken by Python in one call.

It is a handle of its own (``rd_kafka_new`` of the same librdkafka, from the settings
the Producer's confluent-kafka handle got), not confluent-kafka's: that handle's
delivery-report callback takes every message's opaque for its own state, so a record
produced on it from C either has no report (a NULL opaque) or crashes it. What that costs
(a second set of broker connections and producer id per Producer that sends batches, and
an order to keep between two handles) is said where it is paid:
:class:`txnstream.producer.Producer`.

:meth:`NativeSender.for_producer` gives None, logging why once, where the native path
cannot be taken: ``TXNSTREAM_NATIVE=0``, the extension not built or its librdkafka not
confluent-kafka's, a producer that is not a ``confluent_kafka.Producer`` (a test's fake),
or a setting that is a Python object (a callback) the native handle could not honour.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, cast

import confluent_kafka

from txnstream.kafka.librdkafka import load_over_librdkafka, native_allowed

__all__ = ["MAX_SPARE_KINDS", "NativeSender", "NativeSpares", "Tally", "native_send"]

log = logging.getLogger(__name__)

WAIT_MS = 50
"""How long one ``produce`` call waits while librdkafka's queue is full before it returns
to Python (which calls again): so a signal (Ctrl-C) is seen while a batch waits."""

PYTHON_SIDE = frozenset({"logger"})
"""Settings confluent-kafka itself takes, not librdkafka; the native handle's log lines go
to the same logger."""

_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR,
           4: logging.WARNING, 5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}
"""librdkafka's syslog levels as logging's, as confluent-kafka maps them."""


class Tally(Protocol):
    """One transaction's records through a :class:`NativeSender` (C: ``Tally``)."""

    @property
    def outstanding(self) -> int:
        """Records handed to librdkafka and not reported yet."""

    def take(self) -> tuple[int, dict[int, bytes] | None, dict[int, int] | None,
                            tuple[int, int] | None]:
        """The reports since the last take.

        How many; each partition's offsets (int64s, native order); each partition's count
        of records acknowledged without an offset; the first failed record's (error code,
        partition), once.
        """


@functools.cache
def native_send() -> ModuleType | None:
    """``txnstream._native_send`` over confluent-kafka's librdkafka, or None (why: logged)."""
    if not native_allowed():
        return None
    try:
        from txnstream import _native_send  # type: ignore[attr-defined]
    except ImportError as exc:
        log.info("the native send is not built (%s): send_batch goes through "
                 "confluent-kafka", exc)
        return None
    return load_over_librdkafka(_native_send, "send_batch goes through confluent-kafka")


def librdkafka_settings(settings: Mapping[str, Any]) -> list[tuple[str, str]] | str:
    """``settings`` as librdkafka's strings (as confluent-kafka renders them).

    Or the name of one that is a Python object (a callback: only confluent-kafka's handle
    can have it).
    """
    out = []
    for name, value in settings.items():
        if name in PYTHON_SIDE:
            continue
        if isinstance(value, bool):
            out.append((name, "true" if value else "false"))
        elif isinstance(value, (str, int, float)):
            out.append((name, str(value)))
        else:
            return name
    return out


_refused: set[str] = set()
"""Why the native path was not taken, each logged once per process."""


def _once(why: str) -> None:
    if why not in _refused:
        _refused.add(why)
        log.info("send_batch goes through confluent-kafka: %s", why)


class NativeSender:
    """A librdkafka producer handle of txnstream's own, for one topic (C: ``Sender``).

    Thread-safe, as librdkafka's handle is. Its records are counted per transaction on
    :meth:`tally`; its poll thread serves the delivery reports in C.
    """

    def __init__(self, mod: ModuleType, settings: list[tuple[str, str]], topic: str | None,
                 logger: logging.Logger) -> None:
        self._sender = mod.Sender(settings, topic)
        self._log = logger

    @classmethod
    def for_producer(cls, kafka: object, settings: Mapping[str, Any], topic: str,
                     spares: NativeSpares | None = None) -> NativeSender | None:
        """One beside ``kafka``, made from ``settings``: ``spares``' if it holds one.

        None where the native path cannot be taken (why: logged once). With ``spares``,
        one more is made there for the next producer of the same settings.
        """
        if type(kafka) is not confluent_kafka.Producer:
            return None  # a test's fake librdkafka: it must see every record
        mod = native_send()
        if mod is None:
            return None
        rendered = librdkafka_settings(settings)
        if isinstance(rendered, str):
            _once(f"setting {rendered!r} is a Python object")
            return None
        logger = settings.get("logger")
        if not isinstance(logger, logging.Logger):
            logger = logging.getLogger("txnstream.librdkafka")
        key = tuple(rendered)
        made = spares.take(key, topic) if spares is not None else None
        try:
            made = made or cls(mod, rendered, topic, logger)
        except (ValueError, RuntimeError) as exc:
            _once(f"no native producer: {exc}")
            return None
        if spares is not None:
            spares.refill(key, lambda: cls(mod, rendered, None, logger))
        return made

    def bind(self, topic: str) -> None:
        """The topic of one made without (a spare); ``RuntimeError`` if it has one."""
        self._sender.bind(topic)

    def tally(self) -> Tally:
        """Counts for one transaction's records."""
        return cast(Tally, self._sender.tally())

    def produce(self, tally: Tally, values: Sequence[bytes | None],
                keys: Sequence[bytes | None] | None, partitions: Sequence[int],
                headers: Mapping[int, Sequence[tuple[str, str | bytes | None]]],
                start: int) -> tuple[int, int]:
        """Hand records ``start``.. to librdkafka, in order, counted on ``tally``.

        Returns ``(next, err)``: all handed (``next == len(values)``); record ``next``
        refused with librdkafka's error ``err``; or (``err`` 0) the queue stayed full for
        :data:`WAIT_MS`: call again from ``next``. ``headers``: each partition's.
        ``TypeError`` (nothing handed) for a value or key that is not bytes or None.
        """
        try:
            return cast(tuple[int, int], self._sender.produce(
                tally, values, keys, partitions, headers, start, WAIT_MS))
        finally:
            self._forward_logs()

    def partitions(self, timeout_s: float) -> int:
        """The topic's partition count as the cluster says now (-1: unknown).

        Refreshes the handle's metadata, so partitions added since are produced to.
        ``RuntimeError`` if the cluster did not answer within ``timeout_s``.
        """
        return cast(int, self._sender.partitions(max(0, int(timeout_s * 1000))))

    def pending(self) -> int:
        """Records handed and not reported yet (librdkafka's ``outq_len``)."""
        return cast(int, self._sender.pending())

    def flush(self, timeout_s: float) -> int:
        """Send what waits for ``linger.ms`` now; wait up to ``timeout_s`` for the reports.

        Returns how many are still not reported.
        """
        try:
            return cast(int, self._sender.flush(max(0, int(timeout_s * 1000))))
        finally:
            self._forward_logs()

    def close(self, timeout_s: float) -> int:
        """Flush, then destroy the handle; returns how many records were never reported.

        Their transactions cannot commit: their flush says so.
        """
        try:
            return cast(int, self._sender.close(max(0, int(timeout_s * 1000))))
        finally:
            self._forward_logs()

    def _forward_logs(self) -> None:
        """Librdkafka's log lines and errors of this handle, to the producer's logger."""
        for level, fac, text in self._sender.logs():
            self._log.log(_LEVELS.get(level, logging.INFO), "%s [native send] %s", fac, text)


MAX_SPARE_KINDS = 4
"""Settings :class:`NativeSpares` keeps a spare for at once (a client's producers share
theirs unless given settings of their own); the oldest spare goes first."""


class NativeSpares:
    """Native handles made ahead, not bound to a topic yet: one per settings.

    A fresh idempotent librdkafka handle delivers nothing before it has its producer id,
    which librdkafka asks for about half a second after the handle is made (its timer
    while no broker connection is up yet). A new Producer's first ``send_batch`` took
    that much longer than the next ones: the Spark sink writing to a topic new to a
    worker, a client making producers on the way. So once a client has made one native
    handle it keeps one more made, its connections and producer id ready: the next
    producer's first batch binds it to its topic, and another is made. Bounded: one per
    settings, :data:`MAX_SPARE_KINDS` settings; closed with the client.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spares: dict[tuple[tuple[str, str], ...], NativeSender] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._spares)

    def take(self, key: tuple[tuple[str, str], ...], topic: str) -> NativeSender | None:
        """The spare of ``key`` bound to ``topic``, or None (none, or it would not bind)."""
        with self._lock:
            spare = self._spares.pop(key, None)
        if spare is None:
            return None
        try:
            spare.bind(topic)
        except RuntimeError as exc:
            log.info("a spare native producer did not take topic %s (%s): making one", topic,
                     exc)
            spare.close(0)
            return None
        return spare

    def refill(self, key: tuple[tuple[str, str], ...],
               make: Callable[[], NativeSender]) -> None:
        """Make a spare of ``key`` unless one is there (or these spares are closed)."""
        with self._lock:
            if self._closed or key in self._spares:
                return
        try:
            spare = make()
        except (ValueError, RuntimeError) as exc:
            log.info("no spare native producer: %s", exc)
            return
        extra: list[NativeSender] = []
        with self._lock:
            if self._closed or key in self._spares:
                extra.append(spare)
            else:
                self._spares[key] = spare
                while len(self._spares) > MAX_SPARE_KINDS:
                    extra.append(self._spares.pop(next(iter(self._spares))))
        for s in extra:
            s.close(0)

    def close(self) -> None:
        """Close every spare; none is made after."""
        with self._lock:
            self._closed = True
            spares, self._spares = list(self._spares.values()), {}
        for s in spares:
            s.close(0)
