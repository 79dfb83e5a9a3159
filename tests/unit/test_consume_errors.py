"""Every consume loop of the buffer and Spark source classifies consumed errors through
``txnstream.errors.message_error``: logged or raised, never dropped. No broker: fake
consumers stand in for confluent-kafka's."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from txnstream.buffer import TransactionBuffer, take_snapshot
from txnstream.config import Config
from txnstream.errors import KafkaClientError
from txnstream.markers import TXN_ID_HEADER, MarkerKind, TxnMarker
from txnstream.types import TopicPartition, TxnID

CONFIG = Config(bootstrap_servers="127.0.0.1:1")
TP = TopicPartition("data", 0)


def denied(**flags) -> KafkaError:
    return KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied-by-acl", **flags)


class Rec:
    """A consumed record or error, as confluent-kafka's ``Message`` shows it."""

    def __init__(self, offset: int = -1, headers=None, value: bytes | None = b"v",
                 key: bytes | None = None, err: KafkaError | None = None,
                 topic: str = TP.topic, partition: int = TP.partition) -> None:
        self._o, self._h, self._v, self._k, self._e = offset, headers, value, key, err
        self._t, self._p = topic, partition

    def error(self):
        return self._e

    def offset(self):
        return self._o

    def headers(self):
        return self._h

    def value(self):
        return self._v

    def key(self):
        return self._k

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def timestamp(self):
        return (1, 1_000)


class FakeConsumer:
    """Hands out the scripted records, then nothing."""

    script: list[Rec] = []
    """What a reader (or the buffer worker's data consumer) gets."""
    group_script: list[Rec] = []
    """What the buffer worker's group consumer (on the buffer-state topic) gets."""
    made: list[FakeConsumer] = []

    def __init__(self, conf) -> None:
        cid = str(conf.get("client.id", ""))
        self.role = ("data" if cid.startswith("tb-data") else "registry"
                     if cid.startswith("tb-reg") else "group" if cid.startswith("tb-")
                     else "reader")
        self.queue = {"group": list(type(self).group_script), "registry": []}.get(
            self.role, list(type(self).script))
        self.callbacks: dict = {}
        self.closed = False
        type(self).made.append(self)

    def incremental_assign(self, parts):
        pass

    def incremental_unassign(self, parts):
        pass

    def assignment(self):
        return []

    def list_topics(self, topic=None, timeout=None):
        return SimpleNamespace(topics={TP.topic: SimpleNamespace(error=None, partitions={0: 0})})

    def get_watermark_offsets(self, ktp, timeout=None, cached=False):
        return 0, 1 + max((r.offset() for r in type(self).script), default=-1)

    def offsets_for_times(self, parts, timeout=None):  # ListOffsets: -2 start, -1 end
        end = self.get_watermark_offsets(None)[1]
        return [SimpleNamespace(topic=p.topic, partition=p.partition, error=None,
                                offset=0 if p.offset == -2 else end) for p in parts]

    def assign(self, parts):
        pass

    def unassign(self):
        pass

    def subscribe(self, topics, **callbacks):
        self.callbacks = callbacks

    def consume(self, n=1, timeout=None):
        if "on_assign" in self.callbacks:  # a group member: first the assignment
            from confluent_kafka import TopicPartition as KafkaTP

            cb, self.callbacks = self.callbacks.pop("on_assign"), {}
            cb(self, [KafkaTP(TP.topic, TP.partition)])
        out, self.queue = self.queue[:n], self.queue[n:]
        if not out:
            time.sleep(min(timeout or 0, 0.01))
        return out

    def poll(self, timeout=None):
        out = self.consume(1, timeout)
        return out[0] if out else None

    def close(self):
        self.closed = True


@pytest.fixture
def fake_consumer(monkeypatch):
    import txnstream.buffer.follower as follower
    import txnstream.buffer.snapshot_store as snapshot_store

    FakeConsumer.made = []  # the buffer worker's consumers come from FakeKafka
    for mod in (follower, snapshot_store):
        monkeypatch.setattr(mod, "Consumer", FakeConsumer)
    return FakeConsumer


def _records() -> list[Rec]:
    t = TxnID(0, 1)
    m = TxnMarker(t, MarkerKind.COMMIT, 0)
    return [Rec(0, [(TXN_ID_HEADER, t.to_bytes())]), Rec(1, m.headers(), m.encode()),
            Rec(2, None)]


# ------------------------------------------------------------------ snapshot store

def _snapshot_record(offset: int) -> Rec:
    buf = TransactionBuffer(TP)
    buf.fold(0, None)
    return Rec(offset, None, take_snapshot(buf).encode(), key=str(TP).encode())


def test_snapshot_store_logs_a_consumed_error_and_still_finds_the_snapshot(
        fake_consumer, caplog):
    from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

    fake_consumer.script = [Rec(err=denied(retriable=True)), _snapshot_record(0)]
    store = TransactionBufferSnapshotStore(CONFIG)
    store._partitions = 1
    snap = store.latest(TP)
    assert snap is not None and snap.position == 0
    assert any(r.levelno == logging.WARNING and "denied-by-acl" in r.getMessage()
               for r in caplog.records), caplog.text


def test_snapshot_store_raises_on_a_fatal_consumed_error(fake_consumer):
    from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

    fake_consumer.script = [Rec(err=denied(fatal=True)), _snapshot_record(0)]
    store = TransactionBufferSnapshotStore(CONFIG)
    store._partitions = 1
    with pytest.raises(KafkaClientError, match="denied-by-acl"):
        store.latest(TP)


# ----------------------------------------------------------- buffer state follower

def test_buffer_state_follower_logs_consumed_errors_and_raises_on_a_fatal_one(
        fake_consumer, caplog):
    from txnstream.buffer.follower import BufferStateFollower

    follower = BufferStateFollower(CONFIG)
    follower._apply(Rec(err=denied(retriable=True)))
    assert any(r.levelno == logging.WARNING and "denied-by-acl" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(KafkaClientError, match="denied-by-acl"):
        follower._apply(Rec(err=denied(fatal=True)))


# ---------------------------------------------------------------------- buffer worker

class FakeStore:
    """Snapshot store whose first ``fail`` publishes raise, as a broker refusing them.

    ``TP`` is registered in slot 0, with no snapshot yet.
    """

    topic = "snapshots"

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.attempts = 0
        self.published: list = []

    def scan_slot(self, slot, stop=None):
        from txnstream.buffer.snapshot_store import LatestSnapshotFinder, SlotScan

        scan = SlotScan()
        scan.finders[TP] = LatestSnapshotFinder(TP)
        scan.finders[TP].registered = True
        return scan, 0

    def take_failed(self):
        return set()

    def publish(self, snap, tp):
        self.attempts += 1
        if self.attempts <= self.fail:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "injected"))
        self.published.append(snap)

    def flush(self, timeout_s=10.0):
        pass

    def close(self, timeout_s=10.0):
        pass


class FakeProducer:
    """Delivers every record at once, at the next offset."""

    def __init__(self, conf) -> None:
        self.offset = -1

    def produce(self, topic, value=None, key=None, partition=None, on_delivery=None,
                headers=None):
        self.offset += 1
        if on_delivery is not None:
            on_delivery(None, SimpleNamespace(offset=lambda at=self.offset: at))

    def flush(self, *a):
        return 0

    def poll(self, *a):
        return 0


class FakeKafka:
    """The buffer worker's client factory: these fakes, no admin client."""

    def consumer(self, conf):
        return FakeConsumer(conf)

    def producer(self, conf):
        return FakeProducer(conf)

    def admin(self, conf):
        raise AssertionError("the buffer worker makes no admin client")


def _worker(store):
    from txnstream.buffer.worker import BufferWorker

    # unsigned: these fakes have no cluster id to make the marker key with
    return BufferWorker(CONFIG, [TP.topic], snapshot_interval_s=0.05,
                        lwm_check_interval_s=3600, kafka=FakeKafka(), store=store,
                        unsigned=True)


def _wait(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not cond():
        time.sleep(0.02)
    return cond()


def test_buffer_worker_survives_failed_snapshot_publishes_and_retries_them(
        fake_consumer, monkeypatch):
    fake_consumer.script = _records()
    store = FakeStore(fail=3)
    bw = _worker(store).start()
    try:
        assert _wait(lambda: store.published), "no snapshot after the failures"
        assert bw._thread.is_alive(), "the buffer worker died on a publish failure"
        assert store.attempts > 3 and store.published[-1].position == 2
    finally:
        bw.stop()


def test_buffer_worker_renews_its_consumer_after_a_fatal_consumer_error(
        fake_consumer, monkeypatch, caplog):
    fake_consumer.group_script = [Rec(err=denied(fatal=True))]
    bw = _worker(FakeStore(fail=0)).start()

    def groups():
        return [c for c in fake_consumer.made if c.role == "group"]

    try:
        assert _wait(lambda: len(groups()) >= 2), \
            "a consumer with a fatal error was kept (it can never consume again)"
        # the worker's thread closes the old one just after it made the new one
        assert _wait(lambda: groups()[0].closed), "the failed consumer was never closed"
        assert bw._thread.is_alive()
        assert "denied-by-acl" in caplog.text
    finally:
        fake_consumer.group_script = []
        bw.stop()


def test_buffer_worker_logs_consumed_errors(fake_consumer, monkeypatch, caplog):
    fake_consumer.script = [Rec(err=denied(retriable=True)), *_records()]
    store = FakeStore(fail=0)
    bw = _worker(store).start()
    try:
        assert _wait(lambda: store.published and store.published[-1].position == 2)
        assert any(r.levelno == logging.WARNING and "denied-by-acl" in r.getMessage()
                   for r in caplog.records)
    finally:
        bw.stop()


def test_an_unsigned_buffer_worker_says_so_at_start(fake_consumer, caplog):
    caplog.set_level(logging.WARNING)
    bw = _worker(FakeStore(fail=0)).start()
    try:
        assert _wait(lambda: any("not signed" in r.getMessage() and "--unsigned" in
                                 r.getMessage() for r in caplog.records)), caplog.text
    finally:
        bw.stop()


# ---------------------------------------------------------------------- spark source

def test_spark_rows_log_a_consumed_error_and_raise_on_a_fatal_one(caplog):
    pytest.importorskip("pyspark")
    from txnstream_spark.planner import TxnStreamPartition
    from txnstream_spark.task import _Rows

    p = TxnStreamPartition(CONFIG, TP.topic, TP.partition, 0, 3, [])
    rows = _Rows(p, None)
    assert rows.add([Rec(0, None), Rec(err=denied(retriable=True)), Rec(1, None)], 0) == 2
    assert len(rows) == 2
    assert any(r.levelno == logging.WARNING and "denied-by-acl" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(KafkaClientError, match="denied-by-acl"):
        rows.add([Rec(err=denied(fatal=True)), Rec(2, None)], 2)

