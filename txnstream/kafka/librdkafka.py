"""The librdkafka confluent-kafka loaded, for txnstream's C extensions, and the switch.

Both extensions (``txnstream._native``: the buffer owner's scan; ``txnstream._native_send``:
``Producer.send_batch``'s sends) declare the part of librdkafka's public ABI they use and
resolve it with ``dlopen`` of the very library confluent-kafka mapped into this process:
no librdkafka headers or library at build time, and one librdkafka per process.
"""

from __future__ import annotations

from pathlib import Path

from txnstream.native import NATIVE_ENV, native_allowed

__all__ = ["NATIVE_ENV", "librdkafka_path", "native_allowed"]


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
