"""The workers' key (issue 33 item 8): no marker is an offline oracle for the line's secret.

On the old code the marker key was one HMAC of the workers' line secret, and a secret
had no strength check: a reader of any data topic recovered ``Summer2026!`` from one
marker in 13,135 guesses (0.11 s), and with it spoke on the line as the workers' admin.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat

import pytest

from txnstream.buffer.worker import BufferWorker
from txnstream.config import Config
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import ConfigError
from txnstream.markers import TXN_MAC_HEADER, MarkerKind, MarkerSigner, TxnMarker
from txnstream.types import TxnID
from txnstream.workers_key import (
    check_secret_strength,
    default_key_path,
    generate_key_file,
    load_key_file,
    root_key,
    workers_signer,
)

CLUSTER = "cluster-A"


@pytest.fixture
def no_key_home(tmp_path, monkeypatch):
    """No workers' key anywhere: $TXNSTREAM_HOME an empty directory, no key file given."""
    home = tmp_path / "home"
    monkeypatch.setenv("TXNSTREAM_HOME", str(home))
    monkeypatch.delenv("TXNSTREAM_WORKERS_KEY_FILE", raising=False)
    return home


def one_hmac_tag(secret: str, topic: str, partition: int, value: bytes) -> bytes:
    """The old marker tag: a guess of the secret costs one HMAC to check."""
    key = hmac.new(secret.encode(), b"txnstream marker key v1", hashlib.sha256).digest()
    return MarkerSigner(key, CLUSTER).tag(topic, partition, value)


@pytest.mark.parametrize("secret", ["Summer2026!", "s3cret", "aaaaaaaaaaaaaaaaaaaaaaaa",
                                    "abababababababababab"])
def test_weak_secrets_are_refused_naming_the_setting(secret):
    with pytest.raises(ConfigError, match=r"tc_secret\) is too weak"):
        root_key(Config("127.0.0.1:1", tc_secret=secret))


def test_a_worker_with_a_weak_secret_refuses_to_start():
    with pytest.raises(ConfigError, match="too weak"):
        CoordinatorWorker(Config("127.0.0.1:1", tc_secret="Summer2026!"))


def test_a_marker_tag_is_no_one_hmac_of_the_secret():
    secret = "a long-enough workers' secret"
    signer = workers_signer(Config("127.0.0.1:1", tc_secret=secret), CLUSTER)
    assert signer is not None
    m = TxnMarker(TxnID(0, 1), MarkerKind.COMMIT, 0)
    v = m.encode()
    tag = dict(signer.headers(m, "t", 0, v))[TXN_MAC_HEADER]
    assert tag != one_hmac_tag(secret, "t", 0, v)
    assert signer.verify("t", 0, v, signer.headers(m, "t", 0, v))


def test_old_markers_verify_only_where_the_old_rules_apply():
    secret = "a long-enough workers' secret"
    signer = workers_signer(Config("127.0.0.1:1", tc_secret=secret), CLUSTER)
    assert signer is not None
    m = TxnMarker(TxnID(0, 1), MarkerKind.COMMIT, 0)
    v = m.encode()
    old = [*m.headers(), (TXN_MAC_HEADER, one_hmac_tag(secret, "t", 0, v))]
    assert signer.verify("t", 0, v, old, legacy=True)
    assert not signer.verify("t", 0, v, old)


def test_a_key_file_is_random_private_and_kept(tmp_path):
    path = tmp_path / "keys" / "workers.key"
    assert generate_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = load_key_file(path)
    assert len(key) == 32
    assert not generate_key_file(path)  # never overwritten
    assert load_key_file(path) == key
    other = tmp_path / "other.key"
    generate_key_file(other)
    assert load_key_file(other) != key
    a = workers_signer(Config("127.0.0.1:1", workers_key_file=str(path)), CLUSTER)
    b = workers_signer(Config("127.0.0.1:1", workers_key_file=str(path)), CLUSTER)
    assert a is not None and b is not None and a.membership is not None
    assert b.membership is not None
    assert a.membership.txn_key(TxnID(0, 1)) == b.membership.txn_key(TxnID(0, 1))
    # the key file wins over a secret: the secret is then only the line's
    c = workers_signer(Config("127.0.0.1:1", workers_key_file=str(path), tc_secret="short"),
                       CLUSTER)
    assert c is not None and c.membership is not None
    assert c.membership.txn_key(TxnID(0, 1)) == a.membership.txn_key(TxnID(0, 1))


@pytest.mark.parametrize("text, says", [("", "0 bytes, at least 32"), ("zz", "not a hex key"),
                                        ("ab" * 8, "8 bytes, at least 32")])
def test_a_bad_key_file_is_refused_naming_it(tmp_path, text, says):
    path = tmp_path / "workers.key"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as err:
        load_key_file(path)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_key_file(tmp_path / "missing.key")


def test_no_key_no_secret_no_signer(no_key_home):
    assert workers_signer(Config("127.0.0.1:1"), CLUSTER) is None
    check_secret_strength("correct horse battery staple", "x")  # a passphrase passes


# ---------------------------------------------------------------- signed by default
# (issue 33 item 6). On the old code a worker with no secret and no key file started and
# ran unsigned (only a warning in its log), so on a default deployment, or one secured by
# mutual TLS alone, any producer of a data topic could forge markers.


def test_the_default_key_path_is_under_txnstream_home_else_the_users_config(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TXNSTREAM_HOME", str(tmp_path / "th"))
    assert default_key_path() == tmp_path / "th" / "workers.key"
    monkeypatch.delenv("TXNSTREAM_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert default_key_path() == tmp_path / "user" / ".config" / "txnstream" / "workers.key"


def test_a_worker_without_any_key_refuses_to_start_naming_unsigned(no_key_home):
    for start in (lambda: CoordinatorWorker(Config("127.0.0.1:1")),
                  lambda: BufferWorker(Config("127.0.0.1:1"))):
        with pytest.raises(ConfigError) as err:
            start()
        says = str(err.value)
        assert "--unsigned" in says and "txnstream keygen" in says, says
        assert str(no_key_home / "workers.key") in says, says
        assert "--workers-key-file" in says, says


def test_without_a_configured_key_workers_take_the_default_key_file(no_key_home):
    generate_key_file(no_key_home / "workers.key")
    key = load_key_file(no_key_home / "workers.key")
    assert root_key(Config("127.0.0.1:1")) == key
    a = workers_signer(Config("127.0.0.1:1"), CLUSTER)
    b = workers_signer(Config("127.0.0.1:1", workers_key_file=str(no_key_home / "workers.key")),
                       CLUSTER)
    assert a is not None and b is not None and a.membership is not None
    assert b.membership is not None
    assert a.membership.txn_key(TxnID(0, 1)) == b.membership.txn_key(TxnID(0, 1))


def test_mutual_tls_alone_signs_with_the_default_key_file(no_key_home):
    """Every mode of authentication: mutual TLS and no secret still finds the key."""
    generate_key_file(no_key_home / "workers.key")
    tls_only = Config("127.0.0.1:1", tc_tls_certfile="/pki/worker.pem",
                      tc_tls_keyfile="/pki/worker.key", tc_tls_cafile="/pki/ca.pem",
                      tc_tls_client_auth=True)
    assert tls_only.tc_authenticated and tls_only.tc_secret is None
    assert root_key(tls_only) == load_key_file(no_key_home / "workers.key")
    signer = workers_signer(tls_only, CLUSTER)
    assert signer is not None and signer.membership is not None


def test_a_secret_wins_over_the_default_key_file(no_key_home):
    """Deployments that gave their workers a secret keep their key."""
    generate_key_file(no_key_home / "workers.key")
    secret = "a long-enough workers' secret"
    from_secret = workers_signer(Config("127.0.0.1:1", tc_secret=secret), CLUSTER)
    assert from_secret is not None and from_secret.membership is not None
    assert from_secret.membership.txn_key(TxnID(0, 1)) == \
        MarkerSigner.from_secret(secret, CLUSTER).membership.txn_key(TxnID(0, 1))


@pytest.mark.parametrize("configured", [True, False])
def test_a_bad_or_unreadable_key_file_stops_the_worker_naming_it(no_key_home, configured):
    path = no_key_home / "workers.key"
    path.parent.mkdir(parents=True)
    path.write_text("zz")
    cfg = Config("127.0.0.1:1", workers_key_file=str(path) if configured else None)
    with pytest.raises(ConfigError, match="not a hex key") as err:
        CoordinatorWorker(cfg)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read") as err:
        CoordinatorWorker(Config("127.0.0.1:1", workers_key_file=str(path) + ".missing"))
    assert str(path) + ".missing" in str(err.value)


def test_unsigned_is_a_setting_of_both_roles():
    assert WorkerSettings().unsigned is False
    assert WorkerSettings(unsigned=True).unsigned is True
