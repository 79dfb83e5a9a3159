"""``TransactionCoordinatorClient``: how every ``Client`` talks to the coordinators.

A request goes to partition ``tc_id`` of ``__txn_requests``; the reply comes back on the
one partition of ``__txn_replies`` this client listens on (chosen at random, read from
its end by a background thread). A request that gets no reply inside one attempt is sent
again with the *same* request id (handling is idempotent) until the request deadline,
so a client rides through a coordinator failover. Failed replies are raised as the same
error class the coordinator raised.

Kafka errors are classified by :mod:`txnstream.errors`, nowhere else: a retriable one
(and a full local queue, ``BufferError``) is retried with a short backoff inside the
deadline; any other (fatal, abort-the-transaction, or unflagged) raises
``KafkaClientError`` at once, naming the coordinator and the request, since resending
cannot heal it and a timeout would hide the cause. A fatal error on the reply consumer
fails this and every later request of the client the same way.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTP
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
)

from txnstream.config import Config
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest, error_from_reply
from txnstream.errors import (
    CoordinatorNotFoundError,
    CorruptRecordError,
    KafkaClientError,
    RequestTimeoutError,
    classify_kafka_error,
    is_retriable_kafka_error,
    message_error,
)

__all__ = ["TransactionCoordinatorClient"]

log = logging.getLogger(__name__)

ATTEMPT_TIMEOUT_S = 3.0
"""Wait for one attempt's reply; a healthy round trip takes milliseconds, and resending
sooner than a broker hiccup would only duplicate work the coordinator dedups anyway."""
RESEND_BACKOFF_FIRST_S = 0.05
"""Wait before resending after a retriable Kafka error (leader moving, queue full): the
local producer refused the request, so resending at once would only spin."""
RESEND_BACKOFF_MAX_S = 1.0
"""Cap of that doubling wait, well inside the default 30 s request deadline."""


class _NoReply(Exception):
    pass


def _should_resend(exc: BaseException) -> bool:
    """The retry decision: no reply yet, a full local queue, or a retriable Kafka error."""
    return isinstance(exc, (_NoReply, BufferError)) or is_retriable_kafka_error(exc)


def _resend_wait(state: RetryCallState) -> float:
    """No wait after a silent attempt (it waited already); backoff after a Kafka error."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, _NoReply):
        return 0.0
    return min(RESEND_BACKOFF_MAX_S, RESEND_BACKOFF_FIRST_S * 2 ** (state.attempt_number - 1))


class _Pending:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: TcReply | None = None


class TransactionCoordinatorClient:
    """Sends requests to coordinators and waits for their replies."""

    def __init__(self, config: Config, producer: Producer | None = None) -> None:
        self.config = config
        self.client_id = f"c-{uuid.uuid4().hex[:12]}"
        self._producer = producer or Producer(config.producer(**{"linger.ms": 0}))
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._fatal: KafkaClientError | None = None
        """Set when the reply consumer met a fatal error: no reply can come any more."""
        self._rr = itertools.count(random.randrange(1 << 16))
        meta = self._producer.list_topics(timeout=config.admin_timeout_s)
        t = config.topics
        for name in (t.requests, t.replies, t.log):
            if name not in meta.topics or meta.topics[name].error is not None:
                raise CoordinatorNotFoundError(
                    f"topic {name} does not exist on {config.bootstrap_servers}: run "
                    f"`txnstream init` (prefix {t.prefix!r}) and start a `txnstream worker`")
        self.num_coordinators = len(meta.topics[t.requests].partitions)
        self.reply_partition = random.randrange(len(meta.topics[t.replies].partitions))
        self._consumer = Consumer(config.consumer(f"{t.prefix}-client-{self.client_id}",
                                                  **{"fetch.wait.max.ms": 10}))
        tp = KafkaTP(t.replies, self.reply_partition)
        _, high = self._consumer.get_watermark_offsets(tp, timeout=config.admin_timeout_s)
        tp.offset = high
        self._consumer.assign([tp])
        self._thread = threading.Thread(target=self._listen, name="txnstream-replies",
                                        daemon=True)
        self._thread.start()

    def pick_coordinator(self) -> int:
        """Round-robin over the coordinators, spreading new txns."""
        return next(self._rr) % self.num_coordinators

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                first = self._consumer.poll(0.1)
                msgs = [first, *self._consumer.consume(500, 0)] if first is not None else []
            except RuntimeError:  # closed under us
                return
            for m in msgs:
                try:
                    if message_error(m, f"client {self.client_id} reply consumer", log):
                        continue
                except KafkaClientError as exc:
                    # This consumer cannot go on: fail waiting and later requests at once.
                    log.error("client %s: %s; no coordinator reply can arrive any more",
                              self.client_id, exc)
                    self._fatal = exc
                    with self._lock:
                        for waiting in self._pending.values():
                            waiting.event.set()
                    return
                key = m.key()
                if key is None:
                    continue
                with self._lock:
                    pending = self._pending.get(key.decode(errors="replace"))
                if pending is None:
                    continue  # another client's reply, or a duplicate
                try:
                    pending.reply = TcReply.decode(m.value())
                except CorruptRecordError as exc:
                    log.error("bad reply at %s[%d]@%d: %s", m.topic(), m.partition(),
                              m.offset(), exc)
                    continue
                pending.event.set()

    def request(self, op: TcOp, tc_id: int, *, timeout_s: float | None = None,
                **fields: Any) -> TcReply:
        """Send one request and return its successful reply, or raise its error.

        Raises the coordinator's error class for a failed reply, ``RequestTimeoutError``
        if no reply came in time (outcome unknown), ``KafkaClientError`` at once for a
        Kafka error that retrying cannot heal.
        """
        self._raise_if_fatal()
        if not 0 <= tc_id < self.num_coordinators:
            raise CoordinatorNotFoundError(
                f"coordinator {tc_id} does not exist: there are {self.num_coordinators} "
                f"(0..{self.num_coordinators - 1})")
        deadline_s = timeout_s if timeout_s is not None else self.config.request_timeout_s
        request_id = uuid.uuid4().hex
        req = TcRequest(request_id, self.client_id, self.reply_partition, op, tc_id,
                        int((time.time() + deadline_s) * 1000), **fields)
        pending = _Pending()
        with self._lock:
            self._pending[request_id] = pending
        try:
            reply = self._send_until_answered(req, pending, deadline_s)
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        err = error_from_reply(reply)
        if err is not None:
            raise err
        return reply

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise KafkaClientError(str(self._fatal), self._fatal.kind) from self._fatal

    def _send_until_answered(self, req: TcRequest, pending: _Pending,
                             deadline_s: float) -> TcReply:
        payload = req.encode()

        def attempt() -> TcReply:
            self._produce(req, payload)
            if not pending.event.wait(ATTEMPT_TIMEOUT_S) or pending.reply is None:
                self._raise_if_fatal()
                raise _NoReply()
            return pending.reply

        retrying = Retrying(retry=retry_if_exception(_should_resend),
                            stop=stop_after_delay(deadline_s), wait=_resend_wait, reraise=False)
        try:
            return retrying(attempt)
        except KafkaException as exc:  # classified not retriable: resending cannot heal it
            kind = classify_kafka_error(exc)
            err = exc.args[0] if exc.args else exc
            text = err.str() if hasattr(err, "str") else str(err)
            raise KafkaClientError(
                f"request {req.op.value} to coordinator {req.tc_id} failed with a "
                f"{kind.value} Kafka error: {text}", kind) from exc
        except RetryError as exc:
            raise RequestTimeoutError(
                f"no reply from coordinator {req.tc_id} to {req.op.value} within "
                f"{deadline_s:.0f}s: is a `txnstream worker` running against "
                f"{self.config.bootstrap_servers} with prefix {self.config.topics.prefix!r}?"
            ) from exc

    def _produce(self, req: TcRequest, payload: bytes) -> None:
        # linger.ms=0: sent at once; no flush, which would wait on every thread's sends.
        self._producer.produce(self.config.topics.requests, payload, key=req.request_id.encode(),
                               partition=req.tc_id)
        self._producer.poll(0)

    def broadcast(self, op: TcOp, **fields: Any) -> list[TcReply]:
        """The same request to every coordinator (admin listing and stats)."""
        out: list[TcReply] = []
        errors: list[Exception] = []
        lock = threading.Lock()

        def one(tc: int) -> None:
            try:
                r = self.request(op, tc, **fields)
                with lock:
                    out.append(r)
            except Exception as exc:
                with lock:
                    errors.append(exc)

        _run_all([functools.partial(one, tc) for tc in range(self.num_coordinators)])
        if errors and not out:
            raise errors[0]
        return sorted(out, key=lambda r: r.tc_id)

    def close(self) -> None:
        """Stop listening; the producer is flushed by its owner."""
        self._closed.set()
        self._producer.flush(ATTEMPT_TIMEOUT_S)
        self._thread.join(2)
        self._consumer.close()


def _run_all(fns: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=f, daemon=True) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
