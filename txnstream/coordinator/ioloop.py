"""``IoLoop``: an asyncio loop in a daemon thread, and the calls other threads hand it.

Both ends of the direct line (:mod:`txnstream.coordinator.transport`) run their sockets
on one, so TLS reads and writes never race on one SSL object and no caller blocks on a
slow peer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["IoLoop"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class IoLoop:
    """An asyncio loop in a daemon thread; other threads hand it work."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._calls_lock = threading.Lock()
        self._woken = False
        """A run of :attr:`_calls` is scheduled on the loop and has not emptied it yet."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread).

        ``ConnectionError`` if the loop is closed (``coro`` is closed, never run).
        """
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError as exc:  # closed: no connection is made or used any more
            coro.close()
            raise ConnectionError("the connection loop is closed") from exc
        return future.result(timeout)

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop soon, after the calls made before; returns at once.

        Calls made while a run of them is scheduled join it: the loop is woken (a
        ``call_soon_threadsafe``, a write to its self-pipe) once per run, not once per
        call. A worker takes a request and sends its reply by calls, so under load this
        was two system calls and two wake-ups of the listener's thread per request.
        """
        with self._calls_lock:
            self._calls.append((fn, args))
            if self._woken:
                return
            self._woken = True
        try:
            self.loop.call_soon_threadsafe(self._run_calls)
        except RuntimeError:  # the loop is closed: nothing is sent any more
            pass

    def _run_calls(self) -> None:
        """The calls made so far, in order (on the loop).

        Calls made meanwhile run in the loop's next iteration, after its socket events:
        callers that never pause cannot keep the loop from reading.
        """
        with self._calls_lock:
            calls, self._calls = self._calls, deque()
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as exc:  # as the loop reports a callback's error
                self.loop.call_exception_handler({
                    "message": f"exception in {getattr(fn, '__qualname__', fn)!s}",
                    "exception": exc})
        with self._calls_lock:
            if not self._calls:
                self._woken = False
                return
        self.loop.call_soon(self._run_calls)  # on the loop's thread: no wake-up needed

    def close(self) -> None:
        """Cancel what runs on the loop, stop it and its thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.run(cancel_all(), timeout=5)
        except Exception as exc:  # stopping anyway
            log.debug("io loop close: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()
