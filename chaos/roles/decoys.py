"""The flood's decoys on the line: an impostor worker, a tarpit, an idle-socket holder.

- :class:`Impostor` listens on a port of its own and answers every handshake ``OK`` with a
  mode the client did not ask for: ``T`` (a TLS certificate identified you, over plain
  TCP), ``A`` (anonymous) or ``K`` with a proof it cannot know. A client that holds a
  secret must refuse all three before it sends a request (issue 34 item 5). Frames that
  come anyway are answered OK (a commit the impostor never made); one from a client that
  proved a secret is an ``intrusion``.
- :class:`Tarpit` accepts connections and never answers.
- :func:`forge_endpoints` writes endpoint records that send a TC's clients to them, and
  to a live worker that does not serve that TC (items 4, 7).
- :class:`IdleHolder` opens many TCP connections to each worker's port from a few
  loopback addresses of its own (``127.0.0.2``...) and never finishes a handshake,
  reopening those the worker closes (issue 34 item 3). A connection a worker keeps past
  its handshake timeout (plus a nemesis pause) is an ``intrusion``.

Each calls ``count(who, op, outcome)`` for every outcome and ``intrusion(who, op,
detail)`` for what a worker or client must not do.
"""

from __future__ import annotations

import errno
import os
import random
import selectors
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.line_security import PROOF_BYTES
from txnstream.coordinator.protocol import TcReply, TcRequest
from txnstream.coordinator.transport import (
    CLUSTER_LEN,
    FRAME,
    HANDSHAKE_TIMEOUT_S,
    MAGIC,
    NONCE_BYTES,
    Endpoint,
)
from txnstream.errors import TxnStreamError

__all__ = ["Impostor", "Tarpit", "IdleHolder", "Count", "Intrusion", "forge_endpoints",
           "FORGED_OWNER_PREFIX"]

Count = Callable[[str, str, str], None]
Intrusion = Callable[[str, str, str], None]

FORGED_OWNER_PREFIX = "flood-"
"""``owner_id`` of the forged endpoint records (the intruder's raw thread skips them)."""
FORGED_EPOCH = 1 << 52
IMPOSTOR_MODES = (b"T", b"A", b"K")
IDLE_CAP_CLOSE_S = 1.0
"""A connection closed sooner than this without a greeting was refused at once (a cap)."""
IDLE_REOPEN_S = 2.0
"""Wait before reopening a connection refused at once (the worker's caps), so the holder
churns at most ``sockets / this`` connects a second per worker."""


def forge_endpoints(producer: Producer, topic: str, tc: int, impostor_port: int,
                    tarpit_port: int, tarpits: int, live: Endpoint | None, count: Count) -> None:
    """Endpoint records for TC ``tc`` with huge epochs, ``owner_id`` ``flood-<kind>``.

    One naming the impostor (the highest epoch), ``tarpits`` naming the tarpit, and one
    naming ``live``, a genuine worker that does not serve the TC.
    """
    recs = [("impostor", Endpoint("127.0.0.1", impostor_port), FORGED_EPOCH + 9)]
    recs += [("tarpit", Endpoint("127.0.0.1", tarpit_port), FORGED_EPOCH + 8 - i)
             for i in range(tarpits)]
    if live is not None:
        recs.append(("live", live, FORGED_EPOCH))
    for kind, ep, epoch in recs:
        rec = TcEndpoint(tc, f"{FORGED_OWNER_PREFIX}{kind}", ep, epoch)
        producer.produce(topic, rec.encode(), key=str(tc).encode(), partition=tc)
        count("forger", f"endpoint {kind}", "written")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise ConnectionError("closed")
        buf += got
    return buf


class Impostor:
    """A worker that is not one: it answers handshakes, then OKs whatever comes.

    Its hello names ``cluster``, the cluster it poses in (public: a Kafka cluster id and a
    prefix), so only the proof of the secret can tell it from a worker.
    """

    def __init__(self, count: Count, intrusion: Intrusion, seed: int, cluster: bytes) -> None:
        self.count, self.intrusion = count, intrusion
        self.cluster = cluster
        self.rng = random.Random(seed)
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True,
                         name="impostor").start()

    def _serve(self, s: socket.socket) -> None:
        s.settimeout(30.0)
        try:
            sn = os.urandom(NONCE_BYTES)
            s.sendall(MAGIC + sn + CLUSTER_LEN.pack(len(self.cluster)) + self.cluster)
            head = _recv_exact(s, len(MAGIC) + NONCE_BYTES + 1)
            principal = _recv_exact(s, head[-1]).decode(errors="replace")
            proof = _recv_exact(s, PROOF_BYTES)
            mode = self.rng.choice(IMPOSTOR_MODES)
            s.sendall(b"OK" + mode + (os.urandom(PROOF_BYTES) if mode == b"K"
                                      else bytes(PROOF_BYTES)))
            held = "secret" if any(proof) else "no_secret"
            self.count("impostor", f"handshake {mode.decode()}", held)
            while True:
                (n,) = FRAME.unpack(_recv_exact(s, FRAME.size))
                frame = _recv_exact(s, min(n, 1 << 20))
                self.count("impostor", f"request after {mode.decode()}", held)
                if held == "secret":
                    self.intrusion("impostor", f"mode {mode.decode()}",
                                   f"{principal!r}, which proved a secret, sent a request "
                                   f"to an impostor that answered mode {mode.decode()}")
                try:
                    req = TcRequest.decode(frame)
                except TxnStreamError:
                    continue  # tagged (mode K): not ours to read; nothing to answer
                reply = TcReply(req.request_id, req.client_id, req.tc_id, txn_seq=req.txn_seq,
                                owner_id="impostor")
                data = reply.encode()
                s.sendall(FRAME.pack(len(data)) + data)
        except (OSError, ConnectionError):
            pass

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


class Tarpit:
    """Accepts connections and never answers (keeps the newest ``keep`` open)."""

    def __init__(self, count: Count, keep: int = 500) -> None:
        self.count = count
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self._held: deque[socket.socket] = deque()
        self._keep = keep
        threading.Thread(target=self._accept, daemon=True, name="tarpit").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count("tarpit", "connection", "held")
            self._held.append(conn)
            while len(self._held) > self._keep:
                self._held.popleft().close()

    def close(self) -> None:
        """Close the listener and every held connection."""
        self.sock.close()
        while self._held:
            self._held.popleft().close()


class IdleHolder:
    """Connections to every worker that never handshake, reopened when closed."""

    def __init__(self, count: Count, intrusion: Intrusion, per_worker: int, hosts: int,
                 pause_s: float) -> None:
        self.count, self.intrusion = count, intrusion
        self.per_worker = per_worker
        self.sources = [f"127.0.0.{2 + i}" for i in range(max(1, hosts))]
        self.limit_s = HANDSHAKE_TIMEOUT_S + 2 * pause_s + 5.0
        """Past this a connection kept open is an intrusion. A paused worker closes
        nothing until it resumes, and the nemesis may pause one worker twice with seconds
        between (seed 28: paused 04:11:06-16 and 04:11:19-29, a connection of 04:11:06
        flagged at 20 s while the worker had run 3 s of them)."""
        self.sel = selectors.DefaultSelector()
        self.socks: dict[socket.socket, dict[str, Any]] = {}
        self.wait_until: dict[tuple[Any, str], float] = {}
        """(endpoint, source) -> no reopening before this (it was refused at once)."""

    def run(self, stop: threading.Event, targets: Callable[[], list[Any]]) -> None:
        """Hold connections to ``targets()`` (endpoints) until ``stop``."""
        try:
            while not stop.is_set():
                eps = set(targets())
                self._fill(eps)
                for key, _ in self.sel.select(0.2):
                    self._readable(key.fileobj)  # type: ignore[arg-type]
                self._sweep(eps)
        finally:
            for s in list(self.socks):
                self._close(s)
            self.sel.close()

    def _fill(self, eps: set[Any]) -> None:
        now = time.monotonic()
        have: dict[tuple[Any, str], int] = {}
        for info in self.socks.values():
            k = (info["ep"], info["src"])
            have[k] = have.get(k, 0) + 1
        share = -(-self.per_worker // len(self.sources))
        for ep in sorted(eps, key=str):
            for src in self.sources:
                k = (ep, src)
                if self.wait_until.get(k, 0.0) > now:
                    continue
                for _ in range(share - have.get(k, 0)):
                    self._open(ep, src, now)

    def _open(self, ep: Any, src: str, now: float) -> None:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((src, 0))
            err = s.connect_ex((ep.host, ep.port))
        except OSError as exc:
            s.close()
            self.count("idle", "open", type(exc).__name__)
            self.wait_until[(ep, src)] = now + IDLE_REOPEN_S
            return
        if err not in (0, errno.EINPROGRESS):
            s.close()
            self.count("idle", "open", errno.errorcode.get(err, str(err)))
            self.wait_until[(ep, src)] = now + IDLE_REOPEN_S
            return
        self.socks[s] = {"ep": ep, "src": src, "at": now, "greeted": False}
        self.sel.register(s, selectors.EVENT_READ)
        self.count("idle", "open", "connected")

    def _readable(self, s: socket.socket) -> None:
        info = self.socks.get(s)
        if info is None:
            return
        try:
            data = s.recv(4096)
        except OSError as exc:
            outcome = "refused" if isinstance(exc, ConnectionRefusedError) else "reset"
            self._closed(s, info, outcome)
            return
        if data:
            info["greeted"] = True  # the greeting: never answered
            return
        held = time.monotonic() - info["at"]
        self._closed(s, info, "timed_out" if info["greeted"] or held >= IDLE_CAP_CLOSE_S
                     else "closed_at_once")

    def _closed(self, s: socket.socket, info: dict[str, Any], outcome: str) -> None:
        self.count("idle", "close", outcome)
        if outcome != "timed_out":
            self.wait_until[(info["ep"], info["src"])] = time.monotonic() + IDLE_REOPEN_S
        self._close(s)

    def _close(self, s: socket.socket) -> None:
        self.socks.pop(s, None)
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()

    def _sweep(self, eps: set[Any]) -> None:
        now = time.monotonic()
        for s, info in list(self.socks.items()):
            if info["ep"] not in eps:
                self._close(s)  # not a live worker any more
            elif now - info["at"] > self.limit_s:
                self.count("idle", "close", "kept_open")
                self.intrusion("idle", "hold", f"{info['ep']} kept a connection from "
                               f"{info['src']} that never handshook open for "
                               f"{now - info['at']:.0f} s")
                self._close(s)
