"""The local Kafka cluster with real JVMs, real Kafka, real ports (no mocks).

Every test has its own state dir and free ports, and stops what it started in a
``finally`` even when it fails. Jars come from the shared cache (``$TXNSTREAM_CACHE`` or
``~/.cache/txnstream``) except where a test needs its own cache to break.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from chaos.cluster import free_port_block
from txnstream.cluster import KAFKA_VERSION, LocalCluster, RecordingReporter
from txnstream.cluster import process as cluster_process
from txnstream.cluster.jars import JarCache, resolve_classpath
from txnstream.errors import ClusterError

TXNSTREAM_BIN = str(Path(sys.executable).with_name("txnstream"))


# --- helpers ----------------------------------------------------------------------------


def free_port_base(n: int) -> int:
    """A base port with base..base+n-1 and base+100..base+100+n-1 all free, below the
    kernel's ephemeral range (where an outgoing connection can take one before the JVM
    binds it: CI lost this file's 3-broker test to "Address already in use")."""
    return free_port_block(n)


def our_processes(state_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line mentions ``state_dir`` (ours, by construction)."""
    marker = str(state_dir.resolve())
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and \
                    marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def assert_all_gone(cluster: LocalCluster, pids: dict[int, int]) -> None:
    assert cluster.pids() == {}
    for node, pid in pids.items():
        assert not cluster_process.is_alive(pid), f"node {node} pid {pid} still alive"
        assert not cluster.layout.pid_path(node).exists()
    assert our_processes(cluster.state_dir) == []
    ports = cluster.layout.client_ports() + cluster.layout.controller_ports()
    assert not listeners_on(ports), f"still listening after down: {listeners_on(ports)}"
    # A socket the kernel is still tearing down (FIN_WAIT, LAST_ACK of a connection the
    # killed node had accepted) may hold a port for a moment after its process is gone;
    # what must hold is that the port becomes bindable again, as a restart needs.
    deadline = time.monotonic() + PORT_RELEASE_S
    for port in ports:
        while cluster_process.port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not cluster_process.port_in_use(port), \
            f"port {port} still bound {PORT_RELEASE_S} s after down: {sockets_on(port)}"


PORT_RELEASE_S = 10.0


def sockets_on(port: int) -> list[str]:
    """Every TCP socket whose local port is ``port``: its state and owning pid (if any)."""
    return [f"{c.status} pid={c.pid} {c.laddr} -> {c.raddr or '-'}"
            for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port]


def listeners_on(ports: list[int]) -> list[str]:
    wanted = set(ports)
    return [f"{c.laddr} pid={c.pid}" for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in wanted]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Build LocalClusters on free ports; every one is brought down at teardown."""
    made: list[LocalCluster] = []

    def make(brokers: int = 1, **kwargs: object) -> LocalCluster:
        kwargs.setdefault("reporter", RecordingReporter())
        c = LocalCluster(tmp_path / f"state-{len(made)}", brokers=brokers,
                         port=free_port_base(brokers), **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.down(timeout_s=10)


@pytest.fixture(scope="module")
def shared_jars() -> Path:
    """Make sure the shared jar cache is filled (the first fetch may take a while)."""
    return resolve_classpath(RecordingReporter()).libs_dir


def topic_name() -> str:
    return f"cluster-test-{uuid.uuid4().hex[:8]}"


def produce_and_check(producer: Producer, topic: str, values: list[str],
                      partitions: int = 1, first: int = 0) -> None:
    """Produce ``values``; ``values[i]`` goes to partition ``(first + i) % partitions``.

    Fails on any delivery error.
    """
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for i, v in enumerate(values):
        while True:
            try:
                producer.produce(topic, v.encode(), partition=(first + i) % partitions,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0, "records still in flight after 120 s"
    assert errors == []


def read_until(consumer: Consumer, want: int, timeout_s: float) -> list:
    """Poll until ``want`` records arrived or ``timeout_s`` passed; the records read."""
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            out.append(m)
    return out


def drain(consumer: Consumer, seconds: float) -> list:
    """Whatever arrives within ``seconds``."""
    out: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = consumer.poll(max(0.0, min(0.1, deadline - time.monotonic())))
        if m is not None and not m.error():
            out.append(m)
    return out


# --- (a) single broker ------------------------------------------------------------------


@pytest.mark.integration
def test_single_broker_round_trip_then_down_leaves_nothing(make_cluster, shared_jars) -> None:
    cluster = make_cluster(1)
    cluster.up(timeout_s=90)
    report = cluster.last_up
    assert report is not None and report.started == (1,)
    print(f"single broker answered {report.answer_s:.2f} s after launch "
          f"({report.total_s:.2f} s in all)")
    pids = cluster.pids()
    assert set(pids) == {1}
    [node] = cluster.status()
    assert node.alive and node.pid == pids[1] and node.port == cluster.layout.port
    # The broker may answer a few ms before it logs that it started.
    deadline = time.monotonic() + 15
    while "Kafka Server started" not in node.log_path.read_text():
        assert time.monotonic() < deadline, f"no 'Kafka Server started' in {node.log_path}"
        time.sleep(0.1)
    assert cluster.bootstrap == f"127.0.0.1:{cluster.layout.port}"

    topic = topic_name()
    values = [f"v{i}" for i in range(500)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    produce_and_check(producer, topic, values)  # auto-creates the topic
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        got = read_until(consumer, len(values), 60)
    finally:
        consumer.close()
    read = [m.value().decode() for m in got]
    assert len(read) == len(values), f"read {len(read)} of {len(values)} records"
    assert read == values  # all, once each, in order

    # A second `up` while running is a no-op that reports the running node.
    cluster.up()
    assert cluster.last_up.started == () and cluster.pids() == pids
    assert any("already running" in n for n in cluster.reporter.notes)

    cluster.down()
    assert_all_gone(cluster, pids)


# --- (b) three brokers, one killed -9 ---------------------------------------------------


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.slow
def test_three_brokers_lose_nothing_when_one_is_killed(make_cluster, shared_jars) -> None:
    cluster = make_cluster(3)
    cluster.up(timeout_s=120)
    report = cluster.last_up
    print(f"three brokers answered {report.answer_s:.2f} s after launch "
          f"({report.total_s:.2f} s in all)")
    pids = cluster.pids()
    assert set(pids) == {1, 2, 3}

    topic, partitions = topic_name(), 3
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        before = [f"before-{i}" for i in range(600)]
        produce_and_check(producer, topic, before, partitions)
        got = read_until(consumer, len(before), 60)
        assert len(got) == len(before), f"read {len(got)} of {len(before)} before the kill"

        # Kill -9 the leader of partition 0: its partitions must fail over.
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        victim = meta.partitions[0].leader
        cluster.kill(victim)
        assert victim not in cluster.pids() and not cluster_process.is_alive(pids[victim])

        after = [f"after-{i}" for i in range(600)]
        for chunk in range(0, len(after), 100):  # keep producing and consuming meanwhile
            produce_and_check(producer, topic, after[chunk:chunk + 100], partitions, chunk)
            got += drain(consumer, 0.3)
        got += read_until(consumer, len(before) + len(after) - len(got), 90)
    finally:
        consumer.close()

    values = [m.value().decode() for m in got]
    expected = before + after
    print(f"killed node {victim}; read {len(values)} of {len(expected)} records")
    assert len(values) == len(set(values)), "a record was read twice"
    assert set(values) == set(expected), f"lost: {sorted(set(expected) - set(values))[:10]}"
    for p in range(partitions):  # order kept within each partition
        mine = [m.value().decode() for m in got if m.partition() == p]
        assert mine == [v for i, v in enumerate(before) if i % partitions == p] + \
            [v for i, v in enumerate(after) if i % partitions == p]

    # The killed node comes back and rejoins.
    cluster.start_node(victim)
    assert set(cluster.pids()) == {1, 2, 3}
    pids = cluster.pids()
    cluster.down()
    assert_all_gone(cluster, pids)


# --- (c) port already taken -------------------------------------------------------------


@pytest.mark.integration
def test_port_taken_is_a_clear_error(make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(1)
    port = cluster.layout.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(ClusterError) as err:
            cluster.up()
        assert f"port {port}" in str(err.value) and "--port" in str(err.value)
        assert cluster.pids() == {}

        state = tmp_path / "cli-state"
        out = subprocess.run([TXNSTREAM_BIN, "cluster", "up", "--port", str(port),
                              "--state-dir", str(state)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert f"port {port}" in out.stderr and "--port" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert our_processes(state) == []


# --- (d) no java, no mvn ----------------------------------------------------------------


@pytest.mark.integration
def test_missing_java_and_mvn_is_a_clear_error(make_cluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin, empty_cache = tmp_path / "bin", tmp_path / "cache"
    empty_bin.mkdir()
    empty_cache.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "KAFKA_HOME")}
    env.update(PATH=str(empty_bin), TXNSTREAM_CACHE=str(empty_cache))
    for key in ("JAVA_HOME", "KAFKA_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PATH", str(empty_bin))
    monkeypatch.setenv("TXNSTREAM_CACHE", str(empty_cache))

    cluster = make_cluster(1)
    with pytest.raises(ClusterError) as err:
        cluster.up()
    for word in ("`java`", "`mvn`", "KAFKA_HOME"):
        assert word in str(err.value)
    assert cluster.pids() == {}

    state = tmp_path / "cli-state"
    out = subprocess.run([TXNSTREAM_BIN, "cluster", "up", "--state-dir", str(state),
                          "--port", str(free_port_base(1))],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out
    for word in ("`java`", "`mvn`", "KAFKA_HOME"):
        assert word in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert list(empty_cache.iterdir()) == []  # nothing fetched, nothing half-written


# --- (e) corrupt jar cache --------------------------------------------------------------


@pytest.mark.integration
def test_corrupt_cached_jar_is_refetched_and_broker_starts(make_cluster, shared_jars,
                                                           tmp_path: Path) -> None:
    cache_root = tmp_path / "cache"
    mine = JarCache(cache_root)
    shutil.copytree(shared_jars.parent, mine.dir, ignore=shutil.ignore_patterns(".lock"))
    mine.verify()
    victim = next(mine.libs.glob("kafka-clients-*.jar"))
    size = victim.stat().st_size
    with victim.open("r+b") as f:
        f.truncate(size // 2)

    cluster = make_cluster(1, cache_dir=cache_root)
    cluster.up(timeout_s=90)
    notes = cluster.reporter.notes
    assert any(victim.name in n and "fetching again" in n for n in notes), notes
    assert cluster.last_up.classpath == "maven"
    assert victim.stat().st_size == size
    mine.verify()
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
    assert set(md.brokers) == {1}


# --- KAFKA_HOME, early exit, timeout ----------------------------------------------------


@pytest.mark.integration
def test_kafka_home_is_used_without_mvn(make_cluster, shared_jars, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home, bin_dir = tmp_path / "kafka_2.13-release", tmp_path / "bin"
    home.mkdir()
    (home / "libs").symlink_to(shared_jars)
    bin_dir.mkdir()
    java = shutil.which("java")
    assert java, "these tests need java"
    (bin_dir / "java").symlink_to(java)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(bin_dir))  # no mvn reachable
    monkeypatch.setenv("KAFKA_HOME", str(home))
    empty_cache = tmp_path / "empty-cache"
    cluster = make_cluster(1, cache_dir=empty_cache)
    cluster.up(timeout_s=90)
    assert cluster.last_up.classpath == "KAFKA_HOME"
    assert not (empty_cache / f"kafka-{KAFKA_VERSION}").exists()


@pytest.mark.integration
def test_broker_that_exits_early_shows_its_log(make_cluster, shared_jars) -> None:
    cluster = make_cluster(1, heap="1k")  # the JVM refuses such a heap and exits
    with pytest.raises(ClusterError) as err:
        cluster.up(timeout_s=60)
    msg = str(err.value)
    assert "exited during startup" in msg and str(cluster.layout.log_path(1)) in msg
    assert "heap" in msg.lower()  # the tail of the log says what went wrong
    assert cluster.pids() == {} and our_processes(cluster.state_dir) == []


@pytest.mark.integration
def test_timeout_stops_what_it_started(make_cluster, shared_jars) -> None:
    cluster = make_cluster(1)
    with pytest.raises(ClusterError, match="timed out"):
        cluster.up(timeout_s=0.2)
    assert cluster.pids() == {} and our_processes(cluster.state_dir) == []
    assert not cluster.layout.pid_path(1).exists()
