"""The coordinator worker's log loop classifies consumed errors, with no broker.

Every consumed error goes through ``txnstream.errors.message_error``: informational ones
pass quietly, others are logged naming the loop, and a fatal one stops the worker (it
leaves the group so another worker takes its TCs) instead of being dropped unseen.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from txnstream import metrics
from txnstream.config import Config, TopicNames
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.ownership import TcIncarnation, TcPhase
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.errors import KafkaClientError

CONFIG = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"),
                kafka={"log_level": 0})  # nothing listens there: no connect errors on stderr


class Msg:
    def __init__(self, value: bytes | None = None, err: KafkaError | None = None,
                 partition: int = 0, offset: int = 0) -> None:
        self._value, self._err, self._partition, self._offset = value, err, partition, offset

    def error(self) -> KafkaError | None:
        return self._err

    def value(self) -> bytes | None:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return CONFIG.topics.log


class FakeConsumer:
    def __init__(self, batches: list[list[Msg]] | None = None) -> None:
        self.batches = list(batches or [])

    def poll(self, timeout: float) -> Msg | None:
        if self.batches and self.batches[0]:
            return self.batches[0].pop(0)
        if self.batches:
            self.batches.pop(0)
        time.sleep(min(timeout, 0.01))
        return None

    def consume(self, n: int, timeout: float) -> list[Msg]:
        out = self.batches.pop(0) if self.batches else []
        return out

    def subscribe(self, *a: Any, **kw: Any) -> None:
        pass

    def commit(self, *a: Any, **kw: Any) -> None:
        pass

    def incremental_unassign(self, *a: Any) -> None:
        pass

    def unsubscribe(self) -> None:  # a cooperative member leaves before close()
        pass

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, **kw: Any) -> None:
        self.sent.append((topic, value))

    def flush(self, timeout: float = -1) -> int:
        return 0

    def poll(self, timeout: float = 0) -> int:
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return SimpleNamespace(cluster_id="fake-cluster", topics={})


class FakeKafka:
    """The worker's Kafka clients: the fakes above, and an admin client that does nothing."""

    def __init__(self, log_batches: list[list[Msg]]) -> None:
        self.log_batches = log_batches

    def consumer(self, conf: dict[str, Any]) -> FakeConsumer:
        return FakeConsumer(self.log_batches)

    def producer(self, conf: dict[str, Any]) -> FakeProducer:
        return FakeProducer()

    def admin(self, conf: dict[str, Any]) -> AdminClient:
        return MagicMock(spec_set=AdminClient)


class FakeConn:
    """The connection a request came in on: what the worker answers."""

    peer = "127.0.0.1:9"
    principal = "anonymous"

    def __init__(self, peer: str = "127.0.0.1:9") -> None:
        self.peer = peer
        self.sent: list[bytes] = []
        self.inflight = 0
        self.closed = threading.Event()

    def send(self, data: bytes) -> None:
        if not self.closed.is_set():
            self.sent.append(data)

    def took(self, nbytes: int) -> None:
        pass  # a real connection reads on (backpressure); nothing to read here

    def gone(self) -> bool:
        return self.closed.is_set()

    def close(self) -> None:
        self.closed.set()


def arrive(w: CoordinatorWorker, data: bytes, conn: Any) -> None:
    """``data`` read from ``conn`` by the worker's listener (its thread's callback)."""
    w._listener._on_request(data, conn)


@pytest.fixture
def make_worker():
    made: list[CoordinatorWorker] = []

    def make(log_batches: list[list[Msg]], requests: list[bytes]
             ) -> tuple[CoordinatorWorker, FakeConn]:
        # unsigned: these fakes have no cluster id to make the marker key with
        w = CoordinatorWorker(CONFIG, worker_id="w-unit", kafka=FakeKafka(log_batches),
                              settings=WorkerSettings(unsigned=True))
        made.append(w)
        conn = FakeConn()
        for r in requests:
            arrive(w, r, conn)
        tc = TcIncarnation(0, TransactionMetadataStore(0, "w-unit"), replay_end=0,
                           phase=TcPhase.SERVING)
        tc.next_checkpoint = float("inf")
        w.tcs[0] = tc
        return w, conn

    yield make
    for w in made:
        w._listener.close()


def get_request(request_id: str, tc_id: int = 0) -> bytes:
    return TcRequest(request_id, "c", 0, TcOp.GET, tc_id, int(time.time() * 1000) + 60_000,
                     txn_seq=3).encode()


def test_log_loop_logs_a_consumed_error_and_serves_the_requests(make_worker, caplog):
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized")
    w, conn = make_worker([[Msg(err=denied)]], [get_request("r1")])
    with caplog.at_level(logging.WARNING):
        w._turn_once()
    assert "log consumer" in caplog.text and "not authorized" in caplog.text
    assert [TcReply.decode(v).request_id for v in conn.sent] == ["r1"]


def test_end_of_partition_on_the_log_loop_is_quiet(make_worker, caplog):
    eof = KafkaError(KafkaError._PARTITION_EOF, "end")
    w, conn = make_worker([[Msg(err=eof)]], [get_request("r2")])
    with caplog.at_level(logging.WARNING):
        w._turn_once()
    assert "log consumer" not in caplog.text
    assert [TcReply.decode(v).request_id for v in conn.sent] == ["r2"]


def test_a_request_for_a_coordinator_not_served_here_is_told_so_at_once(make_worker):
    w, conn = make_worker([], [get_request("r3", tc_id=2)])
    w._turn_once()
    [reply] = [TcReply.decode(v) for v in conn.sent]
    assert reply.request_id == "r3" and reply.error_kind == "NotCoordinatorError"
    assert "does not serve coordinator 2" in (reply.error_message or "")


def test_a_read_whose_connection_is_gone_is_not_handled_and_others_are(make_worker):
    """A peer that pipelined reads and reset its connection (never reading the replies)
    left a backlog the worker went on handling, holding others' commits for seconds
    after it left (CI: test_fair_worker's commit right after a LIST flood, 2.0-2.4 s)."""
    w, honest = make_worker([], [])
    gone = FakeConn("127.0.0.1:66")
    for i in range(5):
        arrive(w, get_request(f"lost-{i}"), gone)
    gone.close()  # the peer reset it: what a failed write tells the transport
    arrive(w, get_request("kept"), honest)
    before = _handled("GET")
    w._turn_once()
    assert [TcReply.decode(v).request_id for v in honest.sent] == ["kept"]
    assert _handled("GET") - before == 1  # the kept one, none of the five


def _handled(op: str) -> float:
    return sum(s.value for m in metrics.REQUESTS.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels.get("op") == op)


def test_a_garbage_request_is_logged_naming_its_peer_and_the_rest_served(make_worker, caplog):
    w, conn = make_worker([], [b"\x01garbage"])
    other = FakeConn("127.0.0.2:9")
    arrive(w, get_request("r4"), other)
    with caplog.at_level(logging.ERROR):
        w._turn_once()
    assert "connection from 127.0.0.1:9 (principal anonymous): a corrupt request" in caplog.text
    assert [TcReply.decode(v).request_id for v in other.sent] == ["r4"]


def test_a_connection_sending_garbage_is_closed_and_logged_once_not_per_frame(
        make_worker, caplog):
    """Frames that do not parse close their connection; a flood of them is one log line,
    not one ERROR per frame (118 MB of log for 11.8 MB sent, issue 34 item 8), and the
    other connections' requests are served."""
    w, honest = make_worker([], [])
    flooder = FakeConn("127.0.0.1:66")
    for i in range(500):
        arrive(w, b"\x01garbage-%d" % i, flooder)
    arrive(w, get_request("r5"), honest)
    with caplog.at_level(logging.WARNING):
        while w._inbox.waiting():
            w._turn_once()
    assert flooder.closed.is_set(), "the connection that sent garbage stayed open"
    lines = [r for r in caplog.records if "127.0.0.1:66" in r.getMessage()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} log lines for one flooding connection"
    assert "closing" in lines[0].getMessage()
    assert [TcReply.decode(v).request_id for v in honest.sent] == ["r5"]


def test_fatal_consumed_error_stops_the_worker_instead_of_looping(make_worker, caplog):
    fatal = KafkaError(KafkaError._FATAL, "consumer fenced", fatal=True)
    w, _ = make_worker([[Msg(err=fatal)]], [])
    raised: list[BaseException] = []

    def run() -> None:
        try:
            w.run()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        w.stop()
        pytest.fail("the worker kept running after a fatal consumer error")
    assert len(raised) == 1 and isinstance(raised[0], KafkaClientError), raised
    assert "consumer fenced" in str(raised[0])
    assert not w.tcs, "a stopped worker serves nothing"


def test_an_unsigned_worker_says_so_at_start(make_worker, caplog):
    fatal = KafkaError(KafkaError._FATAL, "consumer fenced", fatal=True)
    w, _ = make_worker([[Msg(err=fatal)]], [])
    with caplog.at_level(logging.WARNING), pytest.raises(KafkaClientError):
        w.run()
    [said] = [r for r in caplog.records if "not signed" in r.getMessage()
              and r.name == "txnstream.coordinator.worker"]  # (its buffer role says it too)
    assert said.levelno == logging.WARNING and "--unsigned" in said.getMessage()
    assert "membership" in said.getMessage() and "w-unit" in said.getMessage()


def test_connections_of_requests_nobody_answers_are_forgotten_past_their_deadline(
        make_worker):
    """The worker remembers which connection each request came on until it answers; an
    incarnation that dropped its waiters never answers: those are swept once past their
    deadline, and a sweep that finds most still waiting is not redone every turn."""
    from txnstream.coordinator.origins import SWEEP_AT, Origin

    w, conn = make_worker([], [])
    now_ms = int(time.time() * 1000)

    def taken(deadline_ms: int) -> Origin:
        return Origin(conn, deadline_ms, time.monotonic(), time.monotonic(), "END", 0, 1)

    by_id = w._origins._by_id
    by_id.update({f"gone-{i}": taken(now_ms - 1) for i in range(SWEEP_AT)})
    waiting = {f"wait-{i}": taken(now_ms + 60_000) for i in range(10)}
    by_id.update(waiting)
    w._turn_once()
    assert set(w._origins._by_id) == set(waiting)
    w._origins._by_id.update({f"live-{i}": taken(now_ms + 60_000) for i in range(SWEEP_AT)})
    w._turn_once()
    assert len(w._origins) == SWEEP_AT + 10, "live ones are kept"
    assert w._origins._sweep_at == 2 * len(w._origins)


def test_garbage_closes_its_connection_at_once_while_the_worker_serves_no_tc(make_worker):
    """Seed 66's soak: a connection that sent a frame with no request in it stayed open
    60 s, on a worker whose TCs were revoked and replayed again and again: the garbage
    waited in the inbox, which a worker serving no TC does not read. It is refused when
    it is read, as Kafka's network thread closes a connection whose request does not
    parse."""
    w, _ = make_worker([], [])
    w.tcs.clear()  # every TC revoked: the worker serves none
    flooder = FakeConn("127.0.0.1:66")
    arrive(w, b"\xff" + bytes(range(64)), flooder)
    for _ in range(3):
        w._turn_once()
    assert flooder.closed.is_set(), "a connection that sent garbage was kept open"


def test_nothing_a_connection_sends_after_its_garbage_is_taken(make_worker):
    """The worker takes a connection's frames in order and closes it at the garbage: a
    request read after it (already in the socket's buffer) is not handled."""
    w, _ = make_worker([], [])
    flooder = FakeConn("127.0.0.1:66")
    arrive(w, b"\xff" + bytes(range(64)), flooder)
    arrive(w, get_request("after-garbage"), flooder)
    assert w._inbox.waiting() == 0, "a request sent after garbage was queued"
    w._turn_once()
    assert flooder.sent == [], "a request sent after garbage was answered"
