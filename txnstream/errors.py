"""The one error hierarchy, rooted at ``TxnStreamError``, with the names a Pulsar user knows.

Kafka errors are classified in exactly one place, :func:`classify_kafka_error`:
retriable (retry with backoff inside a deadline), abort-the-transaction, or fatal.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txnstream.types import TxnID, TxnStatus

__all__ = [
    "TxnStreamError",
    "TransactionConflictError",
    "TransactionTimeoutError",
    "InvalidTxnStatusError",
    "TransactionNotFoundError",
    "CoordinatorNotFoundError",
    "RequestTimeoutError",
    "ClusterError",
    "ConfigError",
    "CorruptRecordError",
    "KafkaErrorKind",
    "classify_kafka_error",
]


class TxnStreamError(Exception):
    """Root of every error txnstream raises on purpose."""

    def __init__(self, message: str, txn_id: TxnID | None = None) -> None:
        super().__init__(message)
        self.txn_id = txn_id


class TransactionConflictError(TxnStreamError):
    """Another transaction already acked (or pending-acked) the same message."""


class TransactionTimeoutError(TxnStreamError):
    """The transaction outlived its timeout and the coordinator aborted it."""


class InvalidTxnStatusError(TxnStreamError):
    """The transaction is not in a status that allows the operation."""

    def __init__(
        self,
        txn_id: TxnID | None,
        expected: TxnStatus | str | None,
        actual: TxnStatus | str | None,
        message: str | None = None,
    ) -> None:
        exp = getattr(expected, "value", expected)
        act = getattr(actual, "value", actual)
        text = message or f"transaction {txn_id} is {act}, expected {exp}"
        super().__init__(text, txn_id)
        self.expected = expected
        self.actual = actual


class TransactionNotFoundError(TxnStreamError):
    """The coordinator knows no such transaction (never existed, or ended and truncated)."""


class CoordinatorNotFoundError(TxnStreamError):
    """No coordinator with that id exists, or none is serving it right now."""


class RequestTimeoutError(TxnStreamError):
    """A coordinator request got no reply inside its deadline (its outcome is unknown)."""


class ClusterError(TxnStreamError):
    """The local broker could not be set up, started, or reached."""


class ConfigError(TxnStreamError):
    """A setting is missing or invalid; the message names it."""


class CorruptRecordError(TxnStreamError):
    """An internal record could not be decoded (garbage bytes or an unknown version)."""


class KafkaErrorKind(enum.Enum):
    """How to react to a Kafka error."""

    RETRIABLE = "retriable"
    ABORT_TXN = "abort"
    FATAL = "fatal"


def classify_kafka_error(err: object) -> KafkaErrorKind:
    """Classify a ``confluent_kafka.KafkaError`` (or ``KafkaException``) once, for everyone.

    librdkafka flags each error: ``retriable()``, ``txn_requires_abort()``, ``fatal()``.
    Fatal wins, then abort, then retriable; anything unflagged is treated as fatal so it
    surfaces instead of looping.
    """
    kerr = err.args[0] if isinstance(err, Exception) and err.args else err
    if getattr(kerr, "fatal", lambda: False)():
        return KafkaErrorKind.FATAL
    if getattr(kerr, "txn_requires_abort", lambda: False)():
        return KafkaErrorKind.ABORT_TXN
    if getattr(kerr, "retriable", lambda: False)():
        return KafkaErrorKind.RETRIABLE
    return KafkaErrorKind.FATAL
