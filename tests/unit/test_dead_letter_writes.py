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


# ------------------------------------------------------------------ reconsume_later


class Routed:
    """Producers by topic: what each was sent, with its delay."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, dict[str, bytes], Any]] = []

    def producer(self, topic: str) -> Any:
        routed = self

        class P:
            def send(self, value: Any, key: Any, txn: Any, headers: Any,
                     deliver_after: Any = None) -> int:
                routed.sent.append((topic, txn, dict(headers), deliver_after))
                return 0
        return P()


def retrying(**policy: Any) -> tuple[DeadLetters, Routed, list[Any], list[str]]:
    routed, acks, txns = Routed(), [], []

    @contextmanager
    def transaction() -> Any:
        txns.append("own")
        yield "own-txn"

    d = DeadLetters(DeadLetterPolicy(2, **policy), ["in"], "sub", routed.producer,
                    transaction, lambda: {"in", "in-sub-DLQ", "in-sub-RETRY", "r"})
    d.bind(lambda ms, txn: acks.append(([m.offset for m in ms], txn)))
    return d, routed, acks, txns


def test_reconsume_later_writes_the_retry_letter_with_its_delay_and_acks_in_one_txn():
    d, routed, acks, txns = retrying(enable_retry=True)
    assert d.retry_topics == ["in-sub-RETRY"]
    d.reconsume_later(msg(7, 0), 1.5, None)
    assert txns == ["own"] and acks == [([7], "own-txn")]
    ((topic, txn, headers, after),) = routed.sent
    assert (topic, txn, after) == ("in-sub-RETRY", "own-txn", 1.5)
    assert headers == {"h": b"1", "REAL_TOPIC": b"in", "ORIGIN_MESSAGE_ID": b"in-0@7",
                       "RECONSUMETIMES": b"1", "DELAY_TIME": b"1500"}


def test_reconsume_later_in_the_callers_txn_opens_none_of_its_own():
    d, routed, acks, txns = retrying(retry_letter_topic="r")
    d.reconsume_later(msg(1, 0), 0, "caller-txn")
    assert txns == [] and acks == [([1], "caller-txn")]
    assert routed.sent[0][:2] == ("r", "caller-txn")


def test_a_retry_letter_retried_past_the_count_is_dead_lettered_as_of_its_original_topic():
    d, routed, acks, _ = retrying(enable_retry=True)
    back = Message("in-sub-RETRY", 0, 4, b"k", b"v",
                   (("h", b"1"), ("REAL_TOPIC", b"in"), ("ORIGIN_MESSAGE_ID", b"in-0@7"),
                    ("RECONSUMETIMES", b"1"), ("DELAY_TIME", b"1500")), 0)
    d.reconsume_later(back, 1, None)  # the 2nd retry: still the retry topic, counted on
    assert routed.sent[-1][0] == "in-sub-RETRY"
    assert routed.sent[-1][2]["RECONSUMETIMES"] == b"2"
    assert routed.sent[-1][2]["ORIGIN_MESSAGE_ID"] == b"in-0@7"
    again = Message(back.topic, 0, 5, b"k", b"v", (*back.headers[:3], ("RECONSUMETIMES", b"2")), 0)
    d.reconsume_later(again, 1, None)  # the 3rd: past max 2, dead-lettered
    topic, _, headers, after = routed.sent[-1]
    assert (topic, after) == ("in-sub-DLQ", None)
    assert headers["REAL_TOPIC"] == b"in" and headers["ORIGIN_MESSAGE_ID"] == b"in-0@7"
    assert acks[-1] == ([5], "own-txn") and d.dead_lettered == 1


def test_reconsume_later_without_retries_or_with_a_bad_delay_is_refused_by_name():
    d, *_ = retrying()
    with pytest.raises(ConfigError, match="retry_letter_topic"):
        d.reconsume_later(msg(1, 0), 1, None)
    d, routed, acks, _ = retrying(enable_retry=True)
    for bad in (-1, "soon", 10**9):
        with pytest.raises(ConfigError, match="reconsume_later delay"):
            d.reconsume_later(msg(1, 0), bad, None)
    assert routed.sent == [] and acks == []


@pytest.mark.parametrize("policy,named", [
    ({"retry_letter_topic": "missing"}, "'missing' does not exist"),
    ({"retry_letter_topic": "in"}, "a topic this subscription reads"),
    ({"retry_letter_topic": "in-sub-DLQ"}, "the dead-letter topic too"),
])
def test_a_retry_topic_that_cannot_be_one_is_refused_at_subscribe(policy, named):
    with pytest.raises(ConfigError, match=named):
        retrying(**policy)
