"""Pure parts of the local cluster: server.properties, layout, jar manifest, tool checks.

Nothing here starts Java or touches the network.
"""

from __future__ import annotations

import json
import os
import socket
import zipfile
from pathlib import Path

import pytest

from txnstream.cluster import process
from txnstream.cluster.jars import (
    CorruptJarError,
    JarCache,
    build_manifest,
    check_zip,
    kafka_home_classpath,
    verify_manifest,
)
from txnstream.cluster.layout import (
    ClusterLayout,
    new_cluster_id,
    read_cluster_file,
    render_server_properties,
    write_cluster_file,
)
from txnstream.cluster.tools import require_tools
from txnstream.errors import ClusterError


def parse(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            assert k not in out, f"duplicate key {k}"
            out[k] = v
    return out


# --- server.properties ----------------------------------------------------------------


def test_single_node_properties(tmp_path: Path) -> None:
    layout = ClusterLayout.create(tmp_path, brokers=1, port=19092)
    props = parse(render_server_properties(layout, 1))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19192"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19192"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path.resolve() / "node-1" / "data")
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "default.replication.factor",
                "min.insync.replicas", "share.coordinator.state.topic.replication.factor"):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_three_node_properties(tmp_path: Path) -> None:
    layout = ClusterLayout.create(tmp_path, brokers=3, port=29000, controller_port=29500)
    voters = "1@127.0.0.1:29500,2@127.0.0.1:29501,3@127.0.0.1:29502"
    for node in (1, 2, 3):
        props = parse(render_server_properties(layout, node))
        client, controller = 29000 + node - 1, 29500 + node - 1
        assert props["node.id"] == str(node)
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:{client},"
                                      f"CONTROLLER://127.0.0.1:{controller}")
        assert props["log.dirs"] == str(tmp_path.resolve() / f"node-{node}" / "data")
        assert props["default.replication.factor"] == "3"
        assert props["offsets.topic.replication.factor"] == "3"
        assert props["transaction.state.log.replication.factor"] == "3"
        assert props["transaction.state.log.min.isr"] == "2"
        assert props["min.insync.replicas"] == "2"
        assert props["group.initial.rebalance.delay.ms"] == "0"


def test_every_listener_is_loopback_only(tmp_path: Path) -> None:
    layout = ClusterLayout.create(tmp_path, brokers=3, port=29000)
    for node in layout.node_ids:
        props = parse(render_server_properties(layout, node))
        for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
            hosts = [part.split("//")[-1].split("@")[-1].rsplit(":", 1)[0]
                     for part in props[key].split(",")]
            assert set(hosts) == {"127.0.0.1"}, (key, props[key])


def test_layout_ports_and_bootstrap(tmp_path: Path) -> None:
    one = ClusterLayout.create(tmp_path, 1, 9092)
    assert one.bootstrap == "127.0.0.1:9092"
    assert one.controller_port == 9192
    three = ClusterLayout.create(tmp_path, 3, 30000)
    assert three.bootstrap == "127.0.0.1:30000,127.0.0.1:30001,127.0.0.1:30002"
    assert three.controller_ports() == [30100, 30101, 30102]


@pytest.mark.parametrize("kwargs, words", [
    ({"brokers": 2}, ["1 or 3"]),
    ({"brokers": 3, "port": 30000, "controller_port": 30001}, ["overlap"]),
    ({"port": 80}, ["port 80", "out of range"]),
])
def test_layout_rejects_bad_shapes(tmp_path: Path, kwargs: dict, words: list[str]) -> None:
    with pytest.raises(ClusterError) as err:
        ClusterLayout.create(tmp_path, **kwargs)
    for w in words:
        assert w in str(err.value)


def test_render_rejects_unknown_node(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="node 2"):
        render_server_properties(ClusterLayout.create(tmp_path), 2)


def test_cluster_ids_never_look_like_options() -> None:
    ids = {new_cluster_id() for _ in range(2000)}  # ~1/64 of raw ids start with "-"
    assert len(ids) == 2000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_cluster_file_round_trip(tmp_path: Path) -> None:
    layout = ClusterLayout.create(tmp_path / "state", 3, 31000, 31500)
    cid = new_cluster_id()
    assert len(cid) == 22
    assert read_cluster_file(tmp_path / "state") is None
    write_cluster_file(layout, cid)
    assert read_cluster_file(tmp_path / "state") == (layout, cid)


# --- jar manifest ---------------------------------------------------------------------


def make_jar(path: Path, content: bytes = b"class bytes") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        z.writestr("x/Y.class", content)
    return path


@pytest.fixture
def libs(tmp_path: Path) -> Path:
    d = tmp_path / "libs"
    d.mkdir()
    make_jar(d / "kafka_2.13-9.9.9.jar")
    make_jar(d / "kafka-clients-9.9.9.jar", b"other bytes")
    return d


def test_manifest_of_good_jars_verifies(libs: Path) -> None:
    manifest = build_manifest(libs)
    assert set(manifest) == {"kafka_2.13-9.9.9.jar", "kafka-clients-9.9.9.jar"}
    verify_manifest(libs, manifest)


def test_non_zip_jar_is_named(libs: Path) -> None:
    bad = libs / "broken-1.0.jar"
    bad.write_bytes(b"this is not a zip file at all")
    manifest = build_manifest(libs)  # even with a matching size and hash...
    with pytest.raises(CorruptJarError) as err:
        verify_manifest(libs, manifest)  # ...it is not a zip
    assert err.value.jar == bad
    assert "broken-1.0.jar" in str(err.value) and "not a valid zip" in str(err.value)
    with pytest.raises(CorruptJarError):
        check_zip(bad)


def test_truncated_jar_is_detected(libs: Path) -> None:
    manifest = build_manifest(libs)
    jar = libs / "kafka-clients-9.9.9.jar"
    jar.write_bytes(jar.read_bytes()[:40])
    with pytest.raises(CorruptJarError, match="kafka-clients-9.9.9.jar") as err:
        verify_manifest(libs, manifest)
    assert "expected" in err.value.reason


def test_same_size_changed_jar_fails_the_hash(libs: Path) -> None:
    manifest = build_manifest(libs)
    jar = libs / "kafka_2.13-9.9.9.jar"
    make_jar(jar, b"CLASS BYTES")  # same length, still a valid zip, different bytes
    assert jar.stat().st_size == manifest[jar.name]["size"]
    with pytest.raises(CorruptJarError, match="sha256"):
        verify_manifest(libs, manifest)


def test_missing_jar_is_detected(libs: Path) -> None:
    manifest = build_manifest(libs)
    (libs / "kafka-clients-9.9.9.jar").unlink()
    with pytest.raises(CorruptJarError, match="missing"):
        verify_manifest(libs, manifest)


def test_jar_cache_verify_uses_its_manifest(tmp_path: Path) -> None:
    cache = JarCache(tmp_path, version="9.9.9")
    assert not cache.is_fetched()
    cache.libs.mkdir(parents=True)
    make_jar(cache.libs / "kafka_2.13-9.9.9.jar")
    cache.manifest_path.write_text(json.dumps(build_manifest(cache.libs)))
    assert cache.is_fetched()
    cache.verify()
    (cache.libs / "kafka_2.13-9.9.9.jar").write_bytes(b"garbage")
    with pytest.raises(CorruptJarError, match="kafka_2.13-9.9.9.jar"):
        cache.verify()
    cache.manifest_path.write_text("{not json")
    with pytest.raises(CorruptJarError, match="manifest"):
        cache.verify()
    cache.clear()
    assert not cache.is_fetched() and not cache.libs.exists()


def test_kafka_home_must_look_like_a_release(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="KAFKA_HOME"):
        kafka_home_classpath(tmp_path)
    (tmp_path / "libs").mkdir()
    make_jar(tmp_path / "libs" / "kafka_2.13-9.9.9.jar")
    assert kafka_home_classpath(tmp_path).java_arg == str(tmp_path / "libs" / "*")


# --- tools, pids, ports -----------------------------------------------------------------


def test_missing_java_and_mvn_are_both_named(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ClusterError) as err:
        require_tools(need_mvn=True)
    msg = str(err.value)
    for word in ("`java`", "`mvn`", "KAFKA_HOME", "Java 17", "Maven"):
        assert word in msg


def test_mvn_not_required_when_jars_are_there(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake_java = tmp_path / "java"
    fake_java.write_text("#!/bin/sh\n")
    fake_java.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert require_tools(need_mvn=False) == fake_java
    with pytest.raises(ClusterError, match="`mvn`"):
        require_tools(need_mvn=True)


def test_pid_file_of_a_foreign_process_is_not_ours(tmp_path: Path) -> None:
    """A stale pid file whose pid now belongs to someone else must never be signalled."""
    pid_file = tmp_path / "kafka.pid"
    process.write_pid_file(pid_file, os.getpid())  # alive, but not a broker of this dir
    assert process.owned_pid(pid_file, str(tmp_path / "node-1" / "server.properties")) is None
    own_cmd = process.cmdline(os.getpid())
    assert own_cmd
    assert process.owned_pid(pid_file, own_cmd.split()[0]) == os.getpid()
    pid_file.write_text("not a pid")
    assert process.owned_pid(pid_file, own_cmd.split()[0]) is None


def test_port_in_use_sees_a_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert process.port_in_use(port)
    assert not process.port_in_use(port)


def test_cli_prints_cluster_errors_verbatim(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Broker log lines look like rich markup; the CLI must print them as they are."""
    from txnstream.cli.cluster import _plain_errors

    monkeypatch.delenv("TXNSTREAM_DEBUG", raising=False)
    text = "node 1 exited\n[2026-01-01] ERROR [RaftManager id=1] bad [/tmp/x] (kafka.Kafka)"

    def boom(_args: object) -> int:
        raise ClusterError(text)

    assert _plain_errors(boom)(None) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "[RaftManager id=1] bad [/tmp/x]" in err and "Traceback" not in err
