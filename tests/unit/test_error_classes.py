"""The one Kafka error classifier (DESIGN.md section 8), class by class, with no broker."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.errors import (
    KafkaClientError,
    KafkaErrorKind,
    classify_kafka_error,
    is_retriable_kafka_error,
    message_error,
)

LOG = logging.getLogger("test.errors")


def kerr(code: int = KafkaError._TIMED_OUT, reason: str = "x", *, fatal: bool = False,
         retriable: bool = False, txn_requires_abort: bool = False) -> KafkaError:
    return KafkaError(code, reason, fatal=fatal, retriable=retriable,
                      txn_requires_abort=txn_requires_abort)


class Msg:
    """A consumed message as the consume loops see it: only ``error()`` matters here."""

    def __init__(self, err: KafkaError | None) -> None:
        self._err = err

    def error(self) -> KafkaError | None:
        return self._err


# ------------------------------------------------------------ classify_kafka_error

@pytest.mark.parametrize("flags, kind", [
    ({"retriable": True}, KafkaErrorKind.RETRIABLE),
    ({"txn_requires_abort": True}, KafkaErrorKind.ABORT_TXN),
    ({"fatal": True}, KafkaErrorKind.FATAL),
    ({}, KafkaErrorKind.FATAL),  # unflagged: surfaces instead of looping
    ({"fatal": True, "retriable": True, "txn_requires_abort": True}, KafkaErrorKind.FATAL),
    ({"retriable": True, "txn_requires_abort": True}, KafkaErrorKind.ABORT_TXN),
])
def test_classify_kafka_error_fatal_wins_then_abort_then_retriable(flags, kind):
    err = kerr(KafkaError.TOPIC_AUTHORIZATION_FAILED, **flags)
    assert classify_kafka_error(err) is kind
    assert classify_kafka_error(KafkaException(err)) is kind  # as raised, same answer


def test_classify_kafka_error_of_a_real_librdkafka_code_uses_its_flags():
    assert classify_kafka_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)) is KafkaErrorKind.FATAL


@pytest.mark.parametrize("code", [
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR, KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE,
])
def test_an_unflagged_error_of_a_code_kafka_defines_retriable_is_retriable(code):
    # confluent-kafka builds the errors of get_watermark_offsets and offsets_for_times from
    # the bare code, without librdkafka's flags: a topic created a moment ago whose
    # partition has no leader yet answers NOT_LEADER_FOR_PARTITION, and must be retried
    assert classify_kafka_error(KafkaException(KafkaError(code))) is KafkaErrorKind.RETRIABLE
    assert is_retriable_kafka_error(KafkaException(KafkaError(code)))


def test_an_unflagged_unknown_topic_still_surfaces():
    # a deleted topic must be reported, not retried as if its leader were moving
    assert classify_kafka_error(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)) is \
        KafkaErrorKind.FATAL


# -------------------------------------------------------- is_retriable_kafka_error

def test_is_retriable_kafka_error_only_for_kafka_exceptions_classified_retriable():
    assert is_retriable_kafka_error(KafkaException(kerr(retriable=True)))
    assert not is_retriable_kafka_error(KafkaException(kerr(txn_requires_abort=True)))
    assert not is_retriable_kafka_error(KafkaException(kerr(fatal=True)))
    assert not is_retriable_kafka_error(KafkaException(kerr()))
    assert not is_retriable_kafka_error(ValueError("retriable"))
    assert not is_retriable_kafka_error(TimeoutError())


# ------------------------------------------------------------------ message_error

def test_message_error_is_false_for_a_record_and_logs_nothing(caplog):
    caplog.set_level(logging.DEBUG)
    assert message_error(Msg(None), "loop", LOG) is False
    assert caplog.records == []


@pytest.mark.parametrize("code", [KafkaError._PARTITION_EOF, KafkaError._TIMED_OUT,
                                  KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_message_error_passes_errors_librdkafka_recovers_from_quietly(code, caplog):
    caplog.set_level(logging.DEBUG)
    assert message_error(Msg(kerr(code)), "the loop", LOG) is True
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "the loop" in caplog.text


@pytest.mark.parametrize("flags, kind", [
    ({"retriable": True}, "retriable"),
    ({"txn_requires_abort": True}, "abort"),
    ({}, "fatal"),  # unflagged, not marked fatal by librdkafka: logged, the loop goes on
])
def test_message_error_logs_other_errors_with_where_and_class(flags, kind, caplog):
    err = kerr(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied", **flags)
    assert message_error(Msg(err), "buffer worker", LOG) is True
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING
    assert "buffer worker" in rec.getMessage() and f"({kind})" in rec.getMessage()


def test_message_error_raises_on_a_fatal_error_naming_where():
    with pytest.raises(KafkaClientError, match="snapshot store: fatal Kafka error") as exc:
        message_error(Msg(kerr(KafkaError._FENCED, "fenced", fatal=True)), "snapshot store", LOG)
    assert exc.value.kind is KafkaErrorKind.FATAL


def test_message_error_without_a_logger_uses_the_package_logger(caplog):
    message_error(Msg(kerr(retriable=True, code=KafkaError.REQUEST_TIMED_OUT)), "w")
    assert caplog.records[0].name == "txnstream"
