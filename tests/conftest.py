"""Session fixtures: one real Kafka broker for the whole run (under pytest-xdist, one
that the controller starts for all its workers), and per-session topics.

The broker, in order: ``TXNSTREAM_BOOTSTRAP`` if set; else a testcontainers Kafka when
a Docker engine answers; else the project's own local broker (``LocalCluster``, jars
from Maven Central) on free ports, stopped at the end of the session whatever happens.

Every worker of the run signs its markers with one workers' key, as a deployment's
workers do, without a test saying so: the run's ``$TXNSTREAM_HOME`` (:data:`HOME_ENV`)
holds it at the default key path (``txnstream.workers_key.default_key_path``), where
workers given no key file and no secret look, in-process (the ``config`` fixture and every
``Config`` a test builds) and in ``txnstream worker`` processes (they inherit the
environment). A test about running without a key says ``unsigned=True`` / ``--unsigned``,
or points ``TXNSTREAM_HOME`` elsewhere.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster import free_port_block
from txnstream import Config, TopicNames

log = logging.getLogger(__name__)

KAFKA_IMAGE_ENV = "TXNSTREAM_TEST_KAFKA_IMAGE"
"""Names a Confluent Platform image (``confluentinc/cp-kafka:7.9.0``: testcontainers'
KafkaContainer runs that distribution) to test against in Docker instead of the local
broker. Opt-in: a Docker engine that merely answers (one started for ``make
compose-test``, say) must not change which broker the suite uses."""


def _free_port_pair() -> int:
    """A port p with p and p+100 free on 127.0.0.1 (client and controller listeners).

    Below the kernel's ephemeral range, as the nemesis harness's: a port merely free there
    can be taken as an outgoing connection's source port before the JVM binds it.
    """
    return free_port_block(1)


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


SLOW_EVERY = 12
"""In the run's order, one ``slow`` test per this many other broker tests."""

SPARK_SESSION_GROUP = "spark-session"
"""The xdist group of the tests that use the session's local Spark: one worker runs them
all, on one Spark JVM, instead of each worker starting its own."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the run for ``make test``'s pytest-xdist workers (``--dist loadgroup`` hands a
    worker its next test, or group, as it finishes one).

    First the two groups that each take one worker for minutes: the Spark drivers killed
    and restarted (``spark-drivers``) and the tests on the session's Spark
    (:data:`SPARK_SESSION_GROUP`); then the other broker tests, with the ``slow`` ones
    spread among them, one per :data:`SLOW_EVERY`; the unit tests last. A slow test begun
    near the end would leave the other workers idle until it ends; slow tests begun all at
    once (each with its processes and JVMs) load 2 cores several times over and run
    longer each; many short unit tests at the end even out the finish.
    """
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SPARK_SESSION_GROUP))

    def group(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return str(mark.args[0]) if mark and mark.args else None

    drivers = [i for i in items if group(i) == "spark-drivers"]
    sessions = [i for i in items if group(i) == SPARK_SESSION_GROUP]
    others = [i for i in items if group(i) not in ("spark-drivers", SPARK_SESSION_GROUP)]
    slow = [i for i in others if i.get_closest_marker("slow") is not None]
    unit = [i for i in others if i.get_closest_marker("slow") is None
            and i.nodeid.startswith("tests/unit/")]
    rest = [i for i in others if i.get_closest_marker("slow") is None
            and not i.nodeid.startswith("tests/unit/")]
    ordered: list[pytest.Item] = drivers + sessions
    for n, item in enumerate(rest):
        if n % SLOW_EVERY == 0 and slow:
            ordered.append(slow.pop(0))
        ordered.append(item)
    items[:] = ordered + slow + unit


def _local_broker() -> Any:
    """The project's own local broker on free ports, started; stopped at exit at the latest.

    Its log directory goes at exit too: a run writes gigabytes to it (the 1 GiB txn of
    the memory-bound test, the segments of the snapshot tests), and a kept one per run
    filled this machine's disk in a day.
    """
    from txnstream.cluster import LocalCluster

    state = Path(tempfile.mkdtemp(prefix="txnstream-test-broker-"))
    cluster = LocalCluster(state, brokers=1, port=_free_port_pair())

    def discard() -> None:  # also on an interrupted run
        try:
            cluster.down()
        finally:
            shutil.rmtree(state, ignore_errors=True)

    atexit.register(discard)
    cluster.up()
    return cluster


RUN_SCRATCH_ENV = "TXNSTREAM_TEST_RUN_DIR"
"""A directory of this run, shared by its pytest-xdist workers, removed at its end."""
HOME_ENV = "TXNSTREAM_HOME"
"""Set to ``<run dir>/home`` for the run, with the workers' key in it: never the user's."""

SHARED_BROKER_ENV = "TXNSTREAM_TEST_SHARED_BOOTSTRAP"
"""Set by the pytest-xdist controller for its workers: the broker it started for them."""
_SHARED_BROKER = pytest.StashKey["object"]()


HANG_GRACE_S = 120
"""How long past its pytest-timeout a test may still run before the hook below ends its
process."""

_REAL_STDERR = pytest.StashKey[int]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A test that outlives its pytest-timeout by :data:`HANG_GRACE_S` ends its process,
    after every thread's stack is written to the run's stderr.

    pytest-timeout's alarm only runs once the main thread is back in Python: a test
    blocked in C (a librdkafka call that never returns, a lock held in a C loop), or one
    whose teardown blocks again after the alarm failed it, hangs the whole run (a CI
    run sat 64 minutes after its last test's dot, with no word of which test or where).
    faulthandler's watchdog is a C thread: it writes the stacks and exits even then.
    Under pytest-xdist the controller reports the worker's crash, naming the test, and
    the run goes on with a new worker.
    """
    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else \
        float(item.config.getini("timeout") or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + HANG_GRACE_S, exit=True,
                                          file=item.config.stash[_REAL_STDERR])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_configure(config: pytest.Config) -> None:
    """The run's scratch directory (the wheel's, :mod:`tests.wheel_build`), made by the
    controller and removed when the run ends; and under pytest-xdist, the controller
    starts one local broker for all its workers.

    Workers (each its own process) would otherwise each start one, and an idle broker
    still takes a sixth of a core. Every test works in topics of its own (a per-session
    prefix, per-test names), so they share a broker as they share one given by
    ``$TXNSTREAM_BOOTSTRAP``. The controller stops it once the workers have exited, so
    no client outlives it.
    """
    # Capture is suspended here: fd 2 is the run's stderr (a worker's is its controller's).
    config.stash[_REAL_STDERR] = os.dup(2)
    if hasattr(config, "workerinput"):
        return
    scratch = tempfile.mkdtemp(prefix="txnstream-test-run-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    os.environ[RUN_SCRATCH_ENV] = scratch
    # The run's workers' key, before any Config is built; pytest-xdist workers (started
    # after this) and worker processes inherit the environment.
    from txnstream.workers_key import default_key_path, generate_key_file

    os.environ[HOME_ENV] = os.path.join(scratch, "home")
    os.environ.pop("TXNSTREAM_WORKERS_KEY_FILE", None)  # one the user's shell had
    generate_key_file(default_key_path())
    if not config.getoption("numprocesses", None):
        return
    if os.environ.get("TXNSTREAM_BOOTSTRAP") or os.environ.get(KAFKA_IMAGE_ENV):
        return
    cluster = _local_broker()
    config.stash[_SHARED_BROKER] = cluster
    os.environ[SHARED_BROKER_ENV] = cluster.bootstrap


def pytest_unconfigure(config: pytest.Config) -> None:
    cluster = config.stash.get(_SHARED_BROKER, None)
    if cluster is not None:
        cluster.down()  # type: ignore[attr-defined]
        os.environ.pop(SHARED_BROKER_ENV, None)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker for this test session."""
    env = os.environ.get("TXNSTREAM_BOOTSTRAP") or os.environ.get(SHARED_BROKER_ENV)
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
    cluster = _local_broker()
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


@pytest.fixture
def own_config(config: Config) -> Iterator[Config]:
    """A Config with internal topics of its own: for a test that changes their settings, or
    whose workers must not load what earlier tests of the session left in the shared ones
    (a worker claiming buffer slots restores every partition registered there)."""
    from confluent_kafka.admin import AdminClient

    from txnstream.admin_topics import ensure_topics

    cfg = config.with_(topics=TopicNames(f"__t{uuid.uuid4().hex[:8]}"))
    ensure_topics(cfg)
    try:
        yield cfg
    finally:
        admin = AdminClient(cfg.admin())
        for f in admin.delete_topics(cfg.topics.all(), operation_timeout=30).values():
            try:
                f.result(30)
            except Exception:  # already gone; nothing to clean
                pass


class ProcReaper:
    """Processes a test starts; all killed (by pid, whole group) at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def track(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def start_until(self, argv: list[str], log: Path, marker: bytes,
                    timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
        """Start ``argv`` (its own session, output to ``log``), tracked; return once
        ``marker`` is in its output (the test fails if it exits or times out first)."""
        proc = self.track(subprocess.Popen(argv, stdout=open(log, "wb"),
                                           stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while marker not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, \
                log.read_text()[-3000:]
            time.sleep(0.2)
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
