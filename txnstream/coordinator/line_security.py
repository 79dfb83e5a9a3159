"""How the direct line proves who is at each end: secrets, frame tags, TLS.

The handshake of :mod:`txnstream.coordinator.transport` uses these: a worker names its
cluster (:func:`cluster_identity`), a client proves its principal with
``HMAC-SHA256(secret, "client" | sn | cn | principal | cluster)``
(:func:`handshake_proof`), a worker answers with the ``"worker"`` proof, and every later
frame of a keyed connection carries a tag (:class:`FrameKey`). With TLS, the worker's
certificate (:func:`server_ssl_context`) and, under mutual TLS, the client's
(:func:`cert_common_name`) do the same. :func:`line_users` is who a worker lets in by
secret; :func:`is_loopback` tells a listen address nobody else can reach.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
from typing import Any

from txnstream.config import Config, load_tc_users
from txnstream.errors import ConfigError

__all__ = [
    "PROOF_BYTES",
    "TAG_BYTES",
    "MAX_CLUSTER_BYTES",
    "FrameKey",
    "cert_common_name",
    "client_ssl_context",
    "cluster_identity",
    "guarded_line_users",
    "handshake_proof",
    "is_loopback",
    "line_users",
    "server_ssl_context",
]

PROOF_BYTES = 32
TAG_BYTES = 16
"""Per-frame HMAC-SHA256 tag, truncated (128 bits, as TLS's GCM tags)."""


MAX_CLUSTER_BYTES = 512
"""Bound of a cluster's name on the line (a Kafka cluster id and a topic prefix)."""


def cluster_identity(kafka_cluster_id: str | None, prefix: str) -> bytes:
    """What a worker's hello names: its Kafka cluster and its topics' prefix.

    Two txnstream clusters (two prefixes on one Kafka, or one prefix on two) may share
    the workers' secret, as two worker fleets on one host share the default key file; a
    client only talks to a worker of its own (an endpoint record of its cluster can name
    an address that another cluster's worker took since).
    """
    return f"{kafka_cluster_id or ''}/{prefix}".encode()[:MAX_CLUSTER_BYTES]


def handshake_proof(secret: str | None, label: bytes, sn: bytes, cn: bytes,
                    principal: bytes, cluster: bytes = b"") -> bytes:
    """``HMAC-SHA256(secret, label | sn | cn | principal | cluster)``; zeros without one.

    The cluster is the one the worker's hello named: a relay cannot rename it.
    """
    if not secret:
        return bytes(PROOF_BYTES)
    return hmac.digest(secret.encode(), label + sn + cn + principal + cluster, "sha256")


class FrameKey:
    """Tags and checks the frames of one keyed connection, in both directions."""

    __slots__ = ("_key", "_out", "_in", "_sent", "_received")

    def __init__(self, secret: str, sn: bytes, cn: bytes, principal: bytes,
                 client_side: bool) -> None:
        self._key = hmac.digest(secret.encode(), b"session" + sn + cn + principal, "sha256")
        self._out, self._in = (b"C", b"S") if client_side else (b"S", b"C")
        self._sent = 0
        self._received = 0

    def seal(self, payload: bytes) -> bytes:
        """``payload`` and its tag (frames must be sealed in the order they are sent)."""
        tag = hmac.digest(self._key, self._out + self._sent.to_bytes(8, "big") + payload,
                          "sha256")[:TAG_BYTES]
        self._sent += 1
        return payload + tag

    def open(self, frame: bytes) -> bytes:
        """The payload of the next frame received; ``ValueError`` if its tag is wrong."""
        if len(frame) < TAG_BYTES:
            raise ValueError("a frame too short to carry its tag")
        payload, tag = frame[:-TAG_BYTES], frame[-TAG_BYTES:]
        want = hmac.digest(self._key, self._in + self._received.to_bytes(8, "big") + payload,
                           "sha256")[:TAG_BYTES]
        if not hmac.compare_digest(tag, want):
            raise ValueError(f"frame {self._received} failed its authentication tag "
                             "(altered, injected or replayed)")
        self._received += 1
        return payload



def cert_common_name(cert: Any) -> str | None:
    """The common name of a verified peer certificate (mutual TLS), if any."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str):
                return value
    return None


def server_ssl_context(config: Config) -> ssl.SSLContext | None:
    """TLS for a worker's listener when ``config`` names a certificate, else None."""
    if not config.tc_tls_certfile:
        if config.tc_tls_client_auth:
            raise ConfigError("tc_tls_client_auth needs tc_tls_certfile (the worker's own "
                              "certificate) and tc_tls_cafile")
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tc_tls_certfile, config.tc_tls_keyfile)
    if config.tc_tls_client_auth:
        if not config.tc_tls_cafile:
            raise ConfigError("tc_tls_client_auth needs tc_tls_cafile to verify clients")
        ctx.load_verify_locations(config.tc_tls_cafile)
        # OPTIONAL, not REQUIRED: a certificate shown must verify, and one not shown is
        # refused by the listener's own handshake, so the client learns why (with
        # REQUIRED, TLS 1.3 only closes the connection once the client's side is done)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_ssl_context(config: Config) -> ssl.SSLContext | None:
    """TLS toward workers when ``config`` names a CA, else None."""
    if not config.tc_tls_cafile:
        return None
    ctx = ssl.create_default_context(cafile=config.tc_tls_cafile)
    if config.tc_tls_certfile:
        ctx.load_cert_chain(config.tc_tls_certfile, config.tc_tls_keyfile)
    return ctx



def line_users(config: Config) -> dict[str, str]:
    """Every principal a worker lets in by secret: its own, and the users file's."""
    users = load_tc_users(config.tc_users_file) if config.tc_users_file else {}
    if config.tc_secret:
        users.setdefault(config.tc_principal, config.tc_secret)
    return users


def guarded_line_users(config: Config, listen: str, allow_unauthenticated: bool,
                       who: str) -> dict[str, str]:
    """:func:`line_users` of a worker listening on ``listen``, checked.

    ``ConfigError`` if no one would have to prove anything there and it is reachable
    from other hosts (unless ``allow_unauthenticated``).
    """
    users = line_users(config)
    host = listen.rsplit(":", 1)[0]
    if not users and not config.tc_tls_client_auth and not is_loopback(host) \
            and not allow_unauthenticated:
        raise ConfigError(
            f"{who} would serve the coordinator line on {listen} with no authentication: "
            "anyone who reaches it could end every txn. Set a secret (TXNSTREAM_TC_SECRET "
            "/ TXNSTREAM_TC_SECRET_FILE, or --tc-users-file), mutual TLS "
            "(--tls-client-auth), listen on loopback, or pass --allow-unauthenticated")
    return users


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this host only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
