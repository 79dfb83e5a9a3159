"""``DeadLetters.divert`` without a broker: what is dead-lettered, in one txn, and what
happens when that txn fails (the records are given back; a revoked one is skipped)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from txnstream import DeadLetterPolicy
from txnstream.errors import ConfigError, TxnStreamError
from txnstream.lifecycle import DeadLetters
from txnstream.message import Message


def msg(offset: int, count: int, partition: int = 0) -> Message:
    return Message("in", partition, offset, b"k", b"v", (("h", b"1"),), 0,
                   redelivery_count=count)


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def send(self, value: Any, key: Any, txn: Any, headers: Any) -> int:
        self.records.append((value, key, txn, dict(headers)))
        return 0


def letters(fail: bool = False) -> tuple[DeadLetters, Sent, list[Any], list[str]]:
    sent, acks, txns = Sent(), [], []

    @contextmanager
    def transaction() -> Any:
        txns.append("open")
        yield "txn-1"
        if fail:
            raise TxnStreamError("commit failed")
        txns.append("committed")

    d = DeadLetters(DeadLetterPolicy(2, "dlq"), ["in"], "sub", lambda t: sent,  # type: ignore[arg-type,return-value]
                    transaction, lambda: {"in", "dlq"})
    d.bind(lambda ms, txn: acks.append(([m.offset for m in ms], txn)))
    return d, sent, acks, txns


def test_records_past_the_count_are_sent_and_acked_in_one_txn_the_rest_handed_out():
    d, sent, acks, txns = letters()
    keep = msg(0, 2)
    out = d.divert([keep, msg(1, 3), msg(2, 5, partition=1)], lambda ms: pytest.fail("given back"))
    assert out == [keep]
    assert txns == ["open", "committed"] and d.dead_lettered == 2
    assert sorted(acks) == [([1], "txn-1"), ([2], "txn-1")]  # one ack per partition
    value, key, txn, headers = sent.records[0]
    assert (value, key, txn) == (b"v", b"k", "txn-1")
    assert headers == {"h": b"1", "REAL_TOPIC": b"in", "ORIGIN_MESSAGE_ID": b"in-0@1",
                       "REAL_SUBSCRIPTION": b"sub", "REDELIVERY_COUNT": b"3"}


def test_a_failed_dead_letter_txn_gives_every_record_back_and_skips_a_revoked_one():
    d, _, _, _ = letters(fail=True)
    given: list[int] = []

    def give_back(ms: list[Message]) -> None:
        if ms[0].offset == 1:
            raise TxnStreamError("partition in-0 is not assigned to this consumer")
        given.extend(m.offset for m in ms)

    assert d.divert([msg(1, 3), msg(2, 3)], give_back) == []
    assert given == [2] and d.dead_lettered == 0


def test_a_dead_letter_topic_that_is_missing_or_read_is_refused():
    with pytest.raises(ConfigError, match="does not exist"):
        DeadLetters(DeadLetterPolicy(2, "dlq"), ["in"], "s", lambda t: None,  # type: ignore[arg-type,return-value]
                    lambda: None, lambda: {"in"})  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="reads"):
        DeadLetters(DeadLetterPolicy(2, "in"), ["in"], "s", lambda t: None,  # type: ignore[arg-type,return-value]
                    lambda: None, lambda: {"in"})  # type: ignore[arg-type,return-value]
