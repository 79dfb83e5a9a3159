"""Session fixtures: one real Kafka broker for the whole run (for each pytest-xdist
worker under ``make test``), and per-session topics.

The broker, in order: ``TXNSTREAM_BOOTSTRAP`` if set; else a testcontainers Kafka when
a Docker engine answers; else the project's own local broker (``LocalCluster``, jars
from Maven Central) on free ports, stopped at the end of the session whatever happens.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from txnstream import Config, TopicNames

log = logging.getLogger(__name__)

KAFKA_IMAGE_ENV = "TXNSTREAM_TEST_KAFKA_IMAGE"
"""Names a Confluent Platform image (``confluentinc/cp-kafka:7.9.0``: testcontainers'
KafkaContainer runs that distribution) to test against in Docker instead of the local
broker. Opt-in: a Docker engine that merely answers (one started for ``make
compose-test``, say) must not change which broker the suite uses."""


def _free_port_pair() -> int:
    """A port p with p and p+100 free on 127.0.0.1 (client and controller listeners)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 100 > 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 100))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair found on 127.0.0.1")


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` run first. ``make test`` spreads the tests over pytest-xdist
    workers (``--dist loadgroup`` hands each worker its next test as it finishes one): a
    two-minute test begun near the end would leave the other workers idle until it ends."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker for this test session."""
    env = os.environ.get("TXNSTREAM_BOOTSTRAP")
    if env:
        yield env
        return
    image = os.environ.get(KAFKA_IMAGE_ENV)
    if image:
        if not _docker_answers():
            raise pytest.UsageError(f"${KAFKA_IMAGE_ENV} is set ({image}) but no Docker "
                                    "engine answers")
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer(image).with_kraft()
        container.start()
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()
        return
    from txnstream.cluster import LocalCluster

    state = Path(tempfile.mkdtemp(prefix="txnstream-test-broker-"))
    cluster = LocalCluster(state, brokers=1, port=_free_port_pair())
    atexit.register(cluster.down)  # also on an interrupted run
    cluster.up()
    try:
        yield cluster.bootstrap
    finally:
        # Clients the tests dropped without closing are destroyed now, while their broker
        # still answers, not at exit after it stopped (a burst of "Connection refused").
        gc.collect()
        cluster.down()


@pytest.fixture(scope="session")
def config(kafka_bootstrap: str) -> Config:
    """A Config on the session broker with its own internal topics (unique prefix)."""
    from txnstream.admin_topics import ensure_topics

    cfg = Config(bootstrap_servers=kafka_bootstrap,
                 topics=TopicNames(f"__t{uuid.uuid4().hex[:8]}"), num_coordinators=4)
    ensure_topics(cfg)
    return cfg


class ProcReaper:
    """Processes a test starts; all killed (by pid, whole group) at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def track(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def reap(self) -> None:
        import signal

        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    try:
                        p.kill()
                    except ProcessLookupError:
                        pass
                p.wait(10)


@pytest.fixture
def proc_reaper() -> Iterator[ProcReaper]:
    reaper = ProcReaper()
    try:
        yield reaper
    finally:
        reaper.reap()
