"""The direct line between clients and coordinators: framed TCP, TLS optional (asyncio).

A worker listens on one address (``127.0.0.1:0`` by default) for every TC it serves. A
client keeps one connection per worker and multiplexes its requests over it, matched to
replies by request id; any number of threads may wait on one connection. Kafka stays the
medium of everything durable: a worker replies only once the entries a request planned
have read back from the log, so the line carries nothing a crash could lose.

Wire form: every frame is a 4-byte big-endian length, then that many bytes. A connection
opens with a handshake that authenticates both ends and keys the frames after it:

1. worker -> client: :data:`MAGIC`, a 16-byte nonce ``sn`` and its cluster (two length
   bytes, then ``<Kafka cluster id>/<prefix>``: :func:`cluster_identity`);
2. client -> worker: :data:`MAGIC`, its own nonce ``cn``, its principal (one length byte,
   UTF-8) and ``HMAC-SHA256(secret, "client" | sn | cn | principal | cluster)`` (zeros
   without a secret), so the secret never crosses the wire;
3. worker -> client: ``OK``, the mode (``K`` keyed by the secret, ``T`` identified by its
   TLS certificate, ``A`` anonymous) and, in mode ``K``, ``HMAC(secret, "worker" | sn |
   cn | principal | cluster)``: the client checks it, so a process that does not know the
   secret cannot pose as a worker (say, behind a forged endpoint record). ``NO`` and the
   reason (credentials refused) or ``BY`` and the reason (the worker is at its connection
   cap, or has not learnt its Kafka cluster yet), then the worker closes.

The client goes no further with a worker of another cluster (another prefix, or another
Kafka cluster), whatever it proves: clusters may share a secret, and a record of the
client's cluster may name an address that such a worker took since.

In mode ``K`` every later frame ends in a 16-byte tag, ``HMAC(session key, direction |
frame number | payload)`` truncated, with the session key derived from the secret and
both nonces: a relay that passed the handshake along can neither inject, reorder, replay
nor alter a frame (a bad tag closes the connection). In mode ``T`` TLS does the same. A
client that holds a secret refuses a worker that answers ``A``.

After the handshake, client frames are requests and worker frames replies
(``schemas/tc_request.avsc``, ``schemas/tc_reply.avsc``).

Both ends run their sockets on an asyncio loop in a daemon thread, so TLS reads and
writes never race on one SSL object and no caller blocks on a slow peer: a send is
handed to the loop (:class:`~txnstream.coordinator.ioloop.IoLoop`) and returns.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from txnstream.coordinator.ioloop import IoLoop
from txnstream.coordinator.line_security import (
    MAX_CLUSTER_BYTES,
    PROOF_BYTES,
    FrameKey,
    cert_common_name,
    handshake_proof,
)
from txnstream.errors import ConfigError
from txnstream.ratelog import RateLimitedLog
from txnstream.types import ANONYMOUS

__all__ = ["Endpoint", "Listener", "LineLimits", "ServerConnection", "IoLoop",
           "MAX_FRAME_BYTES", "ANONYMOUS"]

log = logging.getLogger(__name__)

MAGIC = b"TXNS6"
"""The line's version: 6 since the worker's hello names its cluster; 5 since PREPARE (a
version-4 worker cannot read it); 4 since replies carry txn keys (a version-3 client
would write records without ``txn.tag``, junk to a version-4 buffer owner); 3 since a
commit's END carries its unconfirmed registrations. Different versions refuse each
other."""
FRAME = struct.Struct(">I")
CLUSTER_LEN = struct.Struct(">H")
NONCE_BYTES = 16


def line_mismatch(magic: bytes, peer: str) -> str:
    """Why a peer whose hello starts with ``magic`` is refused, naming both versions."""
    if magic[:4] == MAGIC[:4] and magic[4:].isdigit():
        return (f"the {peer} speaks line version {magic[4:].decode()}, this side "
                f"{MAGIC[4:].decode()}: run the same txnstream release on clients and workers")
    return f"not a txnstream {peer}"
MAX_FRAME_BYTES = 8 << 20
"""A request or reply larger than this is refused (the largest, a LIST of many open
txns, is far smaller); the bound keeps a garbage length from allocating gigabytes."""
MAX_PRINCIPAL_BYTES = 128
HANDSHAKE_TIMEOUT_S = 5.0
"""A peer that does not finish the handshake in this time is dropped."""
MAX_UNSENT_BYTES = 16 << 20
"""Replies queued for a peer that does not read: past this the connection is closed
(the client resends under the same request ids on a new one)."""



@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a worker listens."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """``host:port``; ``ConfigError`` naming the text otherwise."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"not a host:port address: {text!r}")
        return cls(host.strip("[]"), int(port))


def _frame(data: bytes) -> bytes:
    return FRAME.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes:
    (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    if n > limit:
        raise ValueError(f"frame of {n} bytes is over the {limit}-byte bound")
    return await reader.readexactly(n)


class _Conn:
    """One open connection; sends are handed to the loop and never block the caller."""

    def __init__(self, io: IoLoop, writer: asyncio.StreamWriter, peer: str,
                 key: FrameKey | None = None) -> None:
        self._io = io
        self._writer = writer
        self.peer = peer
        self.key = key
        """Tags frames (mode ``K``); None under TLS or without authentication."""
        self.closed = threading.Event()

    def gone(self) -> bool:
        """Whether no reply can reach the peer any more.

        The connection closed, or its transport was lost (a write failed: the peer reset
        it). A connection whose reading is paused (backpressure) learns of its peer's end
        only from its transport.
        """
        return self.closed.is_set() or self._writer.transport.is_closing()

    def send(self, data: bytes) -> None:
        """Queue one frame; dropped if the connection has closed."""
        if not self.closed.is_set():
            self._io.call(self._write, data)

    def _write(self, data: bytes) -> None:
        if self.gone():
            return  # a write to a lost transport fails (and asyncio warns of each)
        transport = self._writer.transport
        if transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.warning("closing the connection to %s: %d bytes it does not read",
                        self.peer, transport.get_write_buffer_size())
            self._close_now()
            return
        # sealed here, on the loop thread, so tags number the frames in the order sent
        self._writer.write(_frame(self.key.seal(data) if self.key is not None else data))

    def _unseal(self, frame: bytes) -> bytes:
        return self.key.open(frame) if self.key is not None else frame

    def _close_now(self) -> None:
        self.closed.set()
        self._writer.close()

    def close(self) -> None:
        """Close (from any thread): closed at once for every thread, the socket soon."""
        if not self.closed.is_set():
            self.closed.set()
            self._io.call(self._writer.close)


class ServerConnection(_Conn):
    """A client's connection as its worker sees it: replies go back through :meth:`send`."""

    def __init__(self, io: IoLoop, writer: asyncio.StreamWriter, peer: str,
                 principal: str = ANONYMOUS, key: FrameKey | None = None) -> None:
        super().__init__(io, writer, peer, key)
        self.principal = principal
        """Who the handshake proved the client is (``anonymous`` without authentication)."""
        self.inflight = 0
        """Requests of this connection awaiting a reply (counted by the worker)."""
        self.queued = self.queued_bytes = 0
        """Requests read and not taken by the worker yet, and their bytes (loop thread)."""
        self.room: asyncio.Event | None = None
        """Set while the connection may be read (made on the loop thread, when paused)."""
        self.on_took: Callable[[ServerConnection, int], None] | None = None

    def took(self, nbytes: int) -> None:
        """The worker took one request of ``nbytes`` off its inbox (any thread)."""
        if self.on_took is not None:
            self._io.call(self.on_took, self, nbytes)


@dataclass(frozen=True, slots=True)
class LineLimits:
    """What one listener lets clients hold (WorkerSettings carries the worker's values)."""

    max_connections: int = 1_024  # authenticated: handshakes under way never take room
    max_request_bytes: int = 1 << 20
    idle_timeout_s: float = 600.0
    max_handshakes: int = 256  # connections not through their handshake, all addresses
    max_handshakes_per_host: int = 32  # ... from one (Kafka's max.connections.per.ip)
    max_queued: int = 256  # a connection's requests not taken yet: it is not read past it
    max_queued_bytes: int = 4 << 20  # ... and their bytes
    max_queued_bytes_total: int = 64 << 20  # every connection's: none is read past it


class Listener:
    """A worker's listener: calls ``on_request(frame, connection)`` for every frame.

    ``on_request`` runs on the loop thread: it must only hand the frame over (a queue).
    ``users`` maps each principal to its secret; with none (and no client certificates
    required) every client is ``anonymous``.
    """

    def __init__(self, host: str, port: int, on_request: Callable[[bytes, ServerConnection],
                                                                  None],
                 users: Mapping[str, str] | None = None, tls: ssl.SSLContext | None = None,
                 name: str = "txnstream-tc-listener", limits: LineLimits | None = None,
                 cluster: bytes | None = b"") -> None:
        self._on_request = on_request
        self.cluster = cluster
        """The cluster the hello names (:func:`cluster_identity`); None until the worker
        knows it: connections are then refused as busy."""
        self._users = dict(users or {})
        self._tls = tls
        self._require_cert = tls is not None and tls.verify_mode is not ssl.CERT_NONE
        self._warn = RateLimitedLog(log)
        """Refusals and drops: a hostile peer can cause them without bound."""
        self.limits = limits or LineLimits()
        self._io = IoLoop(name)
        self._conns: set[ServerConnection] = set()
        self._paused: set[ServerConnection] = set()
        """Connections not read until the worker takes some of their requests."""
        self.queued_bytes = 0
        """Bytes of every connection's requests read and not taken yet (loop thread)."""
        self._opening = 0
        self._opening_by_host: dict[str, int] = {}  # entries leave at 0
        self.refused = 0  # connections refused (credentials, caps): for tests and stats
        try:
            self._server = self._io.run(asyncio.start_server(
                self._serve, host, port, ssl=tls,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None),
                timeout=10)
        except BaseException:
            self._io.close()
            raise
        sock = self._server.sockets[0].getsockname()
        self.address = Endpoint(host, int(sock[1]))

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self._tls is not None

    @property
    def authenticates(self) -> bool:
        """Whether every client must prove who it is (a secret or a certificate)."""
        return bool(self._users) or self._require_cert

    def connections(self) -> int:
        """Open client connections (handshakes under way included)."""
        return len(self._conns) + self._opening

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_addr = writer.get_extra_info("peername")
        peer = f"{peer_addr[0]}:{peer_addr[1]}" if peer_addr else "?"
        host = str(peer_addr[0]) if peer_addr else "?"
        conn: ServerConnection | None = None
        from_host = self._opening_by_host.get(host, 0)
        if (from_host >= self.limits.max_handshakes_per_host
                or self._opening >= self.limits.max_handshakes):
            self.refused += 1
            self._warn.warning(f"handshakes {host}", "closed a connection from %s at once: "
                               "%d handshakes under way from it, %d in all (caps "
                               "max_handshakes_per_host %d, max_handshakes %d)", peer,
                               from_host, self._opening, self.limits.max_handshakes_per_host,
                               self.limits.max_handshakes)
            writer.close()
            return
        self._opening += 1
        self._opening_by_host[host] = from_host + 1
        try:
            try:
                conn = await asyncio.wait_for(self._handshake(reader, writer, peer),
                                              HANDSHAKE_TIMEOUT_S)
            finally:
                self._opening -= 1
                left = self._opening_by_host.pop(host) - 1
                if left:
                    self._opening_by_host[host] = left
            if conn is None:
                self.refused += 1
                return
            self._conns.add(conn)
            conn.on_took = self._took
            limits = self.limits
            while True:
                frame = await asyncio.wait_for(_read_frame(reader, limits.max_request_bytes),
                                               limits.idle_timeout_s)
                data = conn._unseal(frame)
                conn.queued += 1
                conn.queued_bytes += len(data)
                self.queued_bytes += len(data)
                self._on_request(data, conn)
                if conn.closed.is_set():
                    break  # refused (its request did not parse): nothing more is read
                if self._full(conn):  # backpressure: read no more until the worker takes
                    conn.room = asyncio.Event()
                    self._paused.add(conn)
                    await conn.room.wait()
        except TimeoutError:
            if conn is not None:
                log.info("closing the connection from %s (%s): idle for %.0f s", peer,
                         conn.principal, self.limits.idle_timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away (or never finished the handshake)
        except (ValueError, ssl.SSLError, OSError) as exc:
            self._warn.warning(f"drop {type(exc).__name__}",
                               "dropping the connection from %s: %s", peer, exc)
        finally:
            if conn is not None:
                self._conns.discard(conn)
                self._paused.discard(conn)
                conn.closed.set()
            writer.close()

    def _full(self, conn: ServerConnection) -> bool:
        limits = self.limits
        return (conn.queued >= limits.max_queued or conn.queued_bytes >= limits.max_queued_bytes
                or self.queued_bytes >= limits.max_queued_bytes_total)

    def _took(self, conn: ServerConnection, nbytes: int) -> None:
        """One request of ``conn`` taken by the worker (loop thread): read on, if paused."""
        conn.queued -= 1
        conn.queued_bytes -= nbytes
        was_full = self.queued_bytes >= self.limits.max_queued_bytes_total
        self.queued_bytes -= nbytes
        # every paused connection only when the total fell below its cap; else this one
        for c in list(self._paused) if was_full else [conn] if conn in self._paused else []:
            if not self._full(c):
                self._paused.discard(c)
                if c.room is not None:
                    c.room.set()

    async def _refuse(self, writer: asyncio.StreamWriter, peer: str, verdict: bytes,
                      why: str) -> None:
        self._warn.warning(f"refuse {why[:60]}", "refused a connection from %s: %s", peer, why)
        writer.write(verdict + why.encode()[:200])
        await writer.drain()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: str) -> ServerConnection | None:
        sn = os.urandom(NONCE_BYTES)
        cluster = self.cluster
        named = (cluster or b"")[:MAX_CLUSTER_BYTES]
        writer.write(MAGIC + sn + CLUSTER_LEN.pack(len(named)) + named)
        head = await reader.readexactly(len(MAGIC) + NONCE_BYTES + 1)
        if head[:len(MAGIC)] != MAGIC:
            self._warn.warning("refuse magic", "refused a connection from %s: %s", peer,
                               line_mismatch(head[:len(MAGIC)], "client"))
            return None
        cn = head[len(MAGIC):len(MAGIC) + NONCE_BYTES]
        claimed = await reader.readexactly(head[-1])
        proof = await reader.readexactly(PROOF_BYTES)
        if cluster is None:
            await self._refuse(writer, peer, b"BY", "the worker is starting: it has not "
                               "learnt its Kafka cluster's id yet")
            return None
        if len(self._conns) >= self.limits.max_connections:
            await self._refuse(writer, peer, b"BY", f"the worker is at its cap of "
                               f"{self.limits.max_connections} connections (max_connections)")
            return None
        cert_principal = cert_common_name(writer.get_extra_info("peercert"))
        if cert_principal == ANONYMOUS:
            await self._refuse(writer, peer, b"NO", f"a certificate may not name the principal "
                               f"{ANONYMOUS!r}: it is the name of clients that prove nothing")
            return None
        if self._require_cert and cert_principal is None:
            await self._refuse(writer, peer, b"NO", "this worker requires a client "
                               "certificate (mutual TLS: tc_tls_certfile / tc_tls_keyfile)")
            return None
        name = claimed.decode(errors="replace")
        secret = self._users.get(name)
        if secret is not None and hmac.compare_digest(
                proof, handshake_proof(secret, b"client", sn, cn, claimed, named)):
            writer.write(b"OK" + b"K" + handshake_proof(secret, b"worker", sn, cn, claimed,
                                                        named))
            return ServerConnection(self._io, writer, peer, name,
                                    FrameKey(secret, sn, cn, claimed, client_side=False))
        if cert_principal is not None:  # mutual TLS: the certificate says who it is
            writer.write(b"OK" + b"T" + bytes(PROOF_BYTES))
            return ServerConnection(self._io, writer, peer, cert_principal)
        if self._users:
            if not any(proof):
                why = (f"no secret given for principal {name!r}: this worker requires "
                       "one (tc_secret, TXNSTREAM_TC_SECRET or TXNSTREAM_TC_SECRET_FILE)")
            elif name in self._users:
                why = f"wrong secret for principal {name!r} (tc_principal / tc_secret)"
            else:
                why = f"unknown principal {name!r} (tc_principal / tc_secret)"
            await self._refuse(writer, peer, b"NO", why)
            return None
        writer.write(b"OK" + b"A" + bytes(PROOF_BYTES))
        return ServerConnection(self._io, writer, peer, ANONYMOUS)

    def close(self) -> None:
        """Stop listening and close every connection (idempotent)."""
        if self._io.loop.is_closed():
            return

        async def shut() -> None:
            self._server.close()
            for c in list(self._conns):
                c._close_now()
            await self._server.wait_closed()
        try:
            self._io.run(shut(), timeout=5)
        except Exception as exc:  # closing anyway
            log.debug("listener close: %s", exc)
        self._io.close()
