"""The direct line between clients and coordinators: framed TCP, TLS optional (asyncio).

A worker listens on one address (``127.0.0.1:0`` by default) for every TC it serves. A
client keeps one connection per worker and multiplexes its requests over it, matched to
replies by request id; any number of threads may wait on one connection. Kafka stays the
medium of everything durable: a worker replies only once the entries a request planned
have read back from the log, so the line carries nothing a crash could lose.

Wire form: every frame is a 4-byte big-endian length, then that many bytes. A connection
opens with a handshake: the worker sends :data:`MAGIC` and a 16-byte nonce; the client
answers :data:`MAGIC` and HMAC-SHA256(shared secret, nonce) (zeros without a secret, so
the secret never crosses the wire); the worker answers ``OK``, or ``NO`` and the reason
and closes. After it, client frames are requests and worker frames replies
(``schemas/tc_request.avsc``, ``schemas/tc_reply.avsc``).

Both ends run their sockets on an asyncio loop in a daemon thread, so TLS reads and
writes never race on one SSL object and no caller blocks on a slow peer: a send is
handed to the loop (``call_soon_threadsafe``) and returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import ssl
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from txnstream.config import Config
from txnstream.errors import ConfigError, CoordinatorAuthError

__all__ = ["Endpoint", "Listener", "ServerConnection", "ClientConnection", "IoLoop",
           "server_ssl_context", "client_ssl_context", "MAX_FRAME_BYTES"]

log = logging.getLogger(__name__)

MAGIC = b"TXNS1"
FRAME = struct.Struct(">I")
NONCE_BYTES = 16
PROOF_BYTES = 32
MAX_FRAME_BYTES = 8 << 20
"""A request or reply larger than this is refused (the largest, a LIST of many open
txns, is far smaller); the bound keeps a garbage length from allocating gigabytes."""
HANDSHAKE_TIMEOUT_S = 5.0
"""A peer that does not finish the handshake in this time is dropped."""
MAX_UNSENT_BYTES = 16 << 20
"""Replies queued for a peer that does not read: past this the connection is closed
(the client resends under the same request ids on a new one)."""

T = TypeVar("T")


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


def _proof(secret: str | None, nonce: bytes) -> bytes:
    if not secret:
        return bytes(PROOF_BYTES)
    return hmac.new(secret.encode(), nonce, hashlib.sha256).digest()


def _frame(data: bytes) -> bytes:
    return FRAME.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    if n > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME_BYTES}-byte bound")
    return await reader.readexactly(n)


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


class IoLoop:
    """An asyncio loop in a daemon thread; other threads hand it work."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop soon; returns at once."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nothing is sent any more
            pass

    def close(self) -> None:
        """Cancel what runs on the loop, stop it and its thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.run(cancel_all(), timeout=5)
        except Exception as exc:  # stopping anyway
            log.debug("io loop close: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class _Conn:
    """One open connection; sends are handed to the loop and never block the caller."""

    def __init__(self, io: IoLoop, writer: asyncio.StreamWriter, peer: str) -> None:
        self._io = io
        self._writer = writer
        self.peer = peer
        self.closed = threading.Event()

    def send(self, data: bytes) -> None:
        """Queue one frame; dropped if the connection has closed."""
        if not self.closed.is_set():
            self._io.call(self._write, _frame(data))

    def _write(self, framed: bytes) -> None:
        if self.closed.is_set():
            return
        transport = self._writer.transport
        if transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.warning("closing the connection to %s: %d bytes it does not read",
                        self.peer, transport.get_write_buffer_size())
            self._close_now()
            return
        self._writer.write(framed)

    def _close_now(self) -> None:
        self.closed.set()
        self._writer.close()

    def close(self) -> None:
        """Close (from any thread)."""
        if not self.closed.is_set():
            self._io.call(self._close_now)


class ServerConnection(_Conn):
    """A client's connection as its worker sees it: replies go back through :meth:`send`."""


class Listener:
    """A worker's listener: calls ``on_request(frame, connection)`` for every frame.

    ``on_request`` runs on the loop thread: it must only hand the frame over (a queue).
    """

    def __init__(self, host: str, port: int, on_request: Callable[[bytes, ServerConnection],
                                                                  None],
                 secret: str | None = None, tls: ssl.SSLContext | None = None,
                 name: str = "txnstream-tc-listener") -> None:
        self._on_request = on_request
        self._secret = secret
        self._tls = tls
        self._require_cert = tls is not None and tls.verify_mode is not ssl.CERT_NONE
        self._io = IoLoop(name)
        self._conns: set[ServerConnection] = set()
        try:
            self._server = self._io.run(asyncio.start_server(self._serve, host, port, ssl=tls),
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_addr = writer.get_extra_info("peername")
        peer = f"{peer_addr[0]}:{peer_addr[1]}" if peer_addr else "?"
        conn = ServerConnection(self._io, writer, peer)
        try:
            if not await asyncio.wait_for(self._handshake(reader, writer, peer),
                                          HANDSHAKE_TIMEOUT_S):
                return
            self._conns.add(conn)
            while True:
                self._on_request(await _read_frame(reader), conn)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away (or never finished the handshake)
        except (ValueError, ssl.SSLError, OSError) as exc:
            log.warning("dropping the connection from %s: %s", peer, exc)
        finally:
            self._conns.discard(conn)
            conn.closed.set()
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: str) -> bool:
        nonce = os.urandom(NONCE_BYTES)
        writer.write(MAGIC + nonce)
        answer = await reader.readexactly(len(MAGIC) + PROOF_BYTES)
        if answer[:len(MAGIC)] != MAGIC:
            log.warning("refused a connection from %s: not a txnstream client", peer)
            return False
        if self._require_cert and not writer.get_extra_info("peercert"):
            log.warning("refused a connection from %s: no client certificate", peer)
            writer.write(b"NO" + b"this worker requires a client certificate (mutual TLS: "
                                 b"tc_tls_certfile / tc_tls_keyfile)")
            await writer.drain()
            return False
        if self._secret and not hmac.compare_digest(answer[len(MAGIC):],
                                                    _proof(self._secret, nonce)):
            log.warning("refused a connection from %s: wrong shared secret", peer)
            writer.write(b"NO" + b"wrong shared secret (tc_secret / TXNSTREAM_TC_SECRET)")
            await writer.drain()
            return False
        writer.write(b"OK")
        return True

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


class ClientConnection(_Conn):
    """A client's connection to one worker; replies go to ``on_reply`` on the loop thread."""

    @classmethod
    def open(cls, io: IoLoop, endpoint: Endpoint, secret: str | None,
             tls: ssl.SSLContext | None, on_reply: Callable[[bytes], None],
             on_close: Callable[[ClientConnection], None], timeout_s: float
             ) -> ClientConnection:
        """Connect and handshake.

        ``OSError`` if unreachable, ``CoordinatorAuthError`` if refused.
        """
        async def connect() -> ClientConnection:
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=tls,
                server_hostname=endpoint.host if tls is not None else None)
            try:
                hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
                if hello[:len(MAGIC)] != MAGIC:
                    raise ConnectionError(f"{endpoint} is not a txnstream worker")
                writer.write(MAGIC + _proof(secret, hello[len(MAGIC):]))
                verdict = await reader.readexactly(2)
                if verdict != b"OK":
                    why = (await reader.read(200)).decode(errors="replace")
                    raise CoordinatorAuthError(
                        f"the coordinator worker at {endpoint} refused this client: {why}")
            except asyncio.IncompleteReadError as exc:
                writer.close()
                raise ConnectionError(f"{endpoint} closed the connection during the "
                                      "handshake") from exc
            except BaseException:
                writer.close()
                raise
            conn = cls(io, writer, str(endpoint))
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
                on_reply(await _read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as exc:
            log.debug("connection to %s closed: %s", self.peer, exc)
        finally:
            self.closed.set()
            self._writer.close()
            on_close(self)
