"""Coordinator workers for integration tests: in-process threads and real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txnstream import Client, Config
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker

TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))
FAST_FAILOVER_MS = 6_000
"""Session timeout for fault tests: failover in ~6 s keeps the tests short."""


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def markers_written(client: Client, txn_id: object, timeout_s: float = 15.0) -> None:
    """Wait until the coordinator has written ``txn_id``'s markers (COMMITTED or ABORTED
    there), for a test that lays out a partition's offsets around a marker. A commit is
    answered once its decision is durable, before its markers land (Kafka's order), so
    a later txn's record may otherwise precede them."""
    wait_until(lambda: client.admin.get_transaction(txn_id).status.is_final, timeout_s,
               f"the markers of {txn_id} written")


@pytest.fixture
def worker(config: Config) -> Iterator[CoordinatorWorker]:
    """One in-process worker serving every coordinator."""
    w = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    w.start()
    assert w.buffers is not None
    buffers = w.buffers
    try:
        wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
        wait_until(lambda: len(buffers.owned_slots()) == config.num_buffer_slots, 60,
                   "worker serving every buffer slot")
        yield w
    finally:
        w.stop()


@pytest.fixture
def tc_worker(config: Config) -> Iterator[CoordinatorWorker]:
    """One in-process worker serving every coordinator and no buffer role (a test runs
    its own :class:`~txnstream.buffer.worker.BufferWorker`)."""
    w = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS,
                                                          buffer_role=False))
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
        yield w
    finally:
        w.stop()


@pytest.fixture
def client(config: Config) -> Iterator[Client]:
    c = Client(config=config)
    try:
        yield c
    finally:
        c.close()


class WorkerProcs:
    """Real ``txnstream worker`` processes, killed (by pid) at teardown whatever happens."""

    def __init__(self, config: Config, log_dir: Path) -> None:
        self.config = config
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")
        p = subprocess.Popen(
            [TXNSTREAM_BIN, "--bootstrap", self.config.bootstrap_servers, "worker",
             "--prefix", self.config.topics.prefix, "--id", name,
             "--session-timeout-ms", str(FAST_FAILOVER_MS)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)


@pytest.fixture
def worker_procs(config: Config, tmp_path: Path) -> Iterator[WorkerProcs]:
    procs = WorkerProcs(config, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def owners(client: Client) -> dict[int, str | None]:
    """TC id -> owner id, from the coordinators' own stats."""
    return {s.tc_id: s.owner_id for s in client.admin.coordinator_stats()}


def make_topic(config: Config, partitions: int, prefix: str = "data",
               topic_config: dict[str, str] | None = None) -> str:
    """A fresh data topic for one test (``topic_config``: its topic-level settings)."""
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(config.admin())
    new = NewTopic(name, partitions, config.replication_factor, config=topic_config or {})
    for f in admin.create_topics([new]).values():
        f.result(30)
    wait_until(lambda: name in admin.list_topics(timeout=5).topics, 30, f"topic {name}")
    return name


def delete_topic(config: Config, topic: str) -> None:
    """Delete ``topic`` and wait until the broker no longer lists it."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(config.admin())
    for f in admin.delete_topics([topic], operation_timeout=30).values():
        f.result(30)
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, 30,
               f"{topic} deleted")


def create_topic_again(config: Config, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` (just deleted: retried while the broker still removes it)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config.admin())
    deadline = time.monotonic() + 60
    while True:
        try:
            for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                f.result(30)
            break
        except Exception:  # still being deleted
            assert time.monotonic() < deadline, f"{topic} not recreated"
            time.sleep(0.5)
    wait_until(lambda: topic in admin.list_topics(timeout=5).topics, 30, f"{topic} created")


def read_all(config: Config, topic: str, timeout_s: float = 30.0) -> list:
    """Every record of ``topic`` up to its current end, as confluent-kafka Messages."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(config.consumer(f"reader-{uuid.uuid4().hex[:8]}"))
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in meta.partitions}
        c.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        out = []
        pos = {p: 0 for p in ends}
        deadline = time.monotonic() + timeout_s
        while any(pos[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:  # offsets are not dense (control records, compaction)
                for at in c.position([TopicPartition(topic, p) for p in ends]):
                    pos[at.partition] = max(pos[at.partition], at.offset)
                continue
            if m.error():
                continue
            out.append(m)
            pos[m.partition()] = m.offset() + 1
        assert all(pos[p] >= ends[p] for p in ends), f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def set_topic_config(config: Config, topic: str, values: dict[str, str]) -> None:
    """Change settings of ``topic`` (incrementally: the others stay as they are), and wait
    until the broker reports them.

    The controller accepts a change before the broker applies it (KRaft hands it on in
    the metadata log): under a loaded run, a record appended right after the change was
    still judged by the old ``max.message.bytes``.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient(config.admin())
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in values.items()])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)

    def applied() -> bool:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        try:
            entries = next(iter(described.values())).result(30)
        except KafkaException as exc:  # a topic just made: the broker may not know it yet
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return False
            raise
        return all(entries[k].value == v for k, v in values.items())

    wait_until(applied, 30, f"the broker applying {values} to {topic}")


def log_records(config: Config, tc_id: int, timeout_s: float = 30.0) -> list:
    """Every record of ``__txn_log[tc_id]`` now in the log, as confluent-kafka Messages.

    The worker may truncate the log while it is read: a record deleted meanwhile is
    skipped (the position moves up to the new log start), as a replay would skip it.
    """
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    tp = TopicPartition(config.topics.log, tc_id)
    c = Consumer(config.consumer(f"reader-{uuid.uuid4().hex[:8]}"))
    try:
        low, end = c.get_watermark_offsets(tp, timeout=10)
        c.assign([TopicPartition(config.topics.log, tc_id, low)])
        out: list = []
        pos = low
        deadline = time.monotonic() + timeout_s
        while pos < end and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                pos = max(pos, c.get_watermark_offsets(tp, timeout=10)[0])
                continue
            if m.error():
                continue
            out.append(m)
            pos = m.offset() + 1
        assert pos >= end, f"could not read {tp.topic}[{tc_id}] to its end"
        return out
    finally:
        c.close()


def replay_log(config: Config, tc_id: int) -> TransactionMetadataStore:
    """What a new owner of TC ``tc_id`` would rebuild from its log right now."""
    from txnstream.coordinator.log_entry import TransactionLogEntry
    from txnstream.errors import CorruptRecordError

    store = TransactionMetadataStore(tc_id, "test-reader")
    for m in log_records(config, tc_id):
        try:
            entry = TransactionLogEntry.decode(m.value())
        except CorruptRecordError:
            continue
        store.replay(m.offset(), entry)
    return store



def restarts(client: Client, tc_id: int) -> int:
    """How often the worker serving TC ``tc_id`` replayed it after a failure."""
    return {s.tc_id: s.stats for s in client.admin.coordinator_stats()}[tc_id]["restarts"]


def fill(client: Client, topic: str, n: int, partitions: int = 1) -> None:
    """``n`` plain records ``m0``.. ``m{n-1}`` to ``topic``, record i to partition
    ``i % partitions``."""
    p = client.create_producer(topic)
    for i in range(n):
        p.send(f"m{i}".encode(), partition=i % partitions)
    p.flush()


def receive_n(consumer, n: int, timeout_s: float = 8.0) -> list:
    """Exactly ``n`` messages from ``consumer``; fails naming how many came."""
    out = []
    while len(out) < n:
        m = consumer.receive(timeout_s=timeout_s)
        assert m is not None, f"only {len(out)} of {n} delivered"
        out.append(m)
    return out
