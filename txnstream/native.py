"""The optional C module ``txnstream._native``, where this process may use it.

It is built from ``txnstream/_native.c`` when the package installs with a C compiler.
Each of its parts has a pure-Python twin that gives the same answers (a test checks each
pair), so ``TXNSTREAM_NATIVE=0``, or an install without a compiler, changes the speed,
never the behaviour. The buffer owner's scan also needs confluent-kafka's librdkafka
(:func:`txnstream.buffer.scan.native_scan`); the per-record helpers here do not.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

__all__ = ["NATIVE_ENV", "native", "native_allowed"]

NATIVE_ENV = "TXNSTREAM_NATIVE"
"""``0``: no native code is used (the buffer owner folds through Python, ``send_batch``
sends through confluent-kafka, readers split headers and make messages in Python);
anything else (or unset): whatever is built and loads is used."""


def native_allowed() -> bool:
    """False if ``TXNSTREAM_NATIVE=0`` turns the native paths off (read at each call)."""
    return os.environ.get(NATIVE_ENV, "1") != "0"


@functools.cache
def native() -> ModuleType | None:
    """``txnstream._native``, or None (not built, or ``TXNSTREAM_NATIVE=0``)."""
    if not native_allowed():  # read at first use
        return None
    try:
        from txnstream import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native  # type: ignore[no-any-return]
