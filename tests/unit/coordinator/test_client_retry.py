"""The coordinator client's retry decision per Kafka error class, with no broker.

DESIGN.md section 8: Kafka errors are classified once (``txnstream.errors``): retriable
-> retry with backoff inside the request deadline; anything else -> raise at once with a
clear error, instead of resending until the deadline and reporting a timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.config import Config
from txnstream.coordinator.client import TransactionCoordinatorClient
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.errors import KafkaClientError, KafkaErrorKind, RequestTimeoutError


class FakeProducer:
    """Raises the scripted errors from ``produce()``, then lets the coordinator answer."""

    def __init__(self, errors: list[BaseException | None]) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.client: TransactionCoordinatorClient | None = None

    def produce(self, topic: str, value: bytes, key: bytes | None = None,
                partition: int = -1) -> None:
        self.calls += 1
        if self.errors:
            err = self.errors.pop(0)
            if err is not None:
                raise err
        req = TcRequest.decode(value)
        assert self.client is not None
        pending = self.client._pending[req.request_id]
        pending.reply = TcReply(req.request_id, req.client_id, req.tc_id, owner_id="tc")
        pending.event.set()

    def poll(self, timeout: float = 0) -> int:
        return 0


class FakeConsumer:
    def __init__(self, messages: list[Any]) -> None:
        self.messages = list(messages)

    def poll(self, timeout: float) -> Any:
        if self.messages:
            return self.messages.pop(0)
        time.sleep(timeout)
        return None

    def consume(self, n: int, timeout: float) -> list[Any]:
        return []


class ErrorMessage:
    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def error(self) -> KafkaError:
        return self._err


def bare_client(producer: FakeProducer, consumer: FakeConsumer | None = None,
                ) -> TransactionCoordinatorClient:
    """A client wired to fakes (its constructor would ask a broker for topics)."""
    c = TransactionCoordinatorClient.__new__(TransactionCoordinatorClient)
    c.config = Config(bootstrap_servers="127.0.0.1:1")
    c.client_id = "c-test"
    c._producer = producer
    c._pending = {}
    c._lock = threading.Lock()
    c._closed = threading.Event()
    c.num_coordinators = 4
    c.reply_partition = 0
    c._consumer = consumer or FakeConsumer([])
    c._fatal = None
    producer.client = c
    return c


RETRIABLE = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "leader moved",
                                      retriable=True))
FATAL = KafkaException(KafkaError(KafkaError._FATAL, "idempotent producer fenced", fatal=True))
ABORT = KafkaException(KafkaError(KafkaError._STATE, "txn must abort", txn_requires_abort=True))
UNFLAGGED = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "request too large"))


@pytest.mark.parametrize("err", [RETRIABLE, BufferError("Local: Queue full")],
                         ids=["retriable", "queue-full"])
def test_retriable_errors_are_retried_with_backoff_until_answered(err):
    p = FakeProducer([err, err, None])
    c = bare_client(p)
    t0 = time.monotonic()
    reply = c.request(TcOp.GET, 1, timeout_s=10, txn_seq=5)
    assert reply.tc_id == 1 and p.calls == 3
    assert time.monotonic() - t0 >= 0.05, "resent without any backoff"


@pytest.mark.parametrize("err,kind", [(FATAL, KafkaErrorKind.FATAL),
                                      (ABORT, KafkaErrorKind.ABORT_TXN),
                                      (UNFLAGGED, KafkaErrorKind.FATAL)],
                         ids=["fatal", "abort", "unflagged"])
def test_other_kafka_errors_raise_at_once_with_a_clear_error(err, kind):
    p = FakeProducer([err])
    c = bare_client(p)
    t0 = time.monotonic()
    with pytest.raises(KafkaClientError) as exc:
        c.request(TcOp.END, 2, timeout_s=10, txn_seq=7, commit=True)
    assert time.monotonic() - t0 < 1.0 and p.calls == 1, "retried an error that cannot heal"
    assert exc.value.kind is kind
    text = str(exc.value)
    assert "coordinator 2" in text and "END" in text and err.args[0].str() in text


def test_no_reply_is_still_a_request_timeout():
    class Silent(FakeProducer):
        def produce(self, *a: Any, **kw: Any) -> None:
            self.calls += 1

    c = bare_client(Silent([]))
    with pytest.raises(RequestTimeoutError):
        c.request(TcOp.GET, 0, timeout_s=0.5, txn_seq=1)


def test_fatal_error_on_the_reply_consumer_fails_requests_at_once():
    fatal = KafkaError(KafkaError._FATAL, "consumer fenced", fatal=True)

    class Silent(FakeProducer):
        def produce(self, *a: Any, **kw: Any) -> None:
            self.calls += 1

    c = bare_client(Silent([]), FakeConsumer([ErrorMessage(fatal)]))
    listener = threading.Thread(target=c._listen, daemon=True)
    listener.start()
    listener.join(5)
    assert not listener.is_alive(), "the listener must stop on a fatal consumer error"
    t0 = time.monotonic()
    with pytest.raises(KafkaClientError, match="consumer fenced"):
        c.request(TcOp.GET, 0, timeout_s=10, txn_seq=1)
    assert time.monotonic() - t0 < 1.0
