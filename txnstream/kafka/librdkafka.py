"""The librdkafka confluent-kafka loaded, for txnstream's C extensions, and the switch.

Both extensions (``txnstream._native``: the buffer owner's scan; ``txnstream._native_send``:
``Producer.send_batch``'s sends) declare the part of librdkafka's public ABI they use and
resolve it with ``dlopen`` of the very library confluent-kafka mapped into this process:
no librdkafka headers or library at build time, and one librdkafka per process.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

from txnstream.native import NATIVE_ENV, native_allowed

__all__ = ["NATIVE_ENV", "librdkafka_path", "native_allowed", "native_librdkafka"]

log = logging.getLogger(__name__)


def librdkafka_path() -> str | None:
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


def load_over_librdkafka(module: ModuleType, fallback: str, *args: object
                         ) -> ModuleType | None:
    """``module.load(path, *args)`` over the librdkafka confluent-kafka mapped, checked.

    Returns ``module``, or None with why logged (``fallback``: what runs instead); its
    librdkafka's version must be confluent-kafka's.
    """
    import confluent_kafka

    path = librdkafka_path()
    if path is None:
        log.info("no librdkafka found mapped: %s", fallback)
        return None
    try:
        version = module.load(path, *args)
    except (ImportError, RuntimeError) as exc:
        log.warning("%s cannot load %s (%s): %s", module.__name__, path, exc, fallback)
        return None
    if version != confluent_kafka.libversion()[1]:
        log.warning("librdkafka at %s is 0x%x, confluent-kafka's 0x%x: %s", path, version,
                    confluent_kafka.libversion()[1], fallback)
        return None
    return module


@functools.cache
def native_librdkafka() -> ModuleType | None:
    """``txnstream._native`` loaded over confluent-kafka's librdkafka, or None (why: logged).

    Its consumer parts (the buffer owner's scan, a reader's wake-up) read confluent-kafka's
    consumer handles; without it their Python twins run.
    """
    if not native_allowed():
        return None
    try:
        from txnstream import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        log.info("txnstream._native is not built (%s): consumers run through Python", exc)
        return None
    import confluent_kafka

    return load_over_librdkafka(_native, "consumers run through Python",
                                confluent_kafka.Consumer)
