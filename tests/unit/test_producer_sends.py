"""``Producer``'s transactional sends, with no broker: each property the fast path keeps.

A fake librdkafka holds every produced record until ``poll()``/``flush()`` delivers it
(or fails it, for a chosen partition); the transaction is the real ``Transaction`` with a
coordinator that answers at once, so its ``sending()`` guard and flushers are the real ones.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

import txnstream.producer as prod
from txnstream import Config
from txnstream.errors import ConfigError, InvalidTxnStatusError, TxnStreamError
from txnstream.markers import TXN_ID_HEADER
from txnstream.transaction import Transaction
from txnstream.types import TopicPartition, TxnID, TxnStatus

PARTITIONS = 4


class FakeKafka:
    """confluent-kafka's Producer: records wait in ``pending`` until a poll delivers them."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.pending: list[tuple[dict[str, Any], Any]] = []
        self.produced: list[dict[str, Any]] = []
        self.fail_partition: int | None = None
        self.deliver = True
        self.queue_full = 0
        """The next this many produce() calls raise BufferError."""
        self.offsets: dict[int, int] = {}
        """Partition -> the offset of its latest delivered record."""

    def list_topics(self, topic: str, timeout: float) -> Any:
        t = SimpleNamespace(error=None, partitions=dict.fromkeys(range(PARTITIONS)))
        return SimpleNamespace(topics={topic: t})

    def produce(self, topic: str, value: Any, key: Any = None, *, partition: int,
                headers: Any = None, on_delivery: Any = None) -> None:
        if self.queue_full:
            self.queue_full -= 1
            raise BufferError("Local: Queue full")
        record = {"topic": topic, "value": value, "key": key, "partition": partition,
                  "headers": list(headers) if headers else None}
        self.produced.append(record)
        if on_delivery is not None:
            self.pending.append((record, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        if not self.deliver:
            return 0
        done, self.pending = self.pending, []
        for record, on_delivery in done:
            err = "Broker: Not leader" if record["partition"] == self.fail_partition else None
            self.offsets[record["partition"]] = at = self.offsets.get(record["partition"], -1) + 1
            on_delivery(err, SimpleNamespace(partition=lambda r=record: r["partition"],
                                             offset=lambda at=at: at))
        return len(done)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


class FakeTC:
    """A coordinator that answers every request at once and records the registrations."""

    def __init__(self) -> None:
        self.registered: list[TopicPartition] = []

    def request(self, op: Any, tc_id: int, **fields: Any) -> Any:
        self.registered.extend(fields.get("partitions", ()))
        return SimpleNamespace(already=False)  # END: decided by this request


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> prod.Producer:
    monkeypatch.setattr(prod, "KafkaProducer", FakeKafka)
    return prod.Producer(Config(bootstrap_servers="127.0.0.1:1"), "out")


@pytest.fixture
def tc() -> FakeTC:
    return FakeTC()


_seq = iter(range(1, 1_000_000))


def new_txn(tc: FakeTC) -> Transaction:
    return Transaction(tc, TxnID(0, next(_seq)), 60.0)  # type: ignore[arg-type]


def kafka(producer: prod.Producer) -> FakeKafka:
    return producer._kafka  # type: ignore[return-value]


def test_every_record_carries_its_txns_id_and_the_users_headers(producer, tc):
    t1, t2 = new_txn(tc), new_txn(tc)
    producer.send(b"a", txn=t1, partition=0)
    producer.send(b"b", txn=t2, partition=0, headers=[("h", b"1")])
    producer.send_batch([b"c"], [1], t1)
    producer.send(b"d", partition=0, headers=[("h", b"2")])
    assert [r["headers"] for r in kafka(producer).produced] == [
        [(TXN_ID_HEADER, t1.id.to_bytes())],
        [("h", b"1"), (TXN_ID_HEADER, t2.id.to_bytes())],
        [(TXN_ID_HEADER, t1.id.to_bytes())],
        [("h", b"2")]]


def test_a_partition_is_registered_once_per_txn(producer, tc):
    t1, t2 = new_txn(tc), new_txn(tc)
    for i in range(10):
        producer.send(b"v", txn=t1, partition=i % 2)
    producer.send_batch([b"v"] * 3, [0, 1, 2], t1)
    producer.send(b"v", txn=t2, partition=1)
    assert tc.registered == [TopicPartition("out", p) for p in (0, 1, 2, 1)]


@pytest.mark.parametrize("headers", [[("txn.id", b"x")], [("ok", b"1"), ("txn.marker", b"")]])
def test_reserved_headers_are_refused_before_anything_is_sent(producer, tc, headers):
    t = new_txn(tc)
    for txn in (t, None):
        with pytest.raises(ConfigError, match="reserved for txnstream"):
            producer.send(b"v", txn=txn, partition=0, headers=headers)
    assert kafka(producer).produced == [] and tc.registered == []


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_a_send_to_an_ended_txn_raises_and_writes_nothing(producer, tc, end):
    t = new_txn(tc)
    producer.send(b"in", txn=t, partition=0)  # the partition is known: the cheap path
    getattr(t, end)()
    written = len(kafka(producer).produced)
    for send in (lambda: producer.send(b"late", txn=t, partition=0),
                 lambda: producer.send(b"late", txn=t, partition=3),
                 lambda: producer.send_batch([b"late"], [0], t)):
        with pytest.raises(InvalidTxnStatusError, match="cannot produce"):
            send()
    assert len(kafka(producer).produced) == written
    assert producer.tracked_txns() == 0


def test_commit_waits_for_its_own_sends_and_only_those(producer, tc):
    fake = kafka(producer)
    t1, t2 = new_txn(tc), new_txn(tc)
    for i in range(3):
        producer.send(b"1", txn=t1, partition=i)
    producer.send_batch([b"2"] * 5, [0, 1, 2, 3, 0], t2)
    fake.deliver = False
    with pytest.raises(TxnStreamError, match="8 sends|3 sends"):
        producer.flush_transaction(t1, timeout_s=0.05)
    fake.deliver = True
    t1.commit()  # delivers everything pending, waits until t1's three are acknowledged
    assert t1.status is TxnStatus.COMMITTED
    producer.send(b"2", txn=t2, partition=1)
    fake.deliver = False
    with pytest.raises(TxnStreamError, match="1 sends of"):
        producer.flush_transaction(t2, timeout_s=0.05)  # t1's commit did not wait for it
    fake.deliver = True
    t2.commit()
    assert producer.tracked_txns() == 0 and fake.pending == []


def test_a_failed_delivery_makes_the_txn_abort_only_naming_the_partition(producer, tc):
    fake = kafka(producer)
    fake.fail_partition = 2
    bad, good = new_txn(tc), new_txn(tc)
    for p in range(PARTITIONS):
        producer.send(b"v", txn=bad, partition=p)
        producer.send(b"v", txn=good, partition=(p + 1) % 2)
    with pytest.raises(TxnStreamError, match="aborted instead of committed.*send to out-2 failed"):
        bad.commit()
    assert bad.status is TxnStatus.ABORTED
    good.commit()
    assert good.status is TxnStatus.COMMITTED


def test_a_failed_batch_delivery_too(producer, tc):
    kafka(producer).fail_partition = 3
    t = new_txn(tc)
    producer.send_batch([b"v"] * 4, [0, 1, 2, 3], t)
    with pytest.raises(TxnStreamError, match="send to out-3 failed"):
        t.commit()


def test_a_send_that_never_reached_librdkafka_is_not_waited_for(producer, tc, monkeypatch):
    monkeypatch.setattr(prod, "QUEUE_FULL_TIMEOUT_S", 0.0)
    fake = kafka(producer)
    t = new_txn(tc)
    producer.send(b"ok", txn=t, partition=0)
    fake.queue_full = 3
    with pytest.raises(BufferError):
        producer.send(b"lost", txn=t, partition=0)
    fake.queue_full = 0
    t.commit()
    assert [r["value"] for r in fake.produced] == [b"ok"]


def test_a_batch_interrupted_midway_counts_only_what_was_handed_over(producer, tc):
    fake = kafka(producer)
    t = new_txn(tc)
    real = fake.produce
    calls = 0

    def produce(*a: Any, **kw: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt
        real(*a, **kw)

    fake.produce = produce  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        producer.send_batch([b"v"] * 5, [0] * 5, t)
    fake.produce = real  # type: ignore[method-assign]
    producer.flush_transaction(t, timeout_s=1.0)  # raises if it waited for 5
    t.commit()
    assert len(fake.produced) == 2


def test_bookkeeping_ends_with_the_txns_even_those_never_flushed(producer, tc):
    for i in range(200):
        t = new_txn(tc)
        producer.send(b"v", txn=t, partition=i % PARTITIONS)
        producer.send_batch([b"a", b"b"], [0, 1], t)
        if i % 3 == 0:
            t.commit()
        elif i % 3 == 1:
            t.abort()
        kafka(producer).poll()  # the third kind is abandoned, all acknowledged
    producer.send(b"v", txn=new_txn(tc), partition=0)  # a new txn's first send sweeps
    assert producer.tracked_txns() == 1


def test_many_threads_sending_in_one_txn_are_all_waited_for(producer, tc):
    fake = kafka(producer)
    t = new_txn(tc)
    lock = threading.Lock()
    real_poll = fake.poll

    def poll(timeout: float = 0) -> int:  # delivery from the senders' threads too
        with lock:
            return real_poll(timeout)

    fake.poll = poll  # type: ignore[method-assign]

    def sender(n: int) -> None:
        for i in range(n):
            producer.send(b"v", txn=t, partition=i % PARTITIONS)

    threads = [threading.Thread(target=sender, args=(700,)) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.commit()
    assert len(fake.produced) == 2800 and fake.pending == []
    assert producer.tracked_txns() == 0


def test_commit_does_not_wait_out_linger_ms():
    """As Kafka's commitTransaction() flushes: librdkafka sends what it holds back for
    ``linger.ms`` at once while a commit waits (its in-process mock cluster acks here)."""
    import time

    p = prod.Producer(Config(bootstrap_servers="127.0.0.1:1", kafka={"log_level": 0}), "t",
                      **{"test.mock.num.brokers": 1, "linger.ms": 3000})
    t = new_txn(FakeTC())
    p.send(b"v", txn=t, partition=0)
    t0 = time.monotonic()
    t.commit()
    assert time.monotonic() - t0 < 2.0
    assert t.status is TxnStatus.COMMITTED
    p.close()
