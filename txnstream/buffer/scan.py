"""The buffer owner's read of its data partitions, as runs (:mod:`txnstream.buffer.runs`).

:class:`DataScan` reads the owner's data consumer. With the native scan
(``txnstream._native``, built from ``txnstream/_native.c`` when the package installs) the
records of attached partitions never become Python objects one by one: librdkafka's
messages are cut into runs in C. Without it (no C compiler at install, another
platform, a confluent-kafka whose librdkafka or handle it does not recognise, or
``TXNSTREAM_NATIVE=0``) the same runs are built from confluent-kafka's messages in
Python. Both give the same entries; ``tests/unit/buffer/test_native_scan.py`` checks it.

The native scan reads a queue of its own, to which :meth:`DataScan.attach` forwards a
partition's fetch queue before the partition is assigned. Anything that still reaches the
consumer's own queue (records fetched before the forward, after librdkafka made the
partition anew) is read there first, every turn, and cut into runs in Python; that poll
also serves the consumer's logs and errors.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from confluent_kafka import Consumer

from txnstream.buffer.runs import Entry, runs_of
from txnstream.errors import message_error
from txnstream.kafka.fetch import KafkaRecord, drain
from txnstream.types import TopicPartition

__all__ = ["DataScan", "native_scan"]

log = logging.getLogger(__name__)

NATIVE_ENV = "TXNSTREAM_NATIVE"
"""Set to ``0`` to read through confluent-kafka's messages (the pure-Python path)."""


def _librdkafka_path() -> str | None:
    """The file of the librdkafka this process loaded for confluent-kafka (Linux)."""
    import confluent_kafka.cimpl  # noqa: F401  # maps its librdkafka

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith("librdkafka"):
            return path
    return None


@functools.cache
def native_scan() -> ModuleType | None:
    """``txnstream._native`` loaded over confluent-kafka's librdkafka, or None (why: logged)."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return None
    try:
        from txnstream import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        log.info("the buffer's native scan is not built (%s): folding through Python", exc)
        return None
    import confluent_kafka

    path = _librdkafka_path()
    if path is None:
        log.info("no librdkafka found mapped: the buffer folds through Python")
        return None
    try:
        version = _native.load(path, confluent_kafka.Consumer)
    except (ImportError, RuntimeError) as exc:
        log.warning("the buffer's native scan cannot load %s (%s): folding through Python",
                    path, exc)
        return None
    if version != confluent_kafka.libversion()[1]:
        log.warning("librdkafka at %s is 0x%x, confluent-kafka's 0x%x: folding through "
                    "Python", path, version, confluent_kafka.libversion()[1])
        return None
    return cast(ModuleType, _native)


class DataScan:
    """Runs of records of the partitions a consumer reads, natively where it can."""

    def __init__(self, consumer: Consumer, client_id: str, native: bool = True) -> None:
        self._consumer = consumer
        self._native: Any = None
        mod = native_scan() if native else None
        if mod is not None:
            try:
                self._native = mod.Scan(consumer, client_id)
            except (TypeError, ValueError, RuntimeError) as exc:
                log.warning("the buffer's native scan refuses consumer %s (%s): folding "
                            "through Python", client_id, exc)

    @property
    def native(self) -> bool:
        """Whether records of attached partitions are cut into runs in C."""
        return self._native is not None

    def attach(self, tp: TopicPartition) -> None:
        """Read ``tp`` natively: call before the consumer is assigned it."""
        if self._native is not None:
            self._native.attach(tp.topic, tp.partition)

    def read(self, max_records: int, timeout_s: float) -> list[Entry]:
        """Up to about ``max_records`` records as entries; waits up to ``timeout_s``."""
        plain = drain(self._consumer, max_records, 0.0 if self._native else timeout_s)
        entries = _runs(plain, "buffer worker")
        if self._native is not None:
            got, errors = self._native.scan(max_records, 0 if plain else
                                            max(0, int(timeout_s * 1000)))
            for topic, partition, code, why in errors:
                log.warning("buffer worker: Kafka error on %s-%s (%d): %s", topic, partition,
                            code, why)
            entries.extend(got)
        return entries

    def close(self) -> None:
        """Stop reading natively: before the consumer's ``close()``."""
        if self._native is not None:
            self._native.close()
            self._native = None


def _runs(msgs: list[KafkaRecord], where: str) -> list[Entry]:
    """The runs of confluent-kafka messages, partition by partition."""
    by_tp: dict[tuple[str, int], list[KafkaRecord]] = defaultdict(list)
    for m in msgs:
        if not message_error(m, where, log):
            by_tp[(m.topic(), m.partition())].append(m)
    return [e for (topic, part), got in by_tp.items() for e in runs_of(got, topic, part)]
