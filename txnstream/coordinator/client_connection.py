"""``ClientConnection``: a client's end of the line to one worker (:mod:`.transport`).

The handshake's client side: it checks that the worker serves the client's cluster, proves
the client's secret, and insists on the worker's proof of it (or on TLS that verified the
worker's certificate) before it sends anything.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import ssl
from collections.abc import Callable

from txnstream.coordinator.line_security import (
    MAX_CLUSTER_BYTES,
    PROOF_BYTES,
    FrameKey,
    handshake_proof,
)
from txnstream.coordinator.transport import (
    CLUSTER_LEN,
    MAGIC,
    MAX_PRINCIPAL_BYTES,
    NONCE_BYTES,
    Endpoint,
    IoLoop,
    _Conn,
    _read_frame,
    line_mismatch,
    log,
)
from txnstream.errors import (
    ConfigError,
    CoordinatorAuthError,
    WorkerIdentityError,
    WrongClusterError,
)

__all__ = ["ClientConnection"]


def _wrong_cluster(endpoint: Endpoint, theirs: bytes, ours: bytes) -> WrongClusterError:
    return WrongClusterError(
        f"the coordinator worker at {endpoint} serves cluster "
        f"{theirs.decode(errors='replace')!r}, not {ours.decode(errors='replace')!r}: not "
        "talking to it (an endpoint record that is stale or forged)")


class ClientConnection(_Conn):
    """A client's connection to one worker; replies go to ``on_reply`` on the loop thread."""

    @classmethod
    def open(cls, io: IoLoop, endpoint: Endpoint, secret: str | None,
             tls: ssl.SSLContext | None, on_reply: Callable[[bytes], None],
             on_close: Callable[[ClientConnection], None], timeout_s: float,
             principal: str = "txnstream", cluster: bytes = b"") -> ClientConnection:
        """Connect and handshake as ``principal`` (proving ``secret`` if given).

        Only a worker of ``cluster`` (:func:`~.line_security.cluster_identity`) is talked
        to.

        ``OSError`` if unreachable or the worker is at its connection cap,
        ``WrongClusterError`` if the worker serves another cluster,
        ``CoordinatorAuthError`` if refused or if the worker cannot prove it knows
        the secret.
        """
        name = principal.encode()
        if not 0 < len(name) <= MAX_PRINCIPAL_BYTES:
            raise ConfigError(f"tc_principal {principal!r} is not 1-{MAX_PRINCIPAL_BYTES} "
                              "bytes")

        # A certificate proves the worker only on TLS that verified it (Kafka fixes the
        # security protocol by the client's configuration, never by the server's answer).
        verified_tls = tls is not None and tls.verify_mode == ssl.CERT_REQUIRED

        async def connect() -> ClientConnection:
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=tls,
                server_hostname=endpoint.host if tls is not None else None)
            try:
                hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
                if hello[:len(MAGIC)] != MAGIC:
                    raise ConnectionError(f"{endpoint}: "
                                          f"{line_mismatch(hello[:len(MAGIC)], 'worker')}")
                sn, cn = hello[len(MAGIC):], os.urandom(NONCE_BYTES)
                (size,) = CLUSTER_LEN.unpack(await reader.readexactly(CLUSTER_LEN.size))
                if size > MAX_CLUSTER_BYTES:
                    raise ConnectionError(f"{endpoint}: a hello naming a cluster of {size} "
                                          f"bytes (at most {MAX_CLUSTER_BYTES})")
                theirs = await reader.readexactly(size)
                if theirs and theirs != cluster:  # empty: a worker starting (refuses BY)
                    raise _wrong_cluster(endpoint, theirs, cluster)
                writer.write(MAGIC + cn + bytes([len(name)]) + name
                             + handshake_proof(secret, b"client", sn, cn, name, theirs))
                verdict = await reader.readexactly(2)
                if verdict != b"OK":
                    why = (await reader.read(200)).decode(errors="replace")
                    if verdict == b"BY":
                        raise ConnectionError(f"the coordinator worker at {endpoint} is "
                                              f"busy: {why}")
                    raise CoordinatorAuthError(
                        f"the coordinator worker at {endpoint} refused this client: {why}")
                if theirs != cluster:
                    raise _wrong_cluster(endpoint, theirs, cluster)
                mode = await reader.readexactly(1)
                worker_proof = await reader.readexactly(PROOF_BYTES)
                key: FrameKey | None = None
                if mode == b"K" and secret:
                    if not hmac.compare_digest(worker_proof,
                                               handshake_proof(secret, b"worker", sn, cn, name,
                                                               theirs)):
                        raise WorkerIdentityError(
                            f"the coordinator worker at {endpoint} could not prove it knows "
                            f"the secret of {principal!r}: not talking to it (a forged "
                            "endpoint, or a relay)")
                    key = FrameKey(secret, sn, cn, name, client_side=True)
                elif secret and mode == b"T" and not verified_tls:
                    raise WorkerIdentityError(
                        f"the coordinator worker at {endpoint} could not prove who it is: "
                        "it answered that a certificate identified this client, but this "
                        "connection has no verified TLS, and the worker did not prove it "
                        f"knows the secret of {principal!r}: not talking to it (an "
                        "impostor, or a worker that needs tc_tls_cafile here)")
                elif secret and mode != b"T":
                    raise WorkerIdentityError(
                        f"the coordinator worker at {endpoint} does not authenticate "
                        f"clients, but this client holds a secret for {principal!r}: not "
                        "talking to it (a misconfigured worker, or a forged endpoint)")
            except asyncio.IncompleteReadError as exc:
                writer.close()
                raise ConnectionError(f"{endpoint} closed the connection during the "
                                      "handshake") from exc
            except BaseException:
                writer.close()
                raise
            conn = cls(io, writer, str(endpoint), key)
            asyncio.ensure_future(conn._read(reader, on_reply, on_close))
            return conn

        try:
            return io.run(asyncio.wait_for(connect(), timeout_s), timeout=timeout_s + 1)
        except TimeoutError as exc:
            raise ConnectionError(f"no handshake from {endpoint} within {timeout_s:g} s") \
                from exc
        except ssl.SSLError as exc:
            raise CoordinatorAuthError(f"TLS with the coordinator worker at {endpoint} "
                                       f"failed: {exc}") from exc

    async def _read(self, reader: asyncio.StreamReader, on_reply: Callable[[bytes], None],
                    on_close: Callable[[ClientConnection], None]) -> None:
        try:
            while True:
                on_reply(self._unseal(await _read_frame(reader)))
        except ValueError as exc:
            log.warning("closing the connection to %s: %s", self.peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            log.debug("connection to %s closed: %s", self.peer, exc)
        finally:
            self.closed.set()
            self._writer.close()
            on_close(self)
