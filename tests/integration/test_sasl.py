"""txnstream on a broker that takes only SASL/SCRAM logins.

The local cluster starts with a SCRAM user; a coordinator worker (a real process, its
credentials from ``$TXNSTREAM_KAFKA_CONFIG``, never its command line) and this test's
client run the transactional round trip on it. A wrong password fails with an error that
says so, and the password is in no log line, no error and no repr.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _free_port_pair
from tests.integration.coordinator.conftest import make_topic
from txnstream import Client, Config, TopicNames
from txnstream.admin_topics import ensure_topics
from txnstream.cluster import LocalCluster, ScramUser
from txnstream.errors import CoordinatorAuthError

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sasl-broker")]

PASSWORD = f"scram-{uuid.uuid4().hex}"
USER = "txnstream-it"


@pytest.fixture(scope="module")
def scram_cluster() -> Iterator[LocalCluster]:
    state = Path(tempfile.mkdtemp(prefix="txnstream-sasl-"))
    cluster = LocalCluster(state, port=_free_port_pair(), sasl=ScramUser(USER, PASSWORD))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)


TC_SECRET = "line-secret-of-the-sasl-test"


def assert_no_password(text: str, where: str) -> None:
    assert PASSWORD not in text, f"the SCRAM password appears in {where}"


def test_transactional_round_trip_on_scram(scram_cluster: LocalCluster,
                                           caplog: pytest.LogCaptureFixture,
                                           tmp_path: Path) -> None:
    props = scram_cluster.client_properties
    assert props is not None and props.stat().st_mode & 0o077 == 0, "client.properties is 0600"
    secret_file = tmp_path / "tc-secret"
    secret_file.write_text(TC_SECRET)
    secret_file.chmod(0o600)
    config = Config(bootstrap_servers=scram_cluster.bootstrap,
                    topics=TopicNames(f"__s{uuid.uuid4().hex[:6]}"),
                    kafka=scram_cluster.client_settings, tc_secret=TC_SECRET)
    ensure_topics(config)
    topic = make_topic(config, 2, "sasl")

    # the coordinator line authenticated too: the worker reads its secret from a file
    env = dict(os.environ, TXNSTREAM_KAFKA_CONFIG=str(props),
               TXNSTREAM_TOPIC_PREFIX=config.topics.prefix,
               TXNSTREAM_TC_SECRET_FILE=str(secret_file))
    env.pop("TXNSTREAM_TC_SECRET", None)
    out = tmp_path / "worker.out"
    with out.open("wb") as fh:
        worker = subprocess.Popen(
            [str(Path(sys.executable).parent / "txnstream"), "--bootstrap",
             config.bootstrap_servers,
             "-v", "worker", "--session-timeout-ms", "6000"],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with caplog.at_level(logging.DEBUG):
            with Client(config=config) as client:
                committed: list[bytes] = []
                deadline = time.monotonic() + 90
                while True:  # the worker serves once it owns the coordinators
                    try:
                        txn = client.new_transaction(timeout_s=30)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
                producer = client.create_producer(topic)
                for i in range(20):
                    value = f"c{i}".encode()
                    producer.send(value, key=str(i).encode(), txn=txn)
                    committed.append(value)
                txn.commit()
                aborted = client.new_transaction(timeout_s=30)
                for i in range(10):
                    producer.send(f"a{i}".encode(), key=str(i).encode(), txn=aborted)
                aborted.abort()
                consumer = client.subscribe(topic, subscription="sasl-check")
                got: list[bytes] = []
                end = time.monotonic() + 60
                while len(got) < len(committed) and time.monotonic() < end:
                    msg = consumer.receive(timeout_s=1)
                    if msg is not None:
                        got.append(msg.value)
                        consumer.acknowledge(msg)
                extra = consumer.receive(timeout_s=2)
                consumer.close()
            stranger = Client(config=config.with_(tc_secret="not-the-secret"))
            try:
                with pytest.raises(CoordinatorAuthError, match="refused this client"):
                    stranger.new_transaction(timeout_s=10, tc_id=0)
            finally:
                stranger.close()
        assert sorted(got) == sorted(committed), "every committed record once, nothing else"
        assert extra is None, f"an aborted or duplicate record was delivered: {extra}"
        assert_no_password(caplog.text, "this process's log")
        assert_no_password(repr(config) + str(config.redacted()), "the Config repr")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    assert_no_password(out.read_text(errors="replace"), "the worker's output")
    for i in scram_cluster.layout.node_ids:
        assert_no_password(scram_cluster.layout.log_path(i).read_text(errors="replace"),
                           f"broker node {i}'s log")


def test_wrong_password_fails_clearly(scram_cluster: LocalCluster,
                                      caplog: pytest.LogCaptureFixture) -> None:
    wrong = "not-" + PASSWORD
    settings = dict(scram_cluster.client_settings, **{"sasl.password": wrong})
    config = Config(bootstrap_servers=scram_cluster.bootstrap, kafka=settings,
                    admin_timeout_s=10)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(Exception) as err:
            ensure_topics(config)
    text = f"{err.value!r} {err.value}"
    assert "auth" in text.lower() or "SASL" in text, f"the error does not say why: {text}"
    assert wrong not in text and wrong not in caplog.text
    assert_no_password(text + caplog.text, "the failed login's error")
