"""The finalizer and the handler around partitions that cannot be written, with no broker.

A fake producer plays the cluster: per topic it delivers, refuses (``MSG_SIZE_TOO_LARGE``)
or says the topic or partition does not exist; a fake lookup plays the metadata.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.config import Config, TopicNames
from txnstream.coordinator.finalizer import TxnFinalizer
from txnstream.coordinator.handlers import FORCE_END, Caller, TcRequestHandler
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.ownership import TcIncarnation, TcPhase
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.errors import TooManyRequestsError
from txnstream.kafka.topics import PartitionCatalog
from txnstream.types import TopicPartition, TxnStatus

CONFIG = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"))
NOW_MS = 1_000_000


class FakeProducer:
    """``behaviour[topic]``: ``ok``, ``refuse``, ``gone`` (delivery error) or ``raise``
    (``produce()`` raises ``_UNKNOWN_PARTITION``); ``silent`` never reports."""

    def __init__(self, behaviour: dict[str, str]) -> None:
        self.behaviour = behaviour
        self.produced: Counter[TopicPartition] = Counter()
        self._reports: list[Callable[[], None]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None,
                partition: int = -1, headers: Any = None,
                on_delivery: Callable[[KafkaError | None, Any], None] | None = None) -> None:
        how = self.behaviour.get(topic, "ok")
        if how == "raise":
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.produced[TopicPartition(topic, partition)] += 1
        err = {"ok": None, "refuse": KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
               "gone": KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)}.get(how)
        if how != "silent" and on_delivery is not None:
            self._reports.append(lambda: on_delivery(err, None))

    def poll(self, timeout: float = 0) -> int:
        reports, self._reports = self._reports, []
        for r in reports:
            r()
        return len(reports)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


class FakeOwnership:
    def __init__(self, tc: TcIncarnation) -> None:
        self.tcs = {tc.tc_id: tc}
        self.appended: list[Any] = []

    def serving(self, tc: TcIncarnation) -> bool:
        return self.tcs.get(tc.tc_id) is tc

    def append_async(self, tc: TcIncarnation, entries: list[Any]) -> None:
        self.appended.extend(entries)


class Clients:
    def __init__(self, producer: FakeProducer) -> None:
        self.producer = producer


class Setup:
    def __init__(self, behaviour: dict[str, str], topics: dict[str, int | None]) -> None:
        self.topics = topics
        self.lookups: Counter[str] = Counter()
        self.catalog = PartitionCatalog(self._lookup, refresh_interval_s=0.0)
        self.tc = TcIncarnation(0, TransactionMetadataStore(0, "w"), 0, TcPhase.SERVING)
        self.producer = FakeProducer(behaviour)
        self.replies: list[tuple[TcRequest, TcReply]] = []
        self.finalizer = TxnFinalizer(
            FakeOwnership(self.tc), Clients(self.producer), "__unit_pending_ack",  # type: ignore[arg-type]
            "w", lambda req, reply: self.replies.append((req, reply)),
            flush_timeout_s=0.2, backoff_max_s=5.0, partitions=self.catalog)
        self.handler = TcRequestHandler(CONFIG, "w", {}, partitions=self.catalog)

    def _lookup(self, topic: str | None) -> dict[str, int | None]:
        self.lookups[str(topic)] += 1
        return {t: n for t, n in self.topics.items() if n is not None}

    def committing(self, *tps: TopicPartition) -> int:
        store = self.tc.store
        meta, _ = store.new_txn("r1", 60_000, NOW_MS)
        seq = meta.txn_id.least_bits
        store.add_partitions(seq, tps, NOW_MS)
        store.end_txn(seq, True, NOW_MS)
        store.unlogged()
        return seq

    def finalize_now(self) -> None:
        self.tc.retry_at.clear()  # past every backoff
        self.finalizer.finalize(NOW_MS)

    def status(self, seq: int) -> TxnStatus:
        return self.tc.store.txns[seq].status


A0, B0, B1 = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("b", 1)


def test_one_refusing_partition_stops_no_other_and_a_retry_writes_only_what_is_missing():
    s = Setup({"a": "refuse"}, {"a": 1, "b": 2})
    seq = s.committing(A0, B0, B1)
    for _ in range(3):
        s.finalize_now()
    assert s.status(seq) is TxnStatus.COMMITTING  # refused: not gone, not dropped
    assert s.producer.produced == Counter({A0: 3, B0: 1, B1: 1})
    s.producer.behaviour["a"] = "ok"
    s.finalize_now()
    assert s.status(seq) is TxnStatus.COMMITTED
    assert s.producer.produced == Counter({A0: 4, B0: 1, B1: 1})


@pytest.mark.parametrize("how", ["gone", "raise"])
def test_a_marker_for_a_partition_the_cluster_says_is_gone_is_dropped_and_the_txn_ends(how):
    s = Setup({"a": how}, {"a": None, "b": 2})
    seq = s.committing(A0, B0, B1)
    s.finalize_now()
    assert s.status(seq) is TxnStatus.COMMITTED
    assert s.tc.store.low_watermark > seq
    assert s.lookups == Counter({"a": 1})  # confirmed by one lookup
    assert s.producer.produced[B0] == s.producer.produced[B1] == 1


def test_a_gone_error_the_cluster_does_not_confirm_is_retried_not_dropped():
    s = Setup({"a": "raise"}, {"a": 1, "b": 2})
    seq = s.committing(A0, B0)
    s.finalize_now()
    s.finalize_now()
    assert s.status(seq) is TxnStatus.COMMITTING
    assert s.producer.produced[B0] == 1


def test_an_unreported_marker_is_not_produced_again_while_in_flight():
    s = Setup({"a": "silent"}, {"a": 1, "b": 2})
    seq = s.committing(A0, B0)
    s.finalize_now()
    s.finalize_now()
    assert s.status(seq) is TxnStatus.COMMITTING
    assert s.producer.produced == Counter({A0: 1, B0: 1})


def _end(seq: int, commit: bool = False, reason: str | None = None) -> TcRequest:
    return TcRequest(f"end-{seq}-{reason}", "c", -1, TcOp.END, 0, NOW_MS + 60_000, txn_seq=seq,
                     commit=commit, reason=reason)


def test_force_end_is_for_admins_and_a_commit_is_answered_at_its_decision():
    """A commit is answered once its decision is durable (not after its markers, which
    a refusing partition holds back); an END of another request says so (``already``)."""
    s = Setup({"a": "refuse"}, {"a": 1, "b": 2})
    seq = s.committing(A0, B0)
    opener = Caller("anonymous", admin=False)  # new_txn's default owner
    answered = s.handler.handle(s.tc, _end(seq, commit=True), NOW_MS, opener)
    assert answered is not None and answered.error_kind is None and answered.already
    s.finalize_now()
    owner = s.handler.handle(s.tc, _end(seq, reason=FORCE_END), NOW_MS, opener)
    assert owner is not None and owner.error_kind == "NotAuthorizedError"
    assert "force-end" in (owner.error_message or "")
    assert s.status(seq) is TxnStatus.COMMITTING

    reply = s.handler.handle(s.tc, _end(seq, reason=FORCE_END), NOW_MS, Caller("root"))
    assert reply is not None and reply.error_kind is None
    assert s.status(seq) is TxnStatus.COMMITTED
    assert [e.status for e in s.tc.store.unlogged()] == [TxnStatus.COMMITTED]
    s.finalizer.finalize(NOW_MS)
    assert s.replies == []  # nobody waited for the markers
    assert s.tc.store.low_watermark > seq
    produced = s.producer.produced.copy()
    s.finalize_now()
    assert s.producer.produced == produced  # nothing more is written for it


def test_force_end_refuses_an_open_txn():
    s = Setup({}, {"a": 1})
    meta, _ = s.tc.store.new_txn("r", 60_000, NOW_MS)
    reply = s.handler.handle(s.tc, _end(meta.txn_id.least_bits, reason=FORCE_END), NOW_MS,
                             Caller("root"))
    assert reply is not None and reply.error_kind == "InvalidTxnStatusError"
    assert meta.status is TxnStatus.OPEN


def test_add_partitions_refuses_those_that_do_not_exist_naming_them():
    s = Setup({}, {"a": 1})
    meta, _ = s.tc.store.new_txn("r", 60_000, NOW_MS)
    seq = meta.txn_id.least_bits

    def add(*tps: TopicPartition) -> TcReply | None:
        return s.handler.handle(s.tc, TcRequest(f"add-{len(tps)}", "c", -1, TcOp.ADD_PARTITIONS, 0,
                                                NOW_MS + 60_000, txn_seq=seq, partitions=tps),
                                NOW_MS)

    bad = add(A0, TopicPartition("a", 3), TopicPartition("nope", 0))
    assert bad is not None and bad.error_kind == "UnknownPartitionError"  # an InvalidRequestError
    assert "a-3" in (bad.error_message or "") and "nope-0" in (bad.error_message or "")
    assert meta.partitions == set()
    ok = add(A0)
    assert ok is not None and ok.error_kind is None and meta.partitions == {A0}


def test_the_catalog_answers_known_partitions_from_its_cache_and_rate_limits_misses():
    clock = [0.0]
    asked: Counter[str] = Counter()
    counts: dict[str, int | None] = {"a": 2}

    def lookup(topic: str | None) -> dict[str, int | None]:
        asked[str(topic)] += 1
        return dict(counts)

    cat = PartitionCatalog(lookup, refresh_interval_s=1.0, lookups_per_s=3,
                           clock=lambda: clock[0])
    assert cat.missing([A0, TopicPartition("a", 1)]) == []
    assert cat.missing([A0]) == [] and asked == Counter({"a": 1})  # a hit: no lookup
    assert cat.missing([TopicPartition("a", 5)]) == [TopicPartition("a", 5)]
    assert asked["a"] == 1  # looked up less than a second ago: the cache answers
    counts["a"] = 6  # partitions added: seen at the next miss after the interval
    clock[0] = 1.5
    assert cat.missing([TopicPartition("a", 5)]) == []
    assert cat.missing([TopicPartition("x", 0)]) == [TopicPartition("x", 0)]
    assert cat.missing([TopicPartition("y", 0)]) == [TopicPartition("y", 0)]
    with pytest.raises(TooManyRequestsError):  # 4 lookups within one second
        cat.missing([TopicPartition("z", 0)])
    assert not cat.gone(TopicPartition("z", 0))  # over budget: not confirmed
    clock[0] = 3.0
    assert cat.gone(TopicPartition("z", 0)) and not cat.gone(A0)
    # many unknown topics at once: one listing of every topic, not one lookup each
    clock[0] = 5.0
    before = asked.copy()
    many = [TopicPartition(f"t{i}", 0) for i in range(100)]
    counts.update({f"t{i}": 1 for i in range(50)})
    assert cat.missing([*many, A0]) == sorted(many[50:])
    assert asked - before == Counter({"None": 1})


def test_the_catalog_takes_a_topic_it_cannot_look_up_to_exist_and_never_gone():
    def lookup(topic: str | None) -> dict[str, int | None]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    cat = PartitionCatalog(lookup)
    assert cat.missing([A0]) == []
    assert not cat.gone(A0)


def test_add_partitions_to_an_ended_txn_is_refused_for_its_status_not_checked_for_existence():
    s = Setup({}, {"a": 1})
    seq = s.committing(A0)
    reply = s.handler.handle(s.tc, TcRequest("late", "c", -1, TcOp.ADD_PARTITIONS, 0,
                                             NOW_MS + 60_000, txn_seq=seq,
                                             partitions=(TopicPartition("nope", 0),)), NOW_MS)
    assert reply is not None and reply.error_kind == "InvalidTxnStatusError"
    assert s.lookups == Counter()


def test_a_topic_known_not_to_exist_is_answered_from_the_cache_again():
    """Chaos (hostile profile) found it: the second ADD_PARTITIONS naming a deleted topic
    within the refresh interval crashed the handler (int(None)) and restarted the TC."""
    cat = PartitionCatalog(lambda topic: {}, refresh_interval_s=60.0)
    gone = TopicPartition("deleted", 1)
    assert cat.missing([gone]) == [gone]
    assert cat.missing([gone]) == [gone]
    assert cat.count("deleted") is None and cat.gone(gone)


class _Conn:
    def __init__(self) -> None:
        self.sent: list[TcReply] = []

    def send(self, data: bytes) -> None:
        self.sent.append(TcReply.decode(data))


@pytest.mark.parametrize("commit", [True, False])
def test_every_writer_of_a_txn_up_to_the_bound_is_told_how_it_ended(commit):
    """Stop 42's gap: only the last writer's connection was told, and only of an abort.
    Now each connection that wrote (its newest ``MAX_TXN_WATCHERS``) is told either way,
    once, and nothing of the txn's watchers is kept after it ended."""
    from txnstream.coordinator.ownership import MAX_TXN_WATCHERS
    from txnstream.coordinator.protocol import COMMITTED_NOTICE, ENDED_NOTICE

    s = Setup({}, {"a": 1})
    store = s.tc.store
    meta, _ = store.new_txn("r1", 60_000, NOW_MS)
    seq = meta.txn_id.least_bits
    store.add_partitions(seq, (A0,), NOW_MS)
    conns = [_Conn() for _ in range(MAX_TXN_WATCHERS + 36)]
    for c in conns:
        s.tc.watch(seq, c)
    s.tc.watch(seq, conns[0])  # wrote again: among the newest now
    store.end_txn(seq, commit, NOW_MS)
    store.unlogged()
    s.finalize_now()
    assert s.status(seq) is (TxnStatus.COMMITTED if commit else TxnStatus.ABORTED)
    told = [c for c in conns if c.sent]
    assert told == [conns[0], *conns[-(MAX_TXN_WATCHERS - 1):]]
    prefix = COMMITTED_NOTICE if commit else ENDED_NOTICE
    assert all(len(c.sent) == 1 and c.sent[0].request_id == f"{prefix}{seq}"
               and c.sent[0].txn_seq == seq for c in told)
    assert all(c.sent[0].error_kind is None for c in told) == commit
    assert seq not in s.tc.watchers
