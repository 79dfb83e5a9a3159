"""The direct line to coordinators on real loopback sockets (no broker needed).

A client is wired to a stand-in endpoint directory; workers are bare :class:`Listener`\\ s
that answer like a coordinator: the client's retry, failover and credential rules are
exercised end to end on TCP.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.tls_certs import make_certs
from txnstream.config import Config
from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.line_security import client_ssl_context, server_ssl_context
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.coordinator.tc_client import TransactionCoordinatorClient
from txnstream.coordinator.transport import (
    MAX_FRAME_BYTES,
    Endpoint,
    IoLoop,
    LineLimits,
    Listener,
    ServerConnection,
)
from txnstream.errors import (
    CoordinatorAuthError,
    NotCoordinatorError,
    RequestTimeoutError,
    WrongClusterError,
)

SECRET = "s3cret-for-tests"


class Directory:
    """Stands in for :class:`EndpointDirectory`: what the test says is where."""

    def __init__(self) -> None:
        self.known: dict[int, TcEndpoint] = {}
        self.cond = threading.Condition()
        self.on_change: Callable[[TcEndpoint], None] | None = None

    def set(self, tc_id: int, endpoint: Endpoint, epoch: int) -> None:
        ep = TcEndpoint(tc_id, f"w{epoch}", endpoint, epoch)
        with self.cond:
            had = tc_id in self.known
            self.known[tc_id] = ep
            self.cond.notify_all()
        if had and self.on_change is not None:
            self.on_change(ep)

    def has_fallback(self, ep: TcEndpoint) -> bool:
        return False  # one record per TC here

    def set_aside(self, ep: TcEndpoint) -> None:
        pass  # one record per TC: nothing else to try first

    def answered(self, ep: TcEndpoint) -> None:
        pass

    def lookup(self, tc_id: int, timeout_s: float, newer_than: int | None = None,
               skip: frozenset = frozenset()) -> TcEndpoint | None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                ep = self.known.get(tc_id)
                if ep is not None and (newer_than is None or ep.epoch_offset > newer_than):
                    return ep
                if time.monotonic() >= deadline:
                    return ep
                self.cond.wait(deadline - time.monotonic())

    def close(self) -> None:
        pass


Handler = Callable[[TcRequest, ServerConnection], None]


def answer(req: TcRequest, conn: ServerConnection) -> None:
    conn.send(TcReply(req.request_id, req.client_id, req.tc_id, txn_seq=7,
                      owner_id="w").encode())


@pytest.fixture
def listeners() -> Iterator[Callable[..., Listener]]:
    made: list[Listener] = []

    def make(handler: Handler = answer, secret: str | None = None,
             limits: LineLimits | None = None) -> Listener:
        lst = Listener("127.0.0.1", 0, lambda data, conn: handler(TcRequest.decode(data), conn),
                       users={"txnstream": secret} if secret else None, limits=limits)
        made.append(lst)
        return lst

    yield make
    for lst in made:
        lst.close()


@pytest.fixture
def make_client() -> Iterator[Callable[..., tuple[TransactionCoordinatorClient, Directory]]]:
    made: list[TransactionCoordinatorClient] = []

    def make(secret: str | None = None, request_timeout_s: float = 10.0
             ) -> tuple[TransactionCoordinatorClient, Directory]:
        c = TransactionCoordinatorClient.__new__(TransactionCoordinatorClient)
        c.config = Config(bootstrap_servers="127.0.0.1:1", tc_secret=secret,
                          request_timeout_s=request_timeout_s)
        c.client_id = "c-test"
        c._pending = {}
        c._lock = threading.Lock()
        c.num_coordinators = 4
        c.cluster = b""
        c._tls = None
        c._io = IoLoop("test-tc-client")
        c._conns = {}
        c._conn_lock = threading.Lock()
        c._closed = False
        d = Directory()
        d.on_change = c._on_owner_change
        c.directory = d  # type: ignore[assignment]
        made.append(c)
        return c, d

    yield make
    for c in made:
        c.close()


def test_a_request_is_answered_over_the_direct_line(listeners, make_client):
    lst = listeners()
    client, d = make_client()
    d.set(0, lst.address, epoch=10)
    reply = client.request(TcOp.GET, 0, txn_seq=7)
    assert reply.txn_seq == 7 and reply.owner_id == "w"
    # many threads share the one connection; every reply reaches its own caller
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(client.request(TcOp.GET, 0).txn_seq))
               for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [7] * 32
    assert len(client._conns) == 1


def test_a_client_with_the_wrong_secret_is_refused_with_a_clear_error(listeners, make_client):
    lst = listeners(secret=SECRET)
    client, d = make_client(secret="not-the-secret")
    d.set(0, lst.address, epoch=10)
    t0 = time.monotonic()
    with pytest.raises(CoordinatorAuthError) as err:
        client.request(TcOp.GET, 0)
    assert time.monotonic() - t0 < 2.0, "a refusal is not retried until the deadline"
    assert str(lst.address) in str(err.value)
    assert "wrong secret for principal 'txnstream'" in str(err.value)
    assert "not-the-secret" not in str(err.value) and SECRET not in str(err.value)
    # no secret at all is refused too, saying that none was given (not "wrong secret":
    # a client that forgot TXNSTREAM_TC_SECRET was told its secret was wrong)
    nobody, d2 = make_client(secret=None)
    d2.set(0, lst.address, epoch=10)
    with pytest.raises(CoordinatorAuthError) as err:
        nobody.request(TcOp.GET, 0)
    assert "no secret given for principal 'txnstream'" in str(err.value)
    good, d3 = make_client(secret=SECRET)
    d3.set(0, lst.address, epoch=10)
    assert good.request(TcOp.GET, 0).txn_seq == 7


def _stale_then_new(listeners, make_client, seen_by_old: list[str]
                    ) -> tuple[TransactionCoordinatorClient, Listener, Listener]:
    """A client whose directory names an owner that no longer serves TC 0; the new
    owner's record comes 0.3 s later, as after a rebalance."""
    def not_mine(req: TcRequest, conn: ServerConnection) -> None:
        seen_by_old.append(req.request_id)
        conn.send(TcReply.failure(req, NotCoordinatorError("w-old does not serve 0"),
                                  "w-old").encode())

    old, new = listeners(not_mine), listeners()
    client, d = make_client()
    d.set(0, old.address, epoch=10)
    threading.Timer(0.3, d.set, (0, new.address, 20)).start()
    return client, old, new


def test_a_client_holding_a_stale_endpoint_fails_over_to_the_new_owner(listeners, make_client):
    seen_by_old: list[str] = []
    client, _, _ = _stale_then_new(listeners, make_client, seen_by_old)
    t0 = time.monotonic()
    reply = client.request(TcOp.GET, 0)
    assert reply.owner_id == "w" and reply.txn_seq == 7
    assert len(seen_by_old) == 1, "the stale owner was asked once, then the new one"
    assert time.monotonic() - t0 < 2.0


def test_a_request_answered_late_is_logged_with_each_of_its_attempts(
        listeners, make_client, caplog, monkeypatch):
    """A request answered past ``SLOW_REQUEST_S`` says where its time went: the stale
    owner that refused it, then the new owner that answered, each with its time."""
    from txnstream.coordinator import tc_client as tc_client_mod

    monkeypatch.setattr(tc_client_mod, "SLOW_REQUEST_S", 0.2)
    client, old, new = _stale_then_new(listeners, make_client, [])
    with caplog.at_level(logging.WARNING, logger=tc_client_mod.__name__):
        assert client.request(TcOp.END, 0, txn_seq=3).owner_id == "w"
    [line] = [r.getMessage() for r in caplog.records if r.name == tc_client_mod.__name__]
    assert "client c-test: END to coordinator 0 answered" in line
    assert "2 attempts" in line, line
    first, second = line.split("attempts: ")[1].split("; ")
    assert first.startswith(f"{old.address} (epoch at 10, found in ") and \
        "Unreachable w-old does not serve 0" in first, first
    assert second.startswith(f"{new.address} (epoch at 20, found in ") and \
        ": answered after " in second, second
    with caplog.at_level(logging.WARNING, logger=tc_client_mod.__name__):
        caplog.clear()
        client.request(TcOp.GET, 0)  # answered at once: not logged
    assert not [r for r in caplog.records if r.name == tc_client_mod.__name__]


def test_an_owner_that_dies_mid_request_is_replaced_and_the_request_answered_once(
        listeners, make_client):
    """The first owner takes the request and closes (killed); the client resends the same
    request id to the next owner."""
    first: list[str] = []

    def die(req: TcRequest, conn: ServerConnection) -> None:
        first.append(req.request_id)
        conn.close()

    dying, next_owner_seen = listeners(die), []

    def answer_and_note(req: TcRequest, conn: ServerConnection) -> None:
        next_owner_seen.append(req.request_id)
        answer(req, conn)

    nxt = listeners(answer_and_note)
    client, d = make_client()
    d.set(0, dying.address, epoch=10)
    threading.Timer(0.5, d.set, (0, nxt.address, 20)).start()
    reply = client.request(TcOp.GET, 0)
    assert reply.txn_seq == 7
    assert first and next_owner_seen and first[0] == next_owner_seen[0], \
        "the resend carries the same request id"


def test_nobody_listening_is_a_request_timeout_naming_the_coordinator(make_client):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client, d = make_client(request_timeout_s=1.5)
    d.set(2, Endpoint("127.0.0.1", port), epoch=10)
    with pytest.raises(RequestTimeoutError) as err:
        client.request(TcOp.GET, 2)
    assert "coordinator 2" in str(err.value) and f"127.0.0.1:{port}" in str(err.value)


def test_an_oversized_frame_drops_that_connection_and_the_listener_keeps_serving(
        listeners, make_client):
    lst = listeners()
    with socket.create_connection((lst.address.host, lst.address.port), 5) as raw:
        hello = raw.recv(5 + 16 + 2)  # magic, nonce, a cluster of 0 bytes
        raw.sendall(hello[:5] + bytes(16) + b"\x00" + bytes(32))
        assert raw.recv(2) == b"OK"
        assert raw.recv(33)[:1] == b"A"
        raw.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
        raw.settimeout(5)
        assert raw.recv(1) == b"", "the listener closes a connection that sends a huge frame"
    client, d = make_client()
    d.set(0, lst.address, epoch=10)
    assert client.request(TcOp.GET, 0).txn_seq == 7


def test_a_handshake_with_a_non_txnstream_peer_fails_clearly():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        def speak_http() -> None:
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            time.sleep(0.5)
            c.close()

        threading.Thread(target=speak_http, daemon=True).start()
        io = IoLoop("test-handshake")
        try:
            with pytest.raises(ConnectionError) as err:
                ClientConnection.open(io, Endpoint("127.0.0.1", port), None, None,
                                      lambda _r: None, lambda _c: None, 2)
            assert f"127.0.0.1:{port}" in str(err.value)
        finally:
            io.close()


def test_an_attempt_waiting_on_a_replaced_owner_resends_at_once(listeners, make_client):
    """The owner took the request and lost the TC before answering (a rebalance): its
    replies died with that incarnation. The attempt resends when the directory shows the
    newer owner, not after its 3 s attempt timeout."""
    swallowed: list[str] = []
    old = listeners(lambda req, _conn: swallowed.append(req.request_id))
    new = listeners()
    client, d = make_client()
    d.set(0, old.address, epoch=10)
    threading.Timer(0.3, d.set, (0, new.address, 20)).start()
    t0 = time.monotonic()
    assert client.request(TcOp.GET, 0).owner_id == "w"
    took = time.monotonic() - t0
    assert swallowed, "the old owner got the first attempt"
    assert took < 1.5, f"the resend waited {took:.1f} s for the attempt timeout"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    """A CA, a worker certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_listener(listeners_made: list[Listener], config: Config) -> Listener:
    lst = Listener("127.0.0.1", 0, lambda data, conn: answer(TcRequest.decode(data), conn),
                   tls=server_ssl_context(config))
    listeners_made.append(lst)
    return lst


def test_tls_and_mutual_tls_let_in_only_a_client_that_presents_what_is_required(
        make_client, certs):
    made: list[Listener] = []
    try:
        worker_cfg = Config(tc_tls_certfile=certs["worker.pem"],
                            tc_tls_keyfile=certs["worker.key"])
        lst = tls_listener(made, worker_cfg)
        client, d = make_client()
        client._tls = client_ssl_context(Config(tc_tls_cafile=certs["ca.pem"]))
        d.set(0, lst.address, epoch=10)
        assert lst.tls and client.request(TcOp.GET, 0).txn_seq == 7
        # mutual TLS: a client without a certificate is refused, clearly and at once
        mtls = tls_listener(made, worker_cfg.with_(tc_tls_cafile=certs["ca.pem"],
                                                   tc_tls_client_auth=True))
        anonymous, d2 = make_client(request_timeout_s=5)
        anonymous._tls = client_ssl_context(Config(tc_tls_cafile=certs["ca.pem"]))
        d2.set(0, mtls.address, epoch=10)
        t0 = time.monotonic()
        with pytest.raises(CoordinatorAuthError) as err:
            anonymous.request(TcOp.GET, 0)
        assert time.monotonic() - t0 < 3 and str(mtls.address) in str(err.value)
        known, d3 = make_client()
        known._tls = client_ssl_context(Config(tc_tls_cafile=certs["ca.pem"],
                                               tc_tls_certfile=certs["client.pem"],
                                               tc_tls_keyfile=certs["client.key"]))
        d3.set(0, mtls.address, epoch=10)
        assert known.request(TcOp.GET, 0).txn_seq == 7
    finally:
        for lst in made:
            lst.close()


class Relay:
    """A man in the middle: forwards bytes both ways and can inject its own into the
    client-to-worker stream once the handshake has passed through it."""

    def __init__(self, target: Endpoint) -> None:
        self.target = target
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen()
        self.address = Endpoint("127.0.0.1", self.srv.getsockname()[1])
        self.upstream: socket.socket | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        client, _ = self.srv.accept()
        up = socket.create_connection((self.target.host, self.target.port), 5)
        self.upstream = up

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
        threading.Thread(target=pump, args=(client, up), daemon=True).start()
        threading.Thread(target=pump, args=(up, client), daemon=True).start()
        self.ready.set()

    def inject(self, payload: bytes) -> None:
        assert self.upstream is not None
        self.upstream.sendall(struct.pack(">I", len(payload)) + payload)

    def close(self) -> None:
        self.srv.close()
        if self.upstream is not None:
            self.upstream.close()


def test_a_relay_that_passed_the_handshake_along_cannot_inject_a_request(listeners,
                                                                         make_client):
    """Old line: only the handshake was authenticated, so a relay without the secret
    injected an END after it. Now every frame carries a tag keyed from the secret and
    both nonces: the injected frame closes the connection and is never handled."""
    seen: list[TcRequest] = []

    def record(req: TcRequest, conn: ServerConnection) -> None:
        seen.append(req)
        answer(req, conn)

    lst = listeners(record, secret=SECRET)
    relay = Relay(lst.address)
    try:
        client, d = make_client(secret=SECRET)
        d.set(0, relay.address, epoch=10)
        assert client.request(TcOp.GET, 0).txn_seq == 7  # honest traffic passes the relay
        assert relay.ready.wait(5)
        forged = TcRequest("forged-1", "mallory", -1, TcOp.END, 0,
                           int(time.time() * 1000) + 60_000, txn_seq=3, commit=True)
        relay.inject(forged.encode() + bytes(16))  # a frame with a made-up tag
        time.sleep(0.5)
        assert [r.request_id for r in seen if r.op is TcOp.END] == [], \
            "an injected frame was handled"
        assert lst.connections() == 0, "the worker closed the tampered connection"
    finally:
        relay.close()


def test_a_frame_tag_rejects_replay_reorder_and_alteration():
    from txnstream.coordinator.line_security import FrameKey
    sn, cn, who = bytes(range(16)), bytes(range(16, 32)), b"alice"
    sender = FrameKey(SECRET, sn, cn, who, client_side=True)
    receiver = FrameKey(SECRET, sn, cn, who, client_side=False)
    a, b = sender.seal(b"first"), sender.seal(b"second")
    with pytest.raises(ValueError, match="authentication tag"):
        FrameKey(SECRET, sn, cn, who, client_side=False).open(b)  # reordered
    assert receiver.open(a) == b"first"
    with pytest.raises(ValueError, match="authentication tag"):
        receiver.open(a)  # replayed
    with pytest.raises(ValueError, match="authentication tag"):
        FrameKey(SECRET, sn, cn, who, client_side=False).open(b"x" + a[1:])  # altered
    with pytest.raises(ValueError, match="authentication tag"):
        FrameKey("other", sn, cn, who, client_side=False).open(a)  # another key
    with pytest.raises(ValueError, match="authentication tag"):
        FrameKey(SECRET, sn, cn, who, client_side=True).open(a)  # its own direction


def test_a_client_with_a_secret_refuses_a_worker_that_cannot_prove_it(listeners,
                                                                      make_client):
    """A forged endpoint record may point clients at any process: one that does not know
    the secret (here, a worker with no authentication) is never sent a request."""
    seen: list[TcRequest] = []

    def record(req: TcRequest, conn: ServerConnection) -> None:
        seen.append(req)
        answer(req, conn)

    impostor = listeners(record)
    client, d = make_client(secret=SECRET)
    d.set(0, impostor.address, epoch=10)
    with pytest.raises(CoordinatorAuthError, match="does not authenticate clients"):
        client.request(TcOp.GET, 0)
    assert seen == []


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_client_goes_no_further_with_a_worker_of_another_cluster(secret):
    """Clusters may share a secret: a worker of cluster B proves it as well as A's. A
    client of A refuses it before it sends anything but its hello, and a worker that has
    not learnt its cluster yet is busy, not another cluster."""
    seen: list[bytes] = []
    users = {"txnstream": secret} if secret else None
    lst = Listener("127.0.0.1", 0, lambda data, conn: seen.append(data), users=users,
                   cluster=b"kafka-1/b")
    io = IoLoop("test-cluster")
    try:
        def connect(cluster: bytes) -> ClientConnection:
            return ClientConnection.open(io, lst.address, secret, None, lambda _r: None,
                                         lambda _c: None, 2, cluster=cluster)
        with pytest.raises(WrongClusterError, match="serves cluster 'kafka-1/b', not "
                                                    "'kafka-1/a'"):
            connect(b"kafka-1/a")
        with pytest.raises(WrongClusterError, match="'kafka-2/b'"):
            connect(b"kafka-2/b")
        ok = connect(b"kafka-1/b")
        ok.send(b"x")
        lst.cluster = None  # as a worker before the broker told it its cluster id
        with pytest.raises(ConnectionError, match="busy: the worker is starting"):
            connect(b"kafka-1/b")
        deadline = time.monotonic() + 3
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [b"x"], "only the connection of its own cluster sent a request"
    finally:
        io.close()
        lst.close()


def test_a_relay_cannot_rename_the_cluster_a_worker_named():
    """With a secret, the worker's proof covers the cluster its hello named: a relay that
    rewrites B's hello to name A fails the client's check of that proof."""
    from txnstream.coordinator.line_security import handshake_proof

    sn, cn, who = bytes(16), bytes(range(16)), b"txnstream"
    assert handshake_proof(SECRET, b"worker", sn, cn, who, b"k/b") != \
        handshake_proof(SECRET, b"worker", sn, cn, who, b"k/a")


def test_the_connection_cap_refuses_one_more_and_idle_connections_are_closed(listeners):
    lst = listeners(limits=LineLimits(max_connections=2, idle_timeout_s=0.5))
    io = IoLoop("test-cap")
    try:
        def connect() -> ClientConnection:
            return ClientConnection.open(io, lst.address, None, None, lambda _r: None,
                                         lambda _c: None, 2)
        first, second = connect(), connect()
        with pytest.raises(ConnectionError, match="max_connections"):
            connect()
        assert not first.closed.is_set() and not second.closed.is_set()
        assert first.closed.wait(3) and second.closed.wait(3), "idle connections closed"
        deadline = time.monotonic() + 3
        while lst.connections() and time.monotonic() < deadline:
            time.sleep(0.05)
        connect().close()  # room again once they are gone
    finally:
        io.close()


def test_a_client_with_a_secret_refuses_a_worker_claiming_certificates_over_plain_tcp(
        make_client):
    """An impostor answers the handshake with the mutual-TLS mode ("T": a certificate
    said who the client is) over plain TCP. The client has no TLS, so no certificate
    proved the worker either: it must insist on the proof of its secret (it used to skip
    it, and the impostor then answered every request; issue 34 item 5)."""
    from txnstream.coordinator.transport import MAGIC, NONCE_BYTES
    from txnstream.errors import WorkerIdentityError

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()

    def impostor() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(MAGIC + bytes(NONCE_BYTES) + bytes(2))  # a cluster of 0 bytes
            conn.recv(4096)  # the client's hello and proof
            conn.sendall(b"OK" + b"T" + bytes(32))

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    try:
        client, d = make_client(secret=SECRET, request_timeout_s=4)
        d.set(0, Endpoint("127.0.0.1", srv.getsockname()[1]), epoch=10)
        with pytest.raises(WorkerIdentityError, match="could not prove"):
            client.request(TcOp.GET, 0)
    finally:
        stop.set()
        t.join(2)
        srv.close()


def test_a_certificate_may_not_name_the_unauthenticated_principal(make_client, certs):
    """A certificate whose common name is ``anonymous`` would make its holder the
    principal of clients that prove nothing, whose group keys are not scoped: refused,
    saying why (issue 34 item 6)."""
    made: list[Listener] = []
    try:
        mtls = tls_listener(made, Config(tc_tls_certfile=certs["worker.pem"],
                                         tc_tls_keyfile=certs["worker.key"],
                                         tc_tls_cafile=certs["ca.pem"], tc_tls_client_auth=True))
        client, d = make_client(request_timeout_s=5)
        client._tls = client_ssl_context(Config(tc_tls_cafile=certs["ca.pem"],
                                                tc_tls_certfile=certs["anonymous.pem"],
                                                tc_tls_keyfile=certs["anonymous.key"]))
        d.set(0, mtls.address, epoch=10)
        with pytest.raises(CoordinatorAuthError, match="'anonymous'"):
            client.request(TcOp.GET, 0)
    finally:
        for lst in made:
            lst.close()


def test_connections_that_never_handshake_cannot_lock_out_clients(listeners, make_client):
    """Idle TCP connections from another address, far more than the connection cap: they
    are closed at once past the per-host handshake cap, never take the capacity of
    authenticated clients, and an honest client gets in at once (2,000 of them used to
    lock every new client out with "at its cap"; issue 34 item 3)."""
    lst = listeners(secret=SECRET, limits=LineLimits(max_connections=8,
                                                     max_handshakes_per_host=4))
    held: list[socket.socket] = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))  # the flooder's address, not the client's
            s.connect((lst.address.host, lst.address.port))
            held.append(s)
        # beyond the per-host cap a connection is closed without a greeting
        closed = 0
        for s in held:
            s.settimeout(2.0)
            try:
                data = s.recv(64)
            except TimeoutError:
                continue
            closed += data == b""
        assert closed >= 40 - 4, f"only {closed} of the flood's connections were closed"
        client, d = make_client(secret=SECRET, request_timeout_s=4)
        d.set(0, lst.address, epoch=10)
        t0 = time.monotonic()
        assert client.request(TcOp.GET, 0).txn_seq == 7
        assert time.monotonic() - t0 < 2.0
    finally:
        for s in held:
            s.close()
