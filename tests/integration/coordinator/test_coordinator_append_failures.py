"""A coordinator whose log append fails must not answer: real failures, real broker.

The failures are real: the log topic's ``max.message.bytes`` is lowered so that one
request's record is refused by the broker (``MSG_SIZE_TOO_LARGE``), or the worker's own
producer reports one record undelivered. The property checked is DESIGN.md section 5's
"acknowledge a client only after its record read back as valid": every reply a client
got must be backed by the log, and no TxnID is handed out twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from tests.integration.coordinator.conftest import (
    FAST_FAILOVER_MS,
    make_topic,
    read_all,
    replay_log,
    restarts,
    set_topic_config,
    wait_until,
)
from txnstream import Client, Config, TopicPartition, TxnStatus
from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import RequestTimeoutError
from txnstream.kafka.clients import ConfluentKafka
from txnstream.markers import MarkerKind, RecordKind, TxnMarker, classify_headers

pytestmark = pytest.mark.integration

LOG_LIMIT = 4096
"""``max.message.bytes`` of the log topic in these tests: every ordinary record (well
under 1 KB) fits, a record carrying an 8 KB group key or 100 long partition names not."""


@pytest.fixture
def small_log_worker(own_config: Config) -> Iterator[tuple[CoordinatorWorker, Client]]:
    """A worker and a client on topics of their own whose log refuses big records."""
    set_topic_config(own_config, own_config.topics.log, {"max.message.bytes": str(LOG_LIMIT)})
    w = CoordinatorWorker(own_config, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    w.start()
    client = Client(config=own_config)
    try:
        wait_until(lambda: len(w.serving()) == own_config.num_coordinators, 60, "worker serving")
        yield w, client
    finally:
        client.close()
        w.stop()


def test_new_whose_open_record_was_refused_gets_no_reply_and_no_txn_id_repeats(
        own_config, small_log_worker):
    w, client = small_log_worker
    tc = 0
    handed: list[int] = []
    # The OPEN record carries the group key: 8 KB, refused by the log (4 KB limit).
    try:
        r = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000, group_key="k" * 8_000,
                              timeout_s=7)
        handed.append(r.txn_seq)
    except RequestTimeoutError:
        pass
    wait_until(lambda: tc in w.serving(), 60, "the TC serving again")
    handed += [client.tc.request(TcOp.NEW, tc, timeout_ms=60_000).txn_seq for _ in range(3)]
    in_log = replay_log(own_config, tc).txns
    assert len(handed) == len(set(handed)), f"a TxnID was handed out twice: {handed}"
    missing = [s for s in handed if s not in in_log or in_log[s].status is not TxnStatus.OPEN]
    assert not missing, f"replied with TxnIDs whose OPEN record is not in the log: {missing}"
    assert len(handed) == 3, "the refused NEW must not have been answered"
    # The worker read the refused request again after each replay, until its deadline:
    # the backoff between replays keeps that from being a tight restart loop.
    replays = restarts(client, tc)
    assert 1 <= replays <= 8, f"{replays} replays of TC {tc} in about 10 s"


def test_add_partitions_whose_record_was_refused_gets_no_ok_reply(own_config,
                                                                   small_log_worker):
    w, client = small_log_worker
    tc = 1
    seq = client.tc.request(TcOp.NEW, tc, timeout_ms=60_000).txn_seq
    # Real partitions (ADD_PARTITIONS refuses ones that do not exist): 100 of a topic with
    # a long name make a record past the log's limit.
    wide = make_topic(own_config, 100, prefix=f"wide-{'x' * 40}")
    many = tuple(TopicPartition(wide, i) for i in range(100))
    told_ok = True
    try:
        client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=seq, partitions=many, timeout_s=7)
    except RequestTimeoutError:
        told_ok = False
    wait_until(lambda: tc in w.serving(), 60, "the TC serving again")
    logged = replay_log(own_config, tc).txns[seq].partitions
    # An ok reply means "registered": commit would write a marker to each. One missing
    # from the log gets no marker after a failover, and the txn commits partially.
    if told_ok:
        lost = set(many) - logged
        assert not lost, f"{len(lost)} registered partitions not in the log"
    assert not told_ok, "the refused ADD_PARTITIONS must not have been answered ok"
    # the TC serves on, and what it says is in its log
    small = TopicPartition(make_topic(own_config, 1, prefix="small"), 0)
    client.tc.request(TcOp.ADD_PARTITIONS, tc, txn_seq=seq, partitions=(small,))
    assert small in replay_log(own_config, tc).txns[seq].partitions


class _FailOnce:
    """The worker's producer, except that the first record matching ``match`` is reported
    undelivered (as librdkafka reports a record it gave up on) and never written."""

    def __init__(self, real: Any, match: Callable[[str, bytes], bool]) -> None:
        self.real = real
        self.match = match
        self.failed: list[bytes] = []
        self._due: list[Callable[..., None]] = []

    def produce(self, topic: str, value: bytes | None = None, *args: Any,
                on_delivery: Callable[..., None] | None = None, **kw: Any) -> None:
        if on_delivery is not None and not self.failed and value is not None \
                and self.match(topic, value):
            self.failed.append(value)
            self._due.append(on_delivery)
            return
        self.real.produce(topic, value, *args, on_delivery=on_delivery, **kw)

    def _fire(self) -> None:
        due, self._due = self._due, []
        for cb in due:
            cb(KafkaError(KafkaError._MSG_TIMED_OUT), None)

    def poll(self, timeout: float = 0) -> int:
        n = self.real.poll(timeout)
        self._fire()
        return n

    def flush(self, timeout: float = -1) -> int:
        n = self.real.flush(timeout)
        self._fire()
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _FailOnceKafka(ConfluentKafka):
    """The real Kafka clients, the producer wrapped in :class:`_FailOnce`."""

    def __init__(self, match: Callable[[str, bytes], bool]) -> None:
        self.match = match
        self.made: list[_FailOnce] = []

    def producer(self, conf: dict[str, Any]) -> Any:
        self.made.append(_FailOnce(super().producer(conf), self.match))
        return self.made[-1]


def test_lost_committed_record_replays_the_tc_which_finishes_the_commit(config, client):
    """The COMMITTED record is appended without waiting; if it is lost, the TC must be
    rebuilt from its log (which says COMMITTING) and finish the commit again."""
    topic = make_topic(config, 1)
    tc = config.num_coordinators - 1

    def committed_record(t: str, value: bytes) -> bool:
        if t != config.topics.log:
            return False
        e = TransactionLogEntry.decode(value)
        return e.kind is LogEntryKind.TXN and e.status is TxnStatus.COMMITTED

    kafka = _FailOnceKafka(committed_record)
    w = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS),
                          kafka=kafka)
    [producer] = kafka.made
    w.start()
    try:
        wait_until(lambda: tc in w.serving(), 60, "worker serving")
        txn = client.new_transaction(timeout_s=60, tc_id=tc)
        txn.register_partitions([TopicPartition(topic, 0)])
        client.tc.request(TcOp.END, tc, txn_seq=txn.id.least_bits, commit=True)
        # the COMMITTED record is appended after the reply (without waiting): wait for it
        wait_until(lambda: bool(producer.failed), 30, "the COMMITTED record's append")
        assert producer.failed, "the COMMITTED record was not the one refused"
        wait_until(lambda: replay_log(config, tc).txns[txn.id.least_bits].status
                   is TxnStatus.COMMITTED, 60, "COMMITTED in the log after the replay")
        wait_until(lambda: tc in w.serving(), 60, "the TC serving again")
        kinds = {TxnMarker.decode(m.value()).kind for m in read_all(config, topic)
                 if classify_headers(m.headers()) == (RecordKind.MARKER, txn.id)}
        assert kinds == {MarkerKind.COMMIT}
        fresh = [client.tc.request(TcOp.NEW, tc, timeout_ms=60_000).txn_seq for _ in range(3)]
        assert len(set(fresh)) == 3 and min(fresh) > txn.id.least_bits
        assert restarts(client, tc) >= 1, "the TC was not rebuilt from its log"
    finally:
        w.stop()
