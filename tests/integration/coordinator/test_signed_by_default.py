"""Markers are signed in every mode of authentication, and only an explicit ``--unsigned``
runs a worker without the workers' key (issue 33 item 6), on a real broker.

On the old code a worker signed only with a key file or a secret: one secured by mutual
TLS alone (or by nothing, on loopback) ran unsigned, so any producer of a data topic
could forge its markers, and it said so only in a warning.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.coordinator.conftest import (  # noqa: F401  (a fixture)
    FAST_FAILOVER_MS,
    TXNSTREAM_BIN,
    make_topic,
    read_all,
    wait_until,
)
from tests.tls_certs import make_certs
from txnstream import Client, Config, TopicPartition
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.markers import TXN_MAC_HEADER, TXN_TAG_HEADER, RecordKind, classify_headers
from txnstream.workers_key import generate_key_file, load_key_file, workers_signer

pytestmark = pytest.mark.integration


def _cluster_id(config: Config) -> str:
    cluster = AdminClient(config.admin()).list_topics(timeout=10).cluster_id
    assert cluster
    return cluster


def test_mutual_tls_alone_signs_markers_with_the_default_key(own_config, tmp_path,  # noqa: F811
                                                              monkeypatch):
    """Old: the marker carried no txn.mac (a worker with no secret wrote unsigned ones)."""
    home = tmp_path / "home"
    monkeypatch.setenv("TXNSTREAM_HOME", str(home))  # a key of this test's own
    assert generate_key_file(home / "workers.key")
    certs = make_certs(tmp_path)
    worker_cfg = own_config.with_(
        tc_tls_certfile=certs["worker.pem"], tc_tls_keyfile=certs["worker.key"],
        tc_tls_cafile=certs["ca.pem"], tc_tls_client_auth=True,
        tc_admins=("worker",))  # its buffer role asks coordinators as its certificate's CN
    assert worker_cfg.tc_secret is None and worker_cfg.workers_key_file is None
    client_cfg = own_config.with_(tc_tls_cafile=certs["ca.pem"],
                                  tc_tls_certfile=certs["client.pem"],
                                  tc_tls_keyfile=certs["client.key"])
    w = CoordinatorWorker(worker_cfg, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS))
    assert w.config.workers_key_file == str(home / "workers.key")  # what both roles use
    w.start()
    try:
        wait_until(lambda: len(w.serving()) == own_config.num_coordinators, 60, "serving")
        topic = make_topic(own_config, 1)
        with Client(config=client_cfg) as client:
            producer = client.create_producer(topic)
            with client.transaction() as txn:
                producer.send(b"over mutual TLS", txn=txn, partition=0)
            consumer = client.subscribe(topic, subscription=f"s-{uuid.uuid4().hex[:6]}")
            try:
                m = consumer.receive(timeout_s=30)
                assert m is not None and m.value == b"over mutual TLS"
            finally:
                consumer.close()
        recs = read_all(own_config, topic)
        markers = [r for r in recs if classify_headers(r.headers())[0] is RecordKind.MARKER]
        assert markers, "no marker written"
        assert all(any(k == TXN_MAC_HEADER for k, _ in r.headers() or []) for r in markers), \
            "an unsigned marker"
        signer = workers_signer(worker_cfg, _cluster_id(own_config))
        assert signer is not None and signer.membership is not None
        assert all(signer.verify(topic, 0, r.value(), r.headers()) for r in markers)
        [record] = [r for r in recs if r.value() == b"over mutual TLS"]
        tag = dict(record.headers() or [])[TXN_TAG_HEADER]
        assert tag == signer.membership.tag(txn.id, TopicPartition(topic, 0))
    finally:
        w.stop()
    assert load_key_file(home / "workers.key")  # still the one it found


def _start(config: Config, home: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TXNSTREAM_WORKERS_KEY_FILE", "TXNSTREAM_TC_SECRET",
                        "TXNSTREAM_TC_SECRET_FILE")} | {"TXNSTREAM_HOME": str(home)}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [TXNSTREAM_BIN, "--bootstrap", config.bootstrap_servers, "worker", "--prefix",
             config.topics.prefix, "--session-timeout-ms", str(FAST_FAILOVER_MS), *extra],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def test_a_worker_with_no_key_starts_only_when_told_to_run_unsigned(
        own_config, tmp_path, proc_reaper):  # noqa: F811
    """Old: the worker started unsigned without being asked, and said so in a warning."""
    home = tmp_path / "no-key-here"
    refused = proc_reaper.track(_start(own_config, home, tmp_path / "refused.log"))
    assert refused.wait(60) == 2
    said = (tmp_path / "refused.log").read_text().replace("\n", " ")
    assert "--unsigned" in said and "txnstream keygen" in said, said
    assert "Traceback" not in said

    log = tmp_path / "unsigned.log"
    proc = proc_reaper.track(_start(own_config, home, log, "--unsigned"))
    with Client(config=own_config) as client:
        wait_until(lambda: proc.poll() is None and len(client.admin.coordinator_stats())
                   == own_config.num_coordinators, 90, "the unsigned worker serving")
        # the buffer role, in its child process, made the same choice and serves
        wait_until(lambda: "owns slot" in log.read_text(errors="replace"), 60,
                   "the buffer child owning slots")
        topic = make_topic(own_config, 1)
        producer = client.create_producer(topic)
        with client.transaction() as txn:
            producer.send(b"unsigned", txn=txn, partition=0)
        wait_until(lambda: any(classify_headers(r.headers())[0] is RecordKind.MARKER
                               for r in read_all(own_config, topic)), 30, "its marker")
    text = log.read_text(errors="replace")
    warnings = [ln for ln in text.splitlines() if "running unsigned (--unsigned)" in ln]
    assert any("buffer worker" in ln for ln in warnings), text[-3000:]
    assert any("buffer worker" not in ln for ln in warnings), text[-3000:]
    for r in read_all(own_config, topic):
        if classify_headers(r.headers())[0] is RecordKind.MARKER:
            assert not any(k == TXN_MAC_HEADER for k, _ in r.headers() or [])
    assert not home.exists(), "a worker never makes a key"
