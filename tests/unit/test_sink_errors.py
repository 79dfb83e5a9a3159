"""The Spark sink's group commit decides by error class, never by an error's text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pyspark")

from txnstream.errors import (  # noqa: E402
    InvalidTxnStatusError,
    RequestTimeoutError,
    TransactionOutcomeUnknownError,
    TransactionTimeoutError,
)
from txnstream.types import TxnID  # noqa: E402
from txnstream_spark import sink as src  # noqa: E402
from txnstream_spark.options import SinkOptions  # noqa: E402

OPTS = SinkOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out",
                          "txnstream.txnTimeoutSeconds": "7"})
MESSAGES = [src.TxnCommitMessage(2, 10, 5, "q"), src.TxnCommitMessage(2, 11, 5, "q")]


class FakeTc:
    """Coordinator client whose answers to END_GROUP are scripted (errors are raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    def request(self, op, tc_id, **fields):
        self.calls.append({"op": op, "tc_id": tc_id, **fields})
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, BaseException):
            raise a
        return a


@pytest.fixture
def tc(monkeypatch):
    holder = SimpleNamespace(tc=None, dropped=0)

    def client_for(config):
        from txnstream.client import Client

        client = Client(config=config)  # its public calls, over the scripted coordinator
        client._tc = holder.tc
        return client, {}

    def drop(config):
        holder.dropped += 1

    monkeypatch.setattr(src, "_client_for", client_for)
    monkeypatch.setattr(src, "_drop_client", drop)
    return holder


def ok(already: bool = False):
    return SimpleNamespace(already=already)


def test_a_timed_out_txn_fails_the_batch_with_a_timeout_error_naming_the_option(tc):
    tc.tc = FakeTc(TransactionTimeoutError("transaction (2,10) timed out after 7000 ms",
                                           TxnID(2, 10)))
    with pytest.raises(TransactionTimeoutError) as exc:
        src._end_group(OPTS, MESSAGES, "q/3", commit=True)
    assert "txnstream.txnTimeoutSeconds" in str(exc.value) and "7" in str(exc.value)
    assert "(2,10)" in str(exc.value)


def test_an_invalid_status_is_not_read_as_a_timeout_whatever_its_text(tc):
    tc.tc = FakeTc(InvalidTxnStatusError(TxnID(2, 10), None, None,
                                         "transaction (2,10) is ABORTED (its timeout ...)"))
    with pytest.raises(InvalidTxnStatusError) as exc:
        src._end_group(OPTS, MESSAGES, "q/3", commit=True)
    assert not isinstance(exc.value, TransactionTimeoutError)
    assert "txnstream.txnTimeoutSeconds" not in str(exc.value)


def test_a_lost_reply_is_asked_again_with_the_same_key_and_then_commits(tc):
    tc.tc = FakeTc(RequestTimeoutError("no reply"), ok())
    src._end_group(OPTS, MESSAGES, "q/3", commit=True)
    assert [c["group_key"] for c in tc.tc.calls] == ["q/3", "q/3"]
    assert all(c["group_seqs"] == (10, 11) for c in tc.tc.calls)


def test_an_unknown_outcome_is_reported_as_unknown_never_as_failed_or_aborted(tc):
    tc.tc = FakeTc(RequestTimeoutError("no reply"))
    with pytest.raises(TransactionOutcomeUnknownError) as exc:
        src._end_group(OPTS, MESSAGES, "q/3", commit=True)
    assert "q/3" in str(exc.value)
    assert len(tc.tc.calls) == src.GROUP_END_ATTEMPTS
    assert all(c["commit"] for c in tc.tc.calls), "an unknown outcome must not abort"
