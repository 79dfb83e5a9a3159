"""A fresh deployment has a workers' key without anyone making one (issue 33 item 6).

`txnstream keygen`, the key `init` and `cluster up` make, the `--workers-key-file` and
`--unsigned` flags, and a `txnstream worker` with no key refusing to start. No broker:
`init`'s topics and `cluster up`'s brokers are stand-ins here (tests/integration/test_init.py
runs `init` on a real broker).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from txnstream.cli import _build_parser, main
from txnstream.cli.worker import worker_config_from_args, worker_settings_from_args
from txnstream.workers_key import load_key_file

KEY_ENV = ("TXNSTREAM_WORKERS_KEY_FILE", "TXNSTREAM_TC_SECRET", "TXNSTREAM_TC_SECRET_FILE")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TXNSTREAM_HOME an empty directory; no key file or secret in the environment."""
    for var in KEY_ENV:
        monkeypatch.delenv(var, raising=False)
    h = tmp_path / "home"
    monkeypatch.setenv("TXNSTREAM_HOME", str(h))
    return h


def test_keygen_writes_a_private_key_and_never_overwrites_it(tmp_path, home, capsys):
    path = tmp_path / "keys" / "workers.key"
    assert main(["keygen", str(path)]) == 0
    out = capsys.readouterr().out
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = load_key_file(path)
    assert len(key) == 32
    assert str(path) in out.replace("\n", "") and "every worker" in out
    assert main(["keygen", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err.replace("\n", "") and "never overwritten" in err
    assert load_key_file(path) == key
    # --if-missing: what a deployment's init step runs every time
    assert main(["keygen", "--if-missing", str(path)]) == 0
    assert load_key_file(path) == key


def test_keygen_without_a_file_writes_the_key_workers_look_for(home, capsys):
    assert main(["keygen"]) == 0
    assert len(load_key_file(home / "workers.key")) == 32
    given = home / "given.key"
    assert main(["--workers-key-file", str(given), "keygen"]) == 0
    assert len(load_key_file(given)) == 32


def test_the_workers_key_file_flag_and_unsigned_reach_config_and_settings(home, monkeypatch):
    args = _build_parser().parse_args(["--workers-key-file", "/keys/w.key", "worker"])
    assert worker_config_from_args(args).workers_key_file == "/keys/w.key"
    assert worker_settings_from_args(args).unsigned is False
    unsigned = _build_parser().parse_args(["worker", "--unsigned"])
    assert worker_settings_from_args(unsigned).unsigned is True
    monkeypatch.setenv("TXNSTREAM_WORKERS_KEY_FILE", "/keys/env.key")
    assert worker_config_from_args(_build_parser().parse_args(["worker"])) \
        .workers_key_file == "/keys/env.key"
    assert worker_config_from_args(args).workers_key_file == "/keys/w.key"  # the flag wins


def test_a_worker_without_a_key_refuses_to_start_naming_the_flag(home, capsys):
    """Old: it started unsigned, and said so only in a warning."""
    assert main(["--bootstrap", "127.0.0.1:1", "worker"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "--unsigned" in err and "txnstream keygen" in err, err
    assert "Traceback" not in err


def _fake_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    import txnstream.cli.init as init

    monkeypatch.setattr(init, "ensure_topics", lambda config: [
        SimpleNamespace(name=config.topics.log, partitions=4, status="exists", detail="")])


def test_init_makes_the_default_key_once(home, monkeypatch, capsys):
    """Old: init made topics only; a worker then ran unsigned."""
    _fake_topics(monkeypatch)
    assert main(["init"]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    key = load_key_file(home / "workers.key")
    assert "made" in out and str(home / "workers.key") in out
    assert stat.S_IMODE(os.stat(home / "workers.key").st_mode) == 0o600
    assert main(["init"]) == 0
    assert load_key_file(home / "workers.key") == key  # kept
    assert "made" not in capsys.readouterr().out


def test_init_leaves_a_deployment_with_a_secret_or_a_key_file_as_it_is(
        tmp_path, home, monkeypatch, capsys):
    _fake_topics(monkeypatch)
    secret = tmp_path / "secret"
    secret.write_text("a long-enough workers' secret\n")
    assert main(["--tc-secret-file", str(secret), "init"]) == 0
    assert "secret" in capsys.readouterr().out
    given = tmp_path / "given.key"
    assert main(["--workers-key-file", str(given), "init"]) == 0
    assert "txnstream keygen" in capsys.readouterr().out.replace("\n", " ")
    assert not given.exists() and not (home / "workers.key").exists()


def test_cluster_up_makes_the_default_key(tmp_path, home, monkeypatch, capsys):
    import txnstream.cli.cluster as cluster_cli

    class FakeCluster:
        def __init__(self, state_dir, **kwargs):
            self.state_dir = state_dir
            self.bootstrap = "127.0.0.1:9092"
            self.client_properties = None
            self.brokers = 1
            self.last_up = SimpleNamespace(started=False)

        def up(self, timeout_s):
            pass

        def status(self):
            return []

    monkeypatch.setattr(cluster_cli, "LocalCluster", FakeCluster)
    assert main(["cluster", "up", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert len(load_key_file(home / "workers.key")) == 32
    assert str(home / "workers.key") in out


def test_init_where_the_default_key_cannot_be_made_still_succeeds_and_says_so(
        tmp_path, home, monkeypatch, capsys):
    """A container user with no home (uid 65534, HOME=/nonexistent) runs init too."""
    _fake_topics(monkeypatch)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("TXNSTREAM_HOME", str(blocked / "sub"))
    assert main(["init"]) == 0
    assert "cannot make" in capsys.readouterr().out.replace("\n", " ")
