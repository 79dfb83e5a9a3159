"""Certificates for the coordinator line's TLS and mutual TLS, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certs(d: Path) -> dict[str, str]:
    """A CA, a worker certificate for 127.0.0.1 (CN ``worker``), a client certificate
    (CN ``client``) and one whose CN is ``anonymous`` in ``d``: file name -> path."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
        "ca.pem", "-days", "1", "-subj", "/CN=txnstream-test-ca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("worker", ["-extfile", "san.cnf"]), ("client", []),
                      ("anonymous", [])):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)
    return {k: str(d / f"{k}") for k in ("ca.pem", "worker.pem", "worker.key", "client.pem",
                                         "client.key", "anonymous.pem", "anonymous.key")}
