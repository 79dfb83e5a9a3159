"""The coordinator line's CLI flags reach Config and WorkerSettings (no broker involved)."""

from __future__ import annotations

import argparse
import os

import pytest

from txnstream.cli import _build_parser
from txnstream.cli._common import config_from_args
from txnstream.cli.worker import worker_config_from_args, worker_settings_from_args
from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.errors import ConfigError

LINE_ENV = ("TXNSTREAM_TC_PRINCIPAL", "TXNSTREAM_TC_SECRET", "TXNSTREAM_TC_SECRET_FILE",
            "TXNSTREAM_TC_USERS_FILE", "TXNSTREAM_TC_ADMINS", "TXNSTREAM_TC_TLS_CAFILE",
            "TXNSTREAM_TC_TLS_CERTFILE", "TXNSTREAM_TC_TLS_KEYFILE",
            "TXNSTREAM_TC_TLS_CLIENT_AUTH", "TXNSTREAM_BOOTSTRAP", "TXNSTREAM_TOPIC_PREFIX",
            "TXNSTREAM_KAFKA_CONFIG")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in LINE_ENV:
        monkeypatch.delenv(var, raising=False)


def _parse(*argv: str) -> argparse.Namespace:
    return _build_parser().parse_args(list(argv))


def _secret_file(tmp_path, name: str, secret: str) -> str:
    path = tmp_path / name
    path.write_text(secret + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_no_flags_no_env_gives_the_defaults() -> None:
    config = config_from_args(_parse("txn", "list"))
    assert (config.tc_principal, config.tc_secret) == ("txnstream", None)
    assert config.tc_tls_cafile is None and not config.tc_authenticated
    args = _parse("worker")
    assert worker_settings_from_args(args) == WorkerSettings(
        buffer_role=False)  # the buffer role runs in a child process by default
    assert worker_config_from_args(args).admins == {"txnstream"}


def test_global_line_flags_reach_the_config(tmp_path) -> None:
    secret = _secret_file(tmp_path, "alice.secret", "s3cret-Alice")
    for command in (["txn", "list"], ["top", "--once"], ["produce", "t"], ["consume", "t"],
                    ["demo"], ["worker"]):
        args = _parse("--tc-principal", "alice", "--tc-secret-file", secret,
                      "--tc-tls-ca", "/pki/ca.pem", "--tc-tls-cert", "/pki/alice.pem",
                      "--tc-tls-key", "/pki/alice.key", *command)
        config = config_from_args(args)
        assert config.tc_principal == "alice", command
        assert config.tc_secret == "s3cret-Alice"  # white space around it dropped
        assert (config.tc_tls_cafile, config.tc_tls_certfile, config.tc_tls_keyfile) == (
            "/pki/ca.pem", "/pki/alice.pem", "/pki/alice.key")
        assert "s3cret-Alice" not in repr(config)


def test_there_is_no_flag_taking_the_secret_itself(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--tc-secret", "s3cret-Cli", "txn", "list"], ["--tc-secret=s3cret-Cli", "top"]):
        with pytest.raises(SystemExit) as exc:
            _parse(*argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--tc-secret-file" in err  # says what to do instead
        assert "s3cret-Cli" not in err  # not taken for a file name and echoed back
    help_text = _build_parser().format_help()
    assert "--tc-secret-file" in help_text and "--tc-secret " not in help_text


def test_flags_override_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_secret = _secret_file(tmp_path, "env.secret", "from-env-file")
    flag_secret = _secret_file(tmp_path, "flag.secret", "from-flag-file")
    monkeypatch.setenv("TXNSTREAM_TC_PRINCIPAL", "env-user")
    monkeypatch.setenv("TXNSTREAM_TC_SECRET_FILE", env_secret)
    monkeypatch.setenv("TXNSTREAM_TC_TLS_CAFILE", "/env/ca.pem")
    monkeypatch.setenv("TXNSTREAM_TC_USERS_FILE", "/env/users")
    monkeypatch.setenv("TXNSTREAM_TC_ADMINS", "ops, audit")
    monkeypatch.setenv("TXNSTREAM_TC_TLS_CLIENT_AUTH", "1")

    from_env = worker_config_from_args(_parse("worker"))
    assert (from_env.tc_principal, from_env.tc_secret) == ("env-user", "from-env-file")
    assert from_env.tc_users_file == "/env/users" and from_env.tc_tls_cafile == "/env/ca.pem"
    assert from_env.tc_admins == ("ops", "audit") and from_env.tc_tls_client_auth

    config = worker_config_from_args(_parse(
        "--tc-principal", "flag-user", "--tc-secret-file", flag_secret,
        "--tc-tls-ca", "/flag/ca.pem", "worker", "--tc-users-file", "/flag/users",
        "--tc-admin", "root", "--no-tls-client-auth"))
    assert (config.tc_principal, config.tc_secret) == ("flag-user", "from-flag-file")
    assert config.tc_tls_cafile == "/flag/ca.pem" and config.tc_users_file == "/flag/users"
    assert config.tc_admins == ("root",) and config.admins == {"root"}
    assert config.tc_tls_client_auth is False

    monkeypatch.setenv("TXNSTREAM_TC_SECRET", "from-env-var")
    assert config_from_args(_parse("txn", "list")).tc_secret == "from-env-var"
    assert config_from_args(_parse("--tc-secret-file", flag_secret, "txn", "list")) \
        .tc_secret == "from-flag-file"


def test_worker_auth_flags(tmp_path) -> None:
    users = tmp_path / "users"
    users.write_text("bob=b0b\n")
    config = worker_config_from_args(_parse(
        "--tc-tls-ca", "/pki/ca.pem", "--tc-tls-cert", "/pki/w.pem", "worker",
        "--tc-users-file", str(users), "--tc-admin", "ops", "--tc-admin", "txnstream",
        "--tls-client-auth"))
    assert config.tc_users_file == str(users)
    assert config.tc_admins == ("ops", "txnstream") and config.admins == {"ops", "txnstream"}
    assert config.tc_tls_client_auth and config.tc_authenticated
    assert not worker_settings_from_args(_parse("worker")).allow_unauthenticated
    assert worker_settings_from_args(
        _parse("worker", "--allow-unauthenticated")).allow_unauthenticated


def test_worker_limit_flags_reach_worker_settings() -> None:
    args = _parse("worker", "--listen", "0.0.0.0:7070", "--advertise", "w1:7070",
                  "--max-connections", "64", "--max-open-txns-per-principal", "500",
                  "--idle-timeout-s", "30.5", "--max-request-bytes", "65536",
                  "--max-inflight-per-connection", "100", "--buffer-in-process",
                  "--session-timeout-ms", "6000")
    s = worker_settings_from_args(args)
    assert (s.max_connections, s.max_open_txns_per_principal, s.idle_timeout_s,
            s.max_request_bytes, s.max_inflight_per_connection) == (64, 500, 30.5, 65536, 100)
    assert (s.listen, s.advertise, s.session_timeout_ms) == ("0.0.0.0:7070", "w1:7070", 6000)
    assert s.buffer_role and not s.allow_unauthenticated
    assert not worker_settings_from_args(_parse("worker", "--no-buffer-role")).buffer_role


def test_the_tc_assignment_strategy_flag_reaches_the_settings_and_the_group() -> None:
    from txnstream.coordinator.kafka_clients import worker_clients

    assert worker_settings_from_args(_parse("worker")).tc_assignment_strategy == \
        "cooperative-sticky"
    s = worker_settings_from_args(_parse("worker", "--tc-assignment-strategy", "range"))
    assert s.tc_assignment_strategy == "range"
    assert worker_settings_from_args(
        _parse("worker", "--slow-request-s", "0.25")).slow_request_s == 0.25

    class Factory:  # what worker_clients asks for, without a broker
        def consumer(self, conf):
            return conf

        def producer(self, conf):
            return conf

        def admin(self, conf):
            return conf

    cfg = Config(bootstrap_servers="127.0.0.1:1")
    made = worker_clients(cfg, "w", s, Factory())  # type: ignore[arg-type]
    assert made.consumer["partition.assignment.strategy"] == "range"
    with pytest.raises(ConfigError, match="tc_assignment_strategy 'roundrobin'"):
        worker_clients(cfg, "w", WorkerSettings(tc_assignment_strategy="roundrobin"),
                       Factory())  # type: ignore[arg-type]


@pytest.mark.parametrize("flag,value", [
    ("--max-connections", "0"), ("--max-connections", "many"),
    ("--max-open-txns-per-principal", "-1"), ("--idle-timeout-s", "0"),
    ("--idle-timeout-s", "nan"), ("--idle-timeout-s", "inf"),
    ("--max-request-bytes", "1.5"), ("--max-inflight-per-connection", "0"),
    ("--read-share", "0"), ("--read-share", "1.5"), ("--read-share", "nan"),
    ("--read-share", "half"), ("--read-burst-s", "0"), ("--read-burst-s", "inf"),
    ("--tc-assignment-strategy", "roundrobin"), ("--slow-request-s", "0"),
    ("--slow-request-s", "nan"),
])
def test_bad_limits_are_refused_naming_the_flag(flag: str, value: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse("worker", flag, value)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_bad_principals_and_secret_files_are_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="tc_principal"):
        config_from_args(_parse("--tc-principal", "no spaces", "txn", "list"))
    with pytest.raises(ConfigError, match="tc_admins"):
        worker_config_from_args(_parse("worker", "--tc-admin", "bad name"))
    with pytest.raises(ConfigError, match="--tc-secret-file"):
        config_from_args(_parse("--tc-secret-file", str(tmp_path / "missing"), "txn", "list"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        config_from_args(_parse("--tc-secret-file", str(empty), "txn", "list"))


def test_errors_never_show_the_secret(tmp_path) -> None:
    secret = _secret_file(tmp_path, "s", "pw-Line-5e5e")
    with pytest.raises(ConfigError) as err:
        config_from_args(_parse("--tc-secret-file", secret, "--tc-principal", "bad name",
                                "txn", "list"))
    assert "pw-Line-5e5e" not in str(err.value)
    assert isinstance(config_from_args(_parse("--tc-secret-file", secret, "txn", "list")),
                      Config)


def test_the_line_caps_reach_the_worker_settings_and_its_listener():
    args = _parse("worker", "--max-handshakes", "9", "--max-handshakes-per-host", "3",
                  "--max-queued-per-connection", "17", "--max-queued-bytes-per-connection",
                  "4096", "--max-queued-bytes", "65536", "--read-share", "0.2",
                  "--read-burst-s", "0.5")
    s = worker_settings_from_args(args)
    assert (s.max_handshakes, s.max_handshakes_per_host, s.max_queued_per_connection,
            s.max_queued_bytes_per_connection, s.max_queued_bytes) == (9, 3, 17, 4096, 65536)
    assert (s.read_share, s.read_burst_s) == (0.2, 0.5)
    assert worker_settings_from_args(_parse("worker")) == WorkerSettings(
        buffer_role=worker_settings_from_args(_parse("worker")).buffer_role)
