"""Say where a process stood still: every thread's stack when none ran for a while.

A worker whose Python threads all stop (one C call holding the interpreter lock while it
waits on the network, say) answers nobody, and its own log cannot say why: no thread can
write. :class:`StallWatch` keeps :func:`faulthandler.dump_traceback_later` re-armed from
a Python thread every :data:`REARM_S`; its timer runs in a C thread that needs no
interpreter lock, so if the re-arming thread has not run for ``stall_s`` it writes every
thread's Python stack to the log stream (``Timeout (0:00:05)!``, then one ``Thread 0x..``
block per thread, current one first).

A process stopped by SIGSTOP is stopped whole, the C thread included; when it is
continued the timer may already have expired and write one dump. The dump costs the
time to format the stacks and changes nothing else.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from typing import TextIO

__all__ = ["REARM_S", "DEFAULT_STALL_S", "StallWatch"]

REARM_S = 1.0
"""How often the watch re-arms the timer: far below any stall worth a dump."""
DEFAULT_STALL_S = 5.0
"""No Python thread running for this long is a stall: the interpreter hands its lock on
every 5 ms, and a loaded 2-core machine delays a runnable thread by milliseconds."""


class StallWatch:
    """Dumps every thread's stack when the process's Python threads stall ``stall_s``."""

    def __init__(self, stall_s: float = DEFAULT_STALL_S, stream: TextIO | None = None,
                 rearm_s: float = REARM_S) -> None:
        if not 0 < rearm_s < stall_s:
            raise ValueError(f"stall_s must exceed rearm_s ({rearm_s} s), got {stall_s}")
        self.stall_s = stall_s
        self.rearm_s = rearm_s
        self._stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> StallWatch:
        """Arm the timer and start re-arming it; returns the watch."""
        self._arm()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop re-arming and cancel the timer."""
        self._stop.set()
        self._thread.join(self.rearm_s * 2 + 1)
        faulthandler.cancel_dump_traceback_later()

    def _arm(self) -> None:
        faulthandler.dump_traceback_later(self.stall_s, repeat=False, file=self._stream)

    def _run(self) -> None:
        while not self._stop.wait(self.rearm_s):
            self._arm()
