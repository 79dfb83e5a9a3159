"""The chaos checker's own marker check agrees with the workers' key (issue 33 items 6, 8).

The checker computes a marker's tag itself, so it does not trust the code it checks. On
the old code it computed version 1's tag (one HMAC of the workers' secret), which the
workers no longer write: every genuine marker looked forged to it. Its workers now hold a
key file, as a deployment's do, and the harness checks with that key.
"""

from __future__ import annotations

from chaos.credentials import WORKER, Credentials
from chaos.reader import MarkerCheck
from txnstream.markers import MarkerKind, MarkerSigner, TxnMarker
from txnstream.types import TxnID
from txnstream.workers_key import load_key_file


def test_the_checker_verifies_the_workers_markers_and_nothing_else(tmp_path):
    creds = Credentials.create(tmp_path / "secrets")
    env = creds.worker_env()
    assert env["TXNSTREAM_WORKERS_KEY_FILE"] == str(creds.workers_key_file)
    assert env["TXNSTREAM_TC_PRINCIPAL"] == WORKER
    root = load_key_file(creds.workers_key_file)
    signer = MarkerSigner.from_root(root, "cluster-A")
    check = MarkerCheck.from_key_file(creds.workers_key_file, "cluster-A")
    m = TxnMarker(TxnID(1, 7), MarkerKind.COMMIT, 3)
    v = m.encode()
    headers = signer.headers(m, "chaos-in", 2, v)
    assert check.genuine("chaos-in", 2, v, headers)
    assert not check.genuine("chaos-in", 3, v, headers)  # copied to another partition
    assert not check.genuine("chaos-in", 2, v, m.headers())  # no tag
    other = MarkerCheck.from_key_file(creds.workers_key_file, "cluster-B")
    assert not other.genuine("chaos-in", 2, v, headers)  # another cluster
    old = MarkerSigner.from_secret(creds.secrets[WORKER], "cluster-A")
    assert not check.genuine("chaos-in", 2, v, old.headers(m, "chaos-in", 2, v))
