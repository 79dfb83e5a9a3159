"""Log lines a peer or a loop can repeat without bound, at most once per interval per kind.

A hostile client can make a worker refuse a connection a thousand times a second, and a
retry loop against a partition that cannot be written fails as often as it retries.
Each such line goes through a :class:`RateLimitedLog`: the first of a kind is logged at
once, later ones of that kind within ``interval_s`` are counted, and the next line of
the kind says how many were held back. The number of kinds kept is bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["RateLimitedLog"]

MAX_KINDS = 1024
"""Kinds remembered; the oldest is forgotten past this (a peer address per kind stays
bounded when addresses change)."""


class RateLimitedLog:
    """``log(level, kind, msg, *args)``: at most one line per ``kind`` per ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._kinds: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """kind -> (when its last line was logged, lines held back since)."""
        self._lock = threading.Lock()

    def log(self, level: int, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``kind`` was logged within the interval; whether it was."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self._clock()
        with self._lock:
            last, held = self._kinds.get(kind, (-self.interval_s, 0))
            if now - last < self.interval_s:
                self._kinds[kind] = (last, held + 1)
                return False
            self._kinds[kind] = (now, 0)
            self._kinds.move_to_end(kind)
            while len(self._kinds) > MAX_KINDS:
                self._kinds.popitem(last=False)
        if held:
            msg += f" ({held} more like it in the last %.0f s not logged)"
            args = (*args, now - last)
        self.logger.log(level, msg, *args)
        return True

    def warning(self, kind: str, msg: str, *args: object) -> bool:
        """``log(logging.WARNING, ...)``."""
        return self.log(logging.WARNING, kind, msg, *args)

    def error(self, kind: str, msg: str, *args: object) -> bool:
        """``log(logging.ERROR, ...)``."""
        return self.log(logging.ERROR, kind, msg, *args)
