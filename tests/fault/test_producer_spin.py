"""A data producer's batches waiting on a broker that does not answer cost no CPU.

librdkafka's idempotent producer polls with a zero timeout for as long as a partition has
records ready to send and five or more in flight (``rd_kafka_toppar_producer_serve``: the
batch-ready wakeup is set before the per-partition in-flight limit is checked), unless
another request waits in the connection's queue. Batches queued behind a request of five
or more records made the handle's broker thread burn a core until the answer came: a
broker paused for seconds cost each such producer a core for seconds, and on a machine
the broker shares, the spinning clients and workers kept it from answering (a run at a
tenth of its rate). A data producer now has one request in flight per connection
(``txnstream.producer.DATA_IN_FLIGHT``), so the next waits in the queue and the thread
sleeps, on a topic of several partitions per broker. On a topic of one partition there
is nothing else to queue and librdkafka may still spin, depending on how many records
the request in flight carries when the broker stops answering (it did in one run, not in
the next): that case is librdkafka's, is not this test's property, and is described in
docs/architecture.md "Native code" and docs/upstream-librdkafka-spin.md.

The broker here is a real one of the test's own, paused with SIGSTOP (the suite's shared
broker must not be), and the handle is the native one ``send_batch`` uses, with a data
producer's settings. While the broker is paused this process must stay idle; once it
resumes, every record lands, in order.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import _free_port_pair
from tests.unit.coordinator.test_txn_log import entries as log_entries
from txnstream import Config
from txnstream.cluster import LocalCluster
from txnstream.coordinator.kafka_clients import worker_clients
from txnstream.coordinator.log_entry import TransactionLogEntry
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.txn_log import KafkaTransactionLog
from txnstream.kafka.clients import CONFLUENT_KAFKA
from txnstream.kafka.native_send import NativeSender, librdkafka_settings, native_send
from txnstream.producer import data_producer_settings

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("paused-broker")]

needs_native = pytest.mark.skipif(native_send() is None,
                                  reason="txnstream._native_send did not build or load")

PAUSE_S = 3.0
IDLE_CPU_S = 0.6
"""CPU this process may use over the pause (a spinning broker thread uses ~PAUSE_S)."""
RECORD = b"r" * 100


@pytest.fixture(scope="module")
def own_broker() -> Iterator[LocalCluster]:
    state = Path(tempfile.mkdtemp(prefix="txnstream-spin-"))
    cluster = LocalCluster(state, brokers=1, port=_free_port_pair())
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"spin-{os.urandom(4).hex()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)
    return name


def _sender(bootstrap: str, topic: str) -> NativeSender:
    mod = native_send()
    assert mod is not None
    rendered = librdkafka_settings(data_producer_settings(Config(bootstrap_servers=bootstrap)))
    assert not isinstance(rendered, str)
    return NativeSender(mod, rendered, topic, logging.getLogger("test.spin"))


def _cpu_over_pause(broker: int, start: Callable[[], None],
                    settle_s: float) -> tuple[float, float]:
    """Pause ``broker``, ``start()`` the work, let it settle, then this process's CPU and
    the wall time over :data:`PAUSE_S`; the broker resumes whatever happens."""
    os.kill(broker, signal.SIGSTOP)
    try:
        start()
        time.sleep(settle_s)
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(PAUSE_S)
        return time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        os.kill(broker, signal.SIGCONT)


def _read(bootstrap: str, topic: str, partitions: int, n: int) -> dict[int, list[bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{os.urandom(4).hex()}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < n and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                assert m.error() is None, m.error()
                got[m.partition()].append(m.value())
        return got
    finally:
        c.close()


@needs_native
@pytest.mark.parametrize("partitions", [4, 16])
def test_batches_waiting_on_a_paused_broker_use_no_cpu_and_all_land_in_order(
        own_broker: LocalCluster, partitions: int) -> None:
    bootstrap = own_broker.bootstrap
    topic = _topic(bootstrap, partitions)
    sender = _sender(bootstrap, topic)
    tally = sender.tally()
    headers = {p: [("h", b"v")] for p in range(partitions)}
    try:
        warm = [b"warm"] * partitions
        assert sender.produce(tally, warm, None, list(range(partitions)), headers, 0) == \
            (partitions, 0)
        assert sender.flush(30) == 0
        broker = next(iter(own_broker.pids().values()))
        batches, per = 6, 3000  # each batch is several requests' worth per partition
        handed: list[int] = []
        failed: list[BaseException] = []

        def produce() -> None:  # may wait for the broker: in a thread of its own
            try:
                for b in range(batches):
                    values = [b"%d:%d:" % (b, i) + RECORD for i in range(per)]
                    parts = [i % partitions for i in range(per)]
                    start = 0
                    while start < per:
                        start, err = sender.produce(tally, values, None, parts, headers,
                                                    start)
                        assert err == 0, err
                    handed.append(b)
            except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
                failed.append(exc)

        producer = threading.Thread(target=produce, daemon=True)
        # settled: what was handed over is now waiting on the broker
        cpu, wall = _cpu_over_pause(broker, producer.start, settle_s=0.5)
        producer.join(60)
        assert not failed, failed
        assert handed == list(range(batches)), f"batches handed: {handed}"
        sent = batches * per
        assert cpu < IDLE_CPU_S, (
            f"this process used {cpu:.2f} s of CPU in {wall:.1f} s while its records "
            f"waited on a paused broker: a producer thread spins")
        assert sender.flush(60) == 0
        got = _read(bootstrap, topic, partitions, partitions + sent)
        for p in range(partitions):
            want = [b"warm"] + [b"%d:%d:" % (b, i) + RECORD for b in range(batches)
                                for i in range(per) if i % partitions == p]
            assert got[p] == want, f"partition {p}: records lost, doubled or reordered"
    finally:
        sender.close(5)


def test_a_log_append_behind_an_unanswered_one_waits_idle_and_lands_in_order(
        own_broker: LocalCluster) -> None:
    """The worker's log: one producer for the log and markers, entries of a turn appended and
    flushed, a turn's final entries appended without waiting. At 16 concurrent txns the
    next turn's append came while the last turn's five or more final entries were still
    in flight, and the worker's producer thread polled with a zero timeout until they
    were answered (1.5-2.1 ms of CPU per txn, more than the worker's Python; 8,379
    zero-timeout polls in 4 s against 447 sends under strace). With the broker paused
    that is a core for the whole pause. An append now waits, idle, until fewer than five
    of its partition's entries are unanswered.
    """
    bootstrap = own_broker.bootstrap
    topic = _topic(bootstrap, 2)
    clients = worker_clients(Config(bootstrap_servers=bootstrap), "spin", WorkerSettings(),
                             CONFLUENT_KAFKA)  # the worker's own producer
    log = KafkaTransactionLog(clients, topic, flush_timeout_s=30.0, admin_timeout_s=5.0)
    warm = log.append(0, log_entries(1))
    assert warm.ok, warm.error
    broker = next(iter(own_broker.pids().values()))
    lost: list[object] = []
    results: list[object] = []
    appender = threading.Thread(target=lambda: results.append(
        log.append(0, log_entries(3, first_seq=9))), daemon=True)

    def start() -> None:
        log.append_async(0, log_entries(8, first_seq=1), lost.append)  # a turn's last
        time.sleep(0.3)  # sent: eight entries in flight on the paused broker
        appender.start()

    cpu, wall = _cpu_over_pause(broker, start, settle_s=0.3)
    appender.join(60)
    assert cpu < IDLE_CPU_S, (
        f"this process used {cpu:.2f} s of CPU in {wall:.1f} s while a log append waited "
        f"on a paused broker behind one not yet answered: the producer thread spins")
    assert not lost, lost
    assert len(results) == 1 and results[0].ok, results  # type: ignore[attr-defined]
    clients.producer.flush(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{os.urandom(4).hex()}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 12 and time.monotonic() < deadline:
            for m in c.consume(100, 1.0):
                assert m.error() is None, m.error()
                got.append(TransactionLogEntry.decode(m.value()).txn_seq)
    finally:
        c.close()
    assert got == list(range(12)), f"log entries lost, doubled or reordered: {got}"
    clients.consumer.close()
