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

from txnstream.config import Config
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import ConfigError
from txnstream.markers import TXN_MAC_HEADER, MarkerKind, MarkerSigner, TxnMarker
from txnstream.types import TxnID
from txnstream.workers_key import (
    check_secret_strength,
    generate_key_file,
    load_key_file,
    root_key,
    workers_signer,
)

CLUSTER = "cluster-A"


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


def test_no_key_no_secret_no_signer():
    assert workers_signer(Config("127.0.0.1:1"), CLUSTER) is None
    check_secret_strength("correct horse battery staple", "x")  # a passphrase passes
