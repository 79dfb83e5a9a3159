"""The one error hierarchy, rooted at ``TxnStreamError``, with the names a Pulsar user knows.

Kafka errors are classified in exactly one place, :func:`classify_kafka_error`:
retriable (retry with backoff inside a deadline), abort-the-transaction, or fatal.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException

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
    "TransactionOutcomeUnknownError",
    "RecordsExcludedError",
    "KafkaClientError",
    "ClusterError",
    "ConfigError",
    "CorruptRecordError",
    "NotCoordinatorError",
    "CoordinatorAuthError",
    "NotAuthorizedError",
    "InvalidRequestError",
    "UnknownPartitionError",
    "TooManyRequestsError",
    "KafkaErrorKind",
    "classify_kafka_error",
    "is_retriable_kafka_error",
    "message_error",
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


class NotCoordinatorError(CoordinatorNotFoundError):
    """The worker reached does not serve that coordinator (any more): look it up again."""


class CoordinatorAuthError(TxnStreamError):
    """A coordinator refused this client's credentials (shared secret or TLS certificate)."""


class WorkerIdentityError(CoordinatorAuthError):
    """An endpoint did not prove it is a worker of this cluster.

    It could not prove the client's secret, or does not authenticate while the client
    holds a secret: a forged endpoint record or a relay. The client does not talk to it.
    """


class WrongClusterError(WorkerIdentityError):
    """The worker at an endpoint serves another txnstream cluster.

    Another topic prefix, or another Kafka cluster: the record that named it is stale (a
    worker of that cluster took the address since) or forged.
    """


class NotAuthorizedError(TxnStreamError):
    """The principal may not do this to the txn: another principal opened it.

    Pulsar's ``NotAllowedException`` for a txn of another owner; admins excepted.
    """


class InvalidRequestError(TxnStreamError):
    """A coordinator refused a request as malformed (a value out of range, too large).

    The message names the field. Resending it cannot succeed.
    """


class UnknownPartitionError(InvalidRequestError):
    """A coordinator refused to register a partition the cluster's metadata lacks.

    Kafka's ``UNKNOWN_TOPIC_OR_PARTITION``: the topic does not exist or has fewer
    partitions, as far as the coordinator's last look (at most a second old) saw. A
    client whose own metadata shows the partition retries for a moment (a partition just
    added reaches the coordinator's view within a second); otherwise as its parent.
    """


class TooManyRequestsError(TxnStreamError):
    """A per-principal or per-connection limit of the worker was reached.

    Open txns or requests in flight; the message names the limit. Retry once some have
    ended.
    """


class RequestTimeoutError(TxnStreamError):
    """A coordinator request got no reply inside its deadline (its outcome is unknown)."""


class TransactionOutcomeUnknownError(RequestTimeoutError):
    """A commit or abort got no answer: the transaction may have ended either way.

    The transaction's status stays undecided (COMMITTING or ABORTING) until the
    coordinator answers; call ``commit()`` again (idempotent) to learn the outcome.
    Never treat it as aborted: work retried on that assumption would be written twice.
    """


class RecordsExcludedError(InvalidTxnStatusError):
    """Records this writer sent into a txn landed after the txn's first marker.

    The txn was ended by another handle (another process committed it while this one
    still wrote): every reader drops such records, so they are not part of it, whatever
    the txn's outcome. ``excluded`` names them: topic-partition -> offsets. The txn's
    outcome is ``outcome`` (its other records are delivered if it committed).
    """

    MAX_NAMED = 20

    def __init__(self, txn_id: TxnID, excluded: Mapping[Any, Sequence[int]],
                 outcome: str) -> None:
        named = ", ".join(f"{tp}@{','.join(map(str, offs[:self.MAX_NAMED]))}"
                          + (f" (+{len(offs) - self.MAX_NAMED})"
                             if len(offs) > self.MAX_NAMED else "")
                          for tp, offs in list(excluded.items())[:self.MAX_NAMED])
        n = sum(len(o) for o in excluded.values())
        super().__init__(
            txn_id, "OPEN", outcome,
            f"transaction {txn_id} was ended ({outcome}) by another handle while this one "
            f"wrote: {n} of its records landed after the txn's marker and no reader "
            f"delivers them: {named}")
        self.excluded = {tp: list(offs) for tp, offs in excluded.items()}
        self.outcome = outcome


class KafkaClientError(TxnStreamError):
    """A Kafka client call failed; the message names where.

    ``kind`` says how to react: fatal (retrying will not cure it), or retriable (a cluster
    that did not answer a metadata request: the same call succeeds once it does).
    """

    def __init__(self, message: str, kind: KafkaErrorKind, txn_id: TxnID | None = None) -> None:
        super().__init__(message, txn_id)
        self.kind = kind


class ClusterError(TxnStreamError):
    """The local broker could not be set up, started, or reached."""


class ConfigError(TxnStreamError, ValueError):
    """A setting, argument or option is missing or invalid; the message names it.

    Also a ``ValueError``, as Python's own bad-value errors are: ``except ValueError``
    keeps catching what used to surface as one (a malformed TxnID text, a NaN timeout).
    """


class CorruptRecordError(TxnStreamError):
    """An internal record could not be decoded (garbage bytes or an unknown version)."""


class KafkaErrorKind(enum.Enum):
    """How to react to a Kafka error."""

    RETRIABLE = "retriable"
    """Transient (leader moving, broker busy, timeout): retry with backoff in a deadline."""
    ABORT_TXN = "abort"
    """The transaction cannot commit any more: abort it, then carry on."""
    FATAL = "fatal"
    """Retrying cannot help (bad config, authorization, fenced client): raise."""


def classify_kafka_error(err: object) -> KafkaErrorKind:
    """Classify a ``confluent_kafka.KafkaError`` (or ``KafkaException``) once, for everyone.

    librdkafka flags each error: ``retriable()``, ``txn_requires_abort()``, ``fatal()``.
    Fatal wins, then abort, then retriable. An unflagged error is retriable if Kafka
    defines its code so (:data:`_RETRIABLE_CODES`), else fatal, so it surfaces instead
    of looping.
    """
    kerr = err.args[0] if isinstance(err, Exception) and err.args else err
    if getattr(kerr, "fatal", lambda: False)():
        return KafkaErrorKind.FATAL
    if getattr(kerr, "txn_requires_abort", lambda: False)():
        return KafkaErrorKind.ABORT_TXN
    if getattr(kerr, "retriable", lambda: False)():
        return KafkaErrorKind.RETRIABLE
    if getattr(kerr, "code", lambda: None)() in _RETRIABLE_CODES:
        return KafkaErrorKind.RETRIABLE
    return KafkaErrorKind.FATAL


_RETRIABLE_CODES = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR, KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.PREFERRED_LEADER_NOT_AVAILABLE,
})
"""Broker error codes Kafka's protocol defines as retriable (``RetriableException``),
for errors that reach us without librdkafka's flags: confluent-kafka builds those of
``get_watermark_offsets`` and ``offsets_for_times`` from the bare code. An unknown topic
or partition is left out: a deleted topic is reported, not waited on."""


_INFORMATIONAL = {
    KafkaError._PARTITION_EOF,  # end of a partition, not a failure
    KafkaError._TIMED_OUT,  # a poll/metadata wait ended; the client retries by itself
    KafkaError._TRANSPORT,  # a connection dropped; librdkafka reconnects
    KafkaError._ALL_BROKERS_DOWN,  # likewise, until the brokers come back
}
"""Consumer-side errors librdkafka reports but recovers from by itself."""


def is_retriable_kafka_error(exc: BaseException) -> bool:
    """For retry predicates (tenacity): a Kafka error classified RETRIABLE."""
    return isinstance(exc, KafkaException) and classify_kafka_error(exc) is KafkaErrorKind.RETRIABLE


def message_error(msg: Any, where: str, logger: logging.Logger | None = None) -> bool:
    """Whether a consumed message carries an error instead of a record.

    Every consume loop asks this instead of reading ``msg.error()`` itself, so a
    consumed error is classified in one place: end-of-partition and errors librdkafka
    recovers from by itself pass quietly (debug), other non-fatal ones are logged with
    ``where`` (the loop that met them), and a fatal one raises ``KafkaClientError``.
    """
    err = msg.error()
    if err is None:
        return False
    lg = logger or logging.getLogger("txnstream")
    kind = classify_kafka_error(err)
    if kind is KafkaErrorKind.FATAL and getattr(err, "fatal", lambda: False)():
        raise KafkaClientError(f"{where}: fatal Kafka error: {err}", kind)
    if err.code() in _INFORMATIONAL:
        lg.debug("%s: %s", where, err)
    else:
        lg.warning("%s: Kafka error (%s): %s", where, kind.value, err)
    return True
