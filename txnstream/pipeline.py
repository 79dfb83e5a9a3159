"""A client's requests in the background (:class:`RequestPipeline`, one per ``Client``).

Activations of reserved TxnIDs, partition registrations, and commits asked for with
``commit_async`` go out on its threads; :class:`BackgroundRequests` is one txn's share
of them, which its commit waits for.

A new partition's ``ADD_PARTITIONS`` goes out on a background thread after
:data:`LINGER_S` (a commit that starts first carries it in its END instead) and the
write proceeds at once, except the first registration of a topic by this client, which
the writer waits for: the coordinator writes the topic's buffer registration (every
partition of it) before it confirms that first request, and readers rely on a
registration preceding every txn record of a partition.

A pipelined registration that fails (the txn timed out, or an admin aborted it) leaves
records in a partition the coordinator does not know; its ABORT markers miss it, and
the buffer's owner, which asks the coordinator about every txn that stays ongoing on a
partition, writes the ABORT there itself (docs/buffer.md, "Unblocking"): nothing of it
is ever delivered. Subscriptions are always registered before the ack: the pending-ack
log has no such check, so an ack whose txn ended without a mark for its subscription
would stay pending on every replay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from txnstream.errors import TxnStreamError
from txnstream.types import TxnID

__all__ = ["BackgroundRequests", "RequestPipeline", "end_in_background"]

LINGER_S = 0.005
"""How long a txn's pipelined activation and registrations wait before they are sent:
partitions met meanwhile go in one request, and a commit that starts first carries them
in its END (one coordinator turn, not two). As long as the records' own ``linger.ms``
(5 ms), so nothing waits for it that would not wait for them."""
END_THREADS = 64
"""Threads for commits in the background (:meth:`Transaction.commit_async`), made on
demand. A commit holds its thread for its coordinator round trip while it only waits,
and the coordinator ends in one turn (one log flush, one marker flush) as many as are
in flight: 2,000 commits asked at once took 4.8 s through 16 threads, 2.9 s through 64
(worker CPU a commit 1.26 -> 0.68 ms; both cores busy either way), 2.4 s through 128
(``bench.open_txns``'s commit phase, one broker, 2 cores). Pipelining every commit
without a thread each would need an END that does not wait on its thread."""
REGISTRATION_THREADS = 64
"""Threads (made on demand) sending a client's pipelined requests: activations and
registrations. Each holds its thread for one coordinator round trip while it only
waits, so they must not queue behind each other: with 4, sixteen concurrent txns (two
background requests each) waited through eight round trips in a row at every commit
(py-spy: half the client's thread time in commit's wait). Waiting threads cost no CPU."""


class RequestPipeline:
    """A client's background requests: registrations, activations, commits.

    It also knows the topics whose registrations may be pipelined: a topic becomes
    pipelinable once this client saw a registration of one of its partitions succeed
    (:meth:`confirm`): the coordinator registered the whole topic for the buffer
    before confirming it. Threads start on first use.
    """

    def __init__(self, threads: int = REGISTRATION_THREADS) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._ends: ThreadPoolExecutor | None = None
        """Commits in the background (``commit_async``): their own threads, since a
        commit waits for registrations sent on the other pool."""
        self._topics: set[str] = set()
        self._closed = False

    def knows(self, topic: str) -> bool:
        """Whether a registration of ``topic`` succeeded through this client."""
        return topic in self._topics

    def confirm(self, topics: Iterable[str]) -> None:
        """Registrations of ``topics`` succeeded: later ones may be pipelined."""
        with self._lock:
            self._topics.update(topics)

    def submit(self, fn: Callable[[], None]) -> Future[None] | None:
        """Run ``fn`` on a pipeline thread; None once closed (the caller runs it)."""
        with self._lock:
            if self._closed:
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads,
                                                    thread_name_prefix="txnstream-register")
            return self._executor.submit(fn)

    def submit_end(self, fn: Callable[[], None]) -> Future[None] | None:
        """Run an end (a commit) on its own thread; None once closed."""
        with self._lock:
            if self._closed:
                return None
            if self._ends is None:
                self._ends = ThreadPoolExecutor(END_THREADS,
                                                thread_name_prefix="txnstream-commit")
            return self._ends.submit(fn)

    def close(self, wait: bool = False) -> None:
        """Stop.

        Background commits already asked for finish first; registrations not sent yet
        are cancelled (their transactions become abort-only).
        """
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            ends, self._ends = self._ends, None
        if ends is not None:
            ends.shutdown(wait=True)
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=True)


def end_in_background(pipeline: RequestPipeline | None, fn: Callable[[], None]) -> Future[None]:
    """``fn`` (an end) on ``pipeline``'s end threads; run here if there is none (or closed)."""
    future = pipeline.submit_end(fn) if pipeline is not None else None
    if future is None:
        future = Future()
        try:
            fn()
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
    return future


class BackgroundRequests:
    """One txn's coordinator requests sent on the pipeline (activation, registrations).

    The txn's commit and flush :meth:`wait` for them. The first failure is kept
    (:attr:`error`: the coordinator's verdict a commit raises) and handed to
    ``on_failure``, which makes the txn abort-only.
    """

    def __init__(self, txn_id: TxnID, pipeline: RequestPipeline | None,
                 on_failure: Callable[[BaseException], None]) -> None:
        self._txn_id = txn_id
        self._pipeline = pipeline
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []
        self._ahead: set[Any] = set()
        """Registered in requests sent ahead of their use (:meth:`send_ahead`)."""
        self._unconfirmed: set[Any] = set()
        """Partitions to register, lingering or sent, not confirmed yet (:meth:`carried`)."""
        self._lingering: set[Any] = set()
        """Partitions waiting out the linger, not sent yet."""
        self._activation: tuple[int, int] | None = None
        """(open time, timeout) ms of an activation not confirmed yet."""
        self._activate: Callable[[], object] | None = None
        """The ACTIVATE still lingering (None once sent or carried)."""
        self._register: Callable[[tuple[Any, ...]], object] | None = None
        self._lingers = False
        """A pipeline thread waits out the linger (it sends what lingers then)."""
        self._hurry = threading.Event()
        """Set: the lingering thread sends at once (a wait) or finds nothing (carried)."""
        self.error: BaseException | None = None

    def send(self, request: Callable[[], object]) -> bool:
        """Run ``request`` on the pipeline; False if there is none (the caller runs it)."""
        if self._pipeline is None:
            return False

        def run() -> None:
            try:
                request()
            except BaseException as exc:
                self.failed(exc)
                raise

        future = self._pipeline.submit(run)
        if future is None:
            return False
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
        return True

    def send_registration(self, parts: tuple[Any, ...],
                          register: Callable[[tuple[Any, ...]], object]) -> bool:
        """Register ``parts`` on the pipeline, after :data:`LINGER_S` (False: none).

        Partitions met within the linger go in one request; a commit that starts first
        carries them in its END instead (:meth:`carried`), and :meth:`wait` sends them
        at once. Until confirmed, :meth:`carried` has them.
        """
        with self._lock:
            self._unconfirmed.update(parts)
            self._lingering.update(parts)
            self._register = register
        return self._linger()

    def send_activation(self, open_time_ms: int, timeout_ms: int,
                        activate: Callable[[], object]) -> bool:
        """Send an ACTIVATE as :meth:`send_registration` sends a registration."""
        with self._lock:
            self._activation = (open_time_ms, timeout_ms)
            self._activate = activate
        return self._linger()

    def _linger(self) -> bool:
        with self._lock:
            if self._lingers:
                return True  # the one waiting takes these too
            self._lingers = True
            self._hurry.clear()
        if self.send(self._send_lingering):
            return True
        with self._lock:  # no pipeline (closed): the caller sends what lingers
            self._lingers = False
            self._unconfirmed.difference_update(self._lingering)
            self._lingering.clear()
            if self._activate is not None:
                self._activation = self._activate = None
        return False

    def _send_lingering(self) -> None:
        """After the linger (or a hurry), send what is still lingering, in order."""
        self._hurry.wait(LINGER_S)
        with self._lock:
            self._lingers = False
            parts, self._lingering = tuple(sorted(self._lingering)), set()
            activate, self._activate = self._activate, None
            register = self._register
        if activate is not None:
            activate()
            with self._lock:
                self._activation = None
        if parts and register is not None:
            register(parts)
            with self._lock:
                self._unconfirmed.difference_update(parts)

    def carried(self, max_partitions: int) -> tuple[tuple[Any, ...], tuple[int, int] | None]:
        """What a commit's END carries: the partitions and activation not confirmed yet.

        Those still lingering are never sent on their own; those sent are applied again
        as their own requests would (nothing new), so the commit waits for no reply.
        More than ``max_partitions``: it waits for them (:meth:`wait`), carrying none.
        """
        with self._lock:
            if len(self._unconfirmed) <= max_partitions:
                self._lingering.clear()
                self._activate = None
                self._hurry.set()
                return tuple(sorted(self._unconfirmed)), self._activation
        self.wait()
        return (), None

    def send_ahead(self, keys: set[Any], request: Callable[[tuple[Any, ...]], object]) -> None:
        """Send ``request(those keys not sent ahead yet)``, ahead of the keys' use."""
        with self._lock:
            fresh = tuple(sorted(keys - self._ahead))
        if fresh and self.send(lambda: request(fresh)):
            with self._lock:
                self._ahead.update(fresh)

    def wait_ahead(self, keys: set[Any]) -> bool:
        """Whether every one of ``keys`` was sent ahead; if so, after waiting for them.

        Raises the first failure of this txn's requests: a use must not go on without
        its registration.
        """
        with self._lock:
            if not keys <= self._ahead:
                return False
        self.wait()
        if self.error is not None:
            raise TxnStreamError(f"transaction {self._txn_id} can only abort: {self.error}",
                                 self._txn_id) from self.error
        return True

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the requests sent so far, lingering ones sent now (``timeout_s``)."""
        self._hurry.set()
        with self._lock:
            futures, self._futures = self._futures, []
        if not futures:
            return
        _, not_done = wait_futures(futures, timeout_s)
        cancelled = [f for f in futures if f.cancelled()]
        if cancelled or not_done:
            # Never sent (the client closed) or not answered in time: not known to be in.
            with self._lock:
                self._futures.extend(not_done)
            self.failed(TxnStreamError(
                f"{len(cancelled) + len(not_done)} partition registrations of "
                f"{self._txn_id} were not confirmed (the client closed, or no answer "
                f"within {timeout_s}s)", self._txn_id))

    def failed(self, exc: BaseException) -> None:
        """A request failed: keep the first error, and tell the txn."""
        self.keep(exc)
        self._on_failure(exc)

    def keep(self, exc: BaseException) -> None:
        """Keep ``exc`` as the error a commit raises, unless one came first."""
        with self._lock:
            if self.error is None:
                self.error = exc

    def clear(self) -> None:
        """The txn ended: nothing is waited for any more."""
        with self._lock:
            self._futures.clear()
            self._ahead.clear()
            self._unconfirmed.clear()
            self._lingering.clear()
            self._activation = self._activate = None
        self._hurry.set()
