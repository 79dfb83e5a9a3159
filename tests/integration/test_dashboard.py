"""Every query of the repo's Grafana dashboard returns data from real workers.

A real Prometheus (Debian's ``prometheus``; ``.ci/install-tools`` installs it) scrapes two
real worker processes (coordinator role and buffer child: four endpoints) while a small
transactional load runs: commits, aborts, and one txn left open that blocks a partition
and holds a pending ack. Then each panel target of ``deploy/grafana/dashboards/
txnstream.json`` is evaluated through Prometheus's HTTP API and must return series: no
panel points at a metric nobody exports.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ProcReaper
from tests.integration.coordinator.conftest import make_topic
from txnstream import Client, Config, TopicNames
from txnstream.admin_topics import ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "txnstream.json"


def _free_port(span: int = 1) -> int:
    """A port p with p..p+span-1 free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        try:
            for k in range(1, span):
                with socket.socket() as s2:
                    s2.bind(("127.0.0.1", port + k))
            return port
        except OSError:
            continue
    raise RuntimeError("no free ports")


GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
"""Grafana's built-in variables, as Grafana would expand them for a 1s-scraped source."""


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, template variables substituted.

    The dashboard's own variables take their "All" value (``allValue``), as the default
    view shows them; a variable without one is an error, not a silent pass.
    """
    dash = json.loads(DASHBOARD.read_text())
    values = dict(GRAFANA_VARIABLES)
    for var in dash.get("templating", {}).get("list", []):
        assert var.get("includeAll") and var.get("allValue"), (
            f"dashboard variable {var['name']!r}: no allValue to evaluate its queries with")
        values[var["name"]] = var["allValue"]
    out = []
    for var in dash.get("templating", {}).get("list", []):  # the variables' own choices
        m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["definition"])
        assert m, f"dashboard variable {var['name']!r}: unexpected query {var['definition']}"
        out.append((f"variable {var['name']}", f"group by ({m[2]}) ({m[1]})"))
    names = "|".join(sorted(map(re.escape, values), key=len, reverse=True))
    pattern = re.compile(r"\$(?:\{(" + names + r")\}|(" + names + r")\b)")
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = pattern.sub(lambda m: values[m.group(1) or m.group(2)], target["expr"])
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            out.append((panel["title"], expr))
    return out


def _query(base: str, expr: str) -> list[Any]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[Any] = body["data"]["result"]
    return result


@pytest.fixture
def prometheus(tmp_path: Path, proc_reaper: ProcReaper) -> Iterator[tuple[str, Path]]:
    cached = Path(__file__).resolve().parents[2] / ".txnstream/tools/prometheus/usr/bin/prometheus"
    binary = shutil.which("prometheus") or (str(cached) if cached.exists() else None)
    assert binary, ("the 'prometheus' binary is missing: run tools/fetch-prometheus "
                    "(`make test` does; it unpacks Debian's package into .txnstream/tools)")
    port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                   "scrape_configs:\n  - job_name: txnstream\n"
                   "    file_sd_configs: [{files: ['" + str(tmp_path / "targets.json") +
                   "'], refresh_interval: 1s}]\n")
    (tmp_path / "targets.json").write_text("[]")
    log = (tmp_path / "prometheus.log").open("wb")
    proc_reaper.track(subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2):
                break
        except OSError:
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.3)
    yield base, tmp_path / "targets.json"


def test_every_dashboard_query_returns_data(kafka_bootstrap: str, prometheus: tuple[str, Path],
                                            proc_reaper: ProcReaper, tmp_path: Path) -> None:
    base, targets = prometheus
    queries = dashboard_queries()
    assert len(queries) >= 10, "the dashboard lost its panels"
    config = Config(bootstrap_servers=kafka_bootstrap,
                    topics=TopicNames(f"__d{uuid.uuid4().hex[:6]}"))  # the workers' defaults
    ensure_topics(config)
    endpoints = []
    for i in range(2):
        port = _free_port(2)
        endpoints += [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
        proc_reaper.track(subprocess.Popen(
            [str(Path(sys.executable).parent / "txnstream"),
             "--bootstrap", kafka_bootstrap, "worker", "--prefix", config.topics.prefix,
             "--session-timeout-ms", "6000", "--metrics-port", str(port)],
            stdout=(tmp_path / f"worker{i}.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True))
    targets.write_text(json.dumps([{"targets": endpoints}]))

    data_topic = make_topic(config, 2, "dash")
    in_topic = make_topic(config, 1, "dash-in")
    with Client(config=config) as client:
        producer = client.create_producer(data_topic)
        plain = client.create_producer(in_topic)
        for i in range(5):
            plain.send(f"in-{i}".encode())
        plain.flush()
        for i in range(20):  # commits and aborts, while the dashboard's windows fill
            txn = client.new_transaction(timeout_s=60)
            producer.send(f"v{i}".encode(), partition=0, txn=txn)
            txn.abort() if i % 4 == 3 else txn.commit()
        holder = client.new_transaction(timeout_s=300)  # blocks partition 0 ...
        producer.send(b"held", partition=0, txn=holder)
        holder.flush()
        after = client.new_transaction(timeout_s=60)  # ... with committed records behind it
        producer.send(b"behind", partition=0, txn=after)
        after.commit()
        consumer = client.subscribe(in_topic, subscription="dash")
        msg = None
        end = time.monotonic() + 30
        while msg is None and time.monotonic() < end:
            msg = consumer.receive(timeout_s=1)
        assert msg is not None, "the plain input record never arrived"
        consumer.acknowledge(msg, txn=holder)  # a pending ack in an open txn
        holder.flush()

        missing: list[tuple[str, str]] = queries
        deadline = time.monotonic() + 90
        while missing and time.monotonic() < deadline:
            time.sleep(2)
            txn = client.new_transaction(timeout_s=60)  # keep the rates moving
            producer.send(b"tick", partition=1, txn=txn)
            txn.commit()
            missing = [(t, q) for t, q in missing if not _query(base, q)]
        holder.abort()
        consumer.close()
    assert not missing, "dashboard queries with no data:\n" + "\n".join(
        f"  {t}: {q}" for t, q in missing)


def _blocked_series(endpoint: str, topic: str) -> list[dict[str, str]]:
    """Labels of the ``partition_blocked_seconds`` series of ``topic`` a worker exports now."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [dict(sample.labels) for family in text_string_to_metric_families(text)
            if family.name == "txnstream_buffer_partition_blocked_seconds"
            for sample in family.samples if sample.labels.get("topic") == topic]


def test_blocked_partition_series_removed_when_unblocked(
        kafka_bootstrap: str, proc_reaper: ProcReaper, tmp_path: Path) -> None:
    config = Config(bootstrap_servers=kafka_bootstrap,
                    topics=TopicNames(f"__b{uuid.uuid4().hex[:6]}"))
    ensure_topics(config)
    port = _free_port(2)
    buffer_endpoint = f"127.0.0.1:{port + 1}"  # the buffer role's child process
    proc_reaper.track(subprocess.Popen(
        [str(Path(sys.executable).parent / "txnstream"),
         "--bootstrap", kafka_bootstrap, "worker", "--prefix", config.topics.prefix,
         "--session-timeout-ms", "6000", "--metrics-port", str(port)],
        stdout=(tmp_path / "worker.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True))
    data_topic = make_topic(config, 2, "blk")

    def wait_for(what: str, done: Callable[[list[dict[str, str]]], bool]) -> list[dict[str, str]]:
        deadline = time.monotonic() + 30
        while True:
            try:
                series = _blocked_series(buffer_endpoint, data_topic)
                if done(series):
                    return series
            except OSError:
                series = []
            assert time.monotonic() < deadline, (
                f"{what}: series now {series}\n{(tmp_path / 'worker.log').read_text()[-3000:]}")
            time.sleep(0.5)

    with Client(config=config) as client:
        producer = client.create_producer(data_topic)
        holder = client.new_transaction(timeout_s=120)
        producer.send(b"held", partition=0, txn=holder)
        holder.flush()
        for i in range(3):  # committed records behind the open txn: partition 0 is blocked
            txn = client.new_transaction(timeout_s=60)
            producer.send(f"v{i}".encode(), partition=0, txn=txn)
            producer.send(f"w{i}".encode(), partition=1, txn=txn)
            txn.commit()
        blocked = wait_for("partition 0 never showed as blocked", bool)
        assert blocked == [{"topic": data_topic, "partition": "0", "txn": str(holder.id)}], (
            "one series per blocked partition, labelled with the txn that blocks it")
        holder.abort()
        wait_for("the series outlived the txn that blocked the partition", lambda s: not s)
