"""The hostile profile's line intruders: nothing they send may change an honest txn.

One process, three threads, each sending a few requests a second at random:

- **stranger**: a principal with valid credentials that owns none of the honest txns.
  It learns honest TxnIDs as any reader of the data topics can (their ``txn.id``
  headers) and asks to end, extend, register, read and group-end them, lists
  transactions, and sends fields no client would (negative timeouts, long reasons,
  TxnIDs that were never issued). It also opens and abandons txns of its own.
- **anonymous**: clients with no secret, or with an honest principal's name and a wrong
  secret, sending the same requests.
- **raw**: TCP connections to the workers' ports that send garbage, a handshake with a
  false proof or an oversized principal, or nothing at all (a worker must close them).
- **forger**: a plain confluent-kafka producer writing into the data topics what any
  producer with write access could: markers (COMMIT/ABORT, huge low watermarks) for
  honest txns it learnt, records with a ``txn.id`` no coordinator issued, copies of an
  honest txn's record after its marker on the same partition (MirrorMaker's late copy),
  records naming the next TxnIDs of a coordinator or a live txn without its ``txn.tag``,
  a genuine record's ``txn.id`` and ``txn.tag`` copied into another partition, and
  endpoint records with a huge epoch naming a dead address. Forged record values
  carry ``"forged": true``: a reader that delivers one is a ``forged_record_visible``.

Every answer is counted by (who, op, outcome) in an ``intruder_stats`` truth event. A
request about a txn the stranger did not open that a worker answers with success is an
``intrusion`` event (the checker's ``line_intrusion`` anomaly), as is a LIST reply that
shows another principal's txn, and a raw connection a worker keeps open past its
handshake timeout.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from chaos.cluster import free_port
from chaos.roles.common import RoleArgs, run_role
from chaos.truth import TruthLog, encode_value
from txnstream import Client, TxnID
from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.line_security import MAX_CLUSTER_BYTES
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.protocol import TcOp
from txnstream.coordinator.transport import CLUSTER_LEN, HANDSHAKE_TIMEOUT_S, MAGIC, Endpoint
from txnstream.errors import (
    CoordinatorAuthError,
    InvalidRequestError,
    NotAuthorizedError,
    RequestTimeoutError,
    TransactionNotFoundError,
    TxnStreamError,
)
from txnstream.markers import (
    TXN_ID_HEADER,
    TXN_MARKER_HEADER,
    TXN_TAG_HEADER,
    MarkerKind,
    TxnMarker,
)
from txnstream.types import TopicPartition

__all__ = ["run"]

LEARNED = 2_000
"""Honest TxnIDs remembered (the newest): the ones still open are the ones to attack."""
STATS_EVERY_S = 5.0
FOREIGN_OPS = ("end_commit", "end_abort", "add_partitions", "add_subscriptions", "get",
               "activate", "end_group")
"""Requests about a txn: each must be refused for a txn the stranger did not open."""


class Intruder:
    """The three intruder threads of one process."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        sp = args.spec
        self.args = args
        self.stop = stop
        self.client = client
        self.rate: float = sp.get("rate", 4.0)
        self.pause_s: float = sp.get("pause_s", 0.0)
        self.topics: list[str] = sp["topics"]
        self.rng = random.Random(args.seed * 7919 + args.incarnation)
        self.truth = TruthLog(args.truth)
        self.learned: deque[TxnID] = deque(maxlen=LEARNED)
        self.tags: deque[tuple[TxnID, bytes, str, int]] = deque(maxlen=LEARNED)
        """Honest txn records' ``txn.tag`` and where they were (to copy elsewhere)."""
        self.ended_at: deque[tuple[TxnID, str, int]] = deque(maxlen=LEARNED)
        """Honest txns whose (genuine or not) marker was seen on a partition."""
        self.forge: bool = sp.get("forge", True)
        self.forged = 0
        self.dead = Endpoint("127.0.0.1", free_port())  # nothing listens there
        """Where the forger's endpoint records point: nothing listens there."""
        self.workers: set[Endpoint] = set()
        """Every address an endpoint record named (workers past and present)."""
        self.own_markers: set[tuple[TxnID, str, int]] = set()
        """Where this forger wrote markers: never taken for an honest txn's end."""
        self.own: set[TxnID] = set()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        base = client.config
        self.anonymous = [
            Client(config=base.with_(tc_principal="anonymous", tc_secret=None)),
            Client(config=base.with_(tc_principal="chaos-producer",
                                     tc_secret="not-the-producers-secret")),
        ]
        self.partitions = self._partitions()

    # ------------------------------------------------------------------ bookkeeping

    def _count(self, who: str, op: str, outcome: str) -> None:
        with self._lock:
            self.counts[f"{who} {op} {outcome}"] += 1

    def _intrusion(self, who: str, op: str, txn: TxnID | None, detail: str) -> None:
        self.truth.write({"e": "intrusion", "who": who, "op": op,
                          "txn": None if txn is None else str(txn), "detail": detail[:500],
                          "by": self.args.writer})

    def _write_stats(self) -> None:
        with self._lock:
            counts = dict(self.counts)
        self.truth.write({"e": "intruder_stats", "by": self.args.writer, "counts": counts},
                         sync=False)

    def _partitions(self) -> list[TopicPartition]:
        c = Consumer(self.client.config.consumer("chaos-intruder-probe"))
        try:
            meta = c.list_topics(timeout=10).topics
            return [TopicPartition(t, p) for t in self.topics for p in meta[t].partitions]
        finally:
            c.close()

    # ------------------------------------------------------------------ learning TxnIDs

    def _learn(self) -> None:
        """Tail the data topics' headers and the endpoints, as any reader of them could."""
        c = Consumer(self.client.config.consumer(
            f"chaos-intruder-{self.args.writer}", **{"enable.auto.commit": False}))
        endpoints = self.client.config.topics.endpoints
        try:
            c.assign([KafkaTP(tp.topic, tp.partition, OFFSET_END) for tp in self.partitions]
                     + [KafkaTP(endpoints, p, OFFSET_BEGINNING)
                        for p in range(self.client.tc.num_coordinators)])
            while not self.stop.is_set():
                for m in c.consume(200, timeout=0.5):
                    if m.error() is not None:
                        continue
                    if m.topic() == endpoints:
                        try:
                            rec = TcEndpoint.decode(m.value())
                        except TxnStreamError:
                            continue
                        ep = rec.endpoint
                        if ep != self.dead and not rec.owner_id.startswith("flood-"):
                            self.workers.add(ep)  # (not the flood's impostor or tarpit)
                        continue
                    hdrs = dict(m.headers() or ())
                    raw = hdrs.get(TXN_ID_HEADER)
                    if raw is None:
                        continue
                    try:
                        txn = TxnID.from_bytes(raw)
                    except ValueError:
                        continue
                    if TXN_MARKER_HEADER in hdrs:
                        if (txn, m.topic(), m.partition()) not in self.own_markers:
                            self.ended_at.append((txn, m.topic(), m.partition()))
                        continue
                    if txn not in self.own and (not self.learned or self.learned[-1] != txn):
                        self.learned.append(txn)
                        tag = hdrs.get(TXN_TAG_HEADER)
                        if tag is not None:
                            self.tags.append((txn, tag, m.topic(), m.partition()))
        finally:
            c.close()

    # ------------------------------------------------------------------ line requests

    def _target(self) -> TxnID | None:
        if not self.learned:
            return None
        txn = self.learned[-1 - min(len(self.learned) - 1, int(self.rng.expovariate(0.05)))]
        if self.rng.random() < 0.1:  # a neighbour: issued, maybe never seen on a topic
            txn = TxnID(txn.tc_id, max(0, txn.sequence + self.rng.randint(-3, 3)))
        return None if txn in self.own else txn

    def _fields(self, op: str, txn: TxnID) -> tuple[TcOp, dict[str, Any]]:
        rng = self.rng
        weird = rng.random() < 0.3
        timeout = rng.choice((-1, 0, 1, 2**31 - 1, 10**12)) if weird else 60_000
        tp = rng.choice(self.partitions)
        if op in ("end_commit", "end_abort"):
            return TcOp.END, {"txn_seq": txn.sequence, "commit": op == "end_commit",
                              "reason": "x" * rng.choice((0, 10, 5000)) if weird else None}
        if op == "add_partitions":
            return TcOp.ADD_PARTITIONS, {"txn_seq": txn.sequence, "partitions": (tp,)}
        if op == "add_subscriptions":
            return TcOp.ADD_SUBSCRIPTIONS, {"txn_seq": txn.sequence, "subscriptions": (
                SubscriptionRef(tp.topic, tp.partition, "chaos-eo"),)}
        if op == "get":
            return TcOp.GET, {"txn_seq": txn.sequence}
        if op == "activate":
            return TcOp.ACTIVATE, {"txn_seq": txn.sequence, "timeout_ms": timeout,
                                   "open_time_ms": int(time.time() * 1000)}
        return TcOp.END_GROUP, {"group_key": rng.choice(("", "chaos", "g" * 100)),
                                "group_seqs": (txn.sequence,), "commit": rng.random() < 0.5}

    def _ask(self, who: str, client: Client, op: str, tc_op: TcOp, tc_id: int,
             txn: TxnID | None, **fields: Any) -> Any:
        """Send one request; count its outcome; an accepted foreign request is an intrusion."""
        try:
            reply = client.tc.request(tc_op, tc_id, timeout_s=5.0, **fields)
        except NotAuthorizedError:
            self._count(who, op, "not_authorized")
        except CoordinatorAuthError:
            self._count(who, op, "credentials_refused")
        except TransactionNotFoundError:
            self._count(who, op, "not_found")
        except InvalidRequestError:
            self._count(who, op, "invalid")
        except RequestTimeoutError:
            self._count(who, op, "timeout")
        except TxnStreamError as exc:
            self._count(who, op, type(exc).__name__)
        except (OSError, ConnectionError) as exc:
            self._count(who, op, type(exc).__name__)
        else:
            if reply.owner_id == "impostor":  # the flood's (a client with no secret may)
                self._count(who, op, "impostor")
                return None
            self._count(who, op, "accepted")
            return reply
        return None

    def _foreign(self, who: str, client: Client) -> None:
        txn = self._target()
        if txn is None:
            return
        op = self.rng.choice(FOREIGN_OPS)
        tc_op, fields = self._fields(op, txn)
        reply = self._ask(who, client, op, tc_op, txn.tc_id, txn, **fields)
        if reply is not None and not self._owns(client, txn):
            self._intrusion(who, op, txn, f"accepted: {reply}")

    def _owns(self, client: Client, txn: TxnID) -> bool:
        """Whether ``txn`` is this principal's own after all.

        A neighbour of a learned txn can be an id of a block its own client reserved and
        has not handed out yet (the coordinator rightly lets the owner end it). Asked as
        that principal (GET answers only the owner or an admin); any failure counts as
        not its own.
        """
        try:
            info = client.tc.request(TcOp.GET, txn.tc_id, txn_seq=txn.sequence,
                                     timeout_s=5.0).txns[0]
        except (TxnStreamError, OSError, IndexError):
            return False
        if info.owner != client.config.tc_principal:
            return False
        self.own.add(txn)
        return True

    def _list(self, who: str, client: Client) -> None:
        tc_id = self.rng.randrange(client.tc.num_coordinators)
        reply = self._ask(who, client, "list", TcOp.LIST, tc_id, None,
                          after_seq=self.rng.choice((-1, 0)))
        if reply is None:
            return
        me = client.config.tc_principal
        foreign = [t for t in reply.txns if t.owner != me]
        if foreign:
            self._intrusion(who, "list", foreign[0].txn_id,
                            f"LIST showed {len(foreign)} txn(s) of others, e.g. owner "
                            f"{foreign[0].owner!r}")

    def _own_txn(self) -> None:
        """Open a txn of its own; end about half (the rest time out)."""
        try:
            txn = self.client.new_transaction(timeout_s=5.0)
        except TxnStreamError as exc:
            self._count("stranger", "new", type(exc).__name__)
            return
        self._count("stranger", "new", "accepted")
        self.own.add(txn.id)
        if self.rng.random() < 0.5:
            try:
                txn.abort()
            except TxnStreamError:
                pass

    def _stranger(self) -> None:
        while not self.stop.wait(self.rng.expovariate(self.rate)):
            r = self.rng.random()
            with self._surviving("stranger"):
                if r < 0.1:
                    self._own_txn()
                elif r < 0.2:
                    self._list("stranger", self.client)
                else:
                    self._foreign("stranger", self.client)

    def _anonymous(self) -> None:
        while not self.stop.wait(self.rng.expovariate(self.rate / 2)):
            client = self.rng.choice(self.anonymous)
            who = "anonymous" if client.config.tc_secret is None else "wrong_secret"
            with self._surviving(who):
                if self.rng.random() < 0.2:
                    self._list(who, client)
                else:
                    self._foreign(who, client)

    @contextlib.contextmanager
    def _surviving(self, who: str) -> Iterator[None]:
        """An intruder thread outlives whatever one attempt raises (a broker down)."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - counted; the thread goes on
            self._count(who, "attempt", type(exc).__name__)

    # ------------------------------------------------------------------ raw sockets

    def _raw(self) -> None:
        while not self.stop.wait(self.rng.expovariate(self.rate / 4)):
            eps = sorted(self.workers, key=str)
            if not eps:
                continue
            ep = self.rng.choice(eps)
            kind = self.rng.choice(("garbage", "false_proof", "long_principal", "silent"))
            try:
                outcome = self._raw_once(ep.host, ep.port, kind)
            except Exception as exc:  # noqa: BLE001 - counted; the thread goes on
                outcome = type(exc).__name__
            self._count("raw", kind, outcome)
            if outcome == "kept_open":
                self._intrusion("raw", kind, None, f"{ep} kept a {kind} connection open "
                                f"past its {HANDSHAKE_TIMEOUT_S:g} s handshake timeout "
                                f"(and a {self.pause_s:g} s pause)")

    def _raw_once(self, host: str, port: int, kind: str) -> str:
        with socket.create_connection((host, port), timeout=5.0) as s:
            if kind == "garbage":
                s.sendall(os.urandom(self.rng.randrange(1, 4096)))
            elif kind == "false_proof":
                s.recv(len(MAGIC) + 16 + CLUSTER_LEN.size + MAX_CLUSTER_BYTES)  # the hello
                name = b"chaos-processor"
                s.sendall(MAGIC + os.urandom(16) + bytes([len(name)]) + name + os.urandom(32))
            elif kind == "long_principal":
                s.recv(len(MAGIC) + 16 + CLUSTER_LEN.size + MAX_CLUSTER_BYTES)  # the hello
                s.sendall(MAGIC + os.urandom(16) + b"\xff" + os.urandom(255))
            # A paused worker (the nemesis's SIGSTOP) cannot close anything until it
            # resumes: allow its pause on top of the handshake timeout.
            limit = HANDSHAKE_TIMEOUT_S + self.pause_s + 5.0
            s.settimeout(limit)
            t0 = time.monotonic()
            try:
                while s.recv(4096):  # the greeting, then a refusal; then it must close
                    if time.monotonic() - t0 > limit:
                        return "kept_open"
            except TimeoutError:
                return "kept_open"
            except ConnectionResetError:
                return "reset"
            return "closed"

    # ------------------------------------------------------------------ forged records

    def _forger(self) -> None:
        producer = Producer(self.client.config.producer(**{"linger.ms": 5}))
        dead = self.dead
        try:
            while not self.stop.wait(self.rng.expovariate(self.rate / 2)):
                kind = self.rng.choice(("marker", "marker", "unissued", "late_copy",
                                        "endpoint", "future", "live", "tag_elsewhere"))
                try:
                    done = self._forge_one(producer, kind, dead)
                except Exception as exc:  # noqa: BLE001 - counted; the thread goes on
                    self._count("forger", kind, type(exc).__name__)
                    continue
                self._count("forger", kind, "written" if done else "nothing_to_copy")
                producer.poll(0)
        finally:
            producer.flush(10)

    def _forge_one(self, producer: Producer, kind: str, dead: Endpoint) -> bool:
        rng = self.rng
        tp = rng.choice(self.partitions)
        self.forged += 1
        value = encode_value({"id": f"forged-{self.args.writer}-{self.forged}",
                              "forged": True, "kind": kind})
        if kind == "marker":
            txn = self._target() or TxnID(rng.randrange(self.client.tc.num_coordinators), 0)
            m = TxnMarker(txn, rng.choice((MarkerKind.COMMIT, MarkerKind.ABORT)),
                          rng.choice((0, txn.sequence + 1, 1 << 40)))
            if len(self.own_markers) < 100_000:
                self.own_markers.add((txn, tp.topic, tp.partition))
            producer.produce(tp.topic, m.encode(), partition=tp.partition,
                             headers=m.headers())
        elif kind == "unissued":
            txn = TxnID(rng.randrange(self.client.tc.num_coordinators),
                        (1 << 40) + rng.randrange(1 << 20))
            producer.produce(tp.topic, value, partition=tp.partition,
                             headers=[(TXN_ID_HEADER, txn.to_bytes())])
        elif kind == "future":  # the next TxnIDs of a coordinator (issue 33 item 1)
            if not self.learned:
                return False
            newest = max(self.learned, key=lambda t: t.sequence)
            txn = TxnID(newest.tc_id, newest.sequence + 1 + rng.randrange(64))
            producer.produce(tp.topic, value, partition=tp.partition,
                             headers=[(TXN_ID_HEADER, txn.to_bytes())])
        elif kind == "live":  # a live txn's id, no tag (issue 33 item 2)
            if not self.learned:
                return False
            producer.produce(tp.topic, value, partition=tp.partition,
                             headers=[(TXN_ID_HEADER, self.learned[-1].to_bytes())])
        elif kind == "tag_elsewhere":  # a genuine record's headers, in another partition
            if not self.tags:
                return False
            txn, tag, topic, part = self.tags[-1 - rng.randrange(len(self.tags))]
            others = [p for p in self.partitions if (p.topic, p.partition) != (topic, part)]
            if not others:
                return False
            to = rng.choice(others)
            producer.produce(to.topic, value, partition=to.partition,
                             headers=[(TXN_ID_HEADER, txn.to_bytes()), (TXN_TAG_HEADER, tag)])
        elif kind == "late_copy":
            if not self.ended_at:
                return False
            txn, topic, part = self.ended_at[-1 - rng.randrange(len(self.ended_at))]
            producer.produce(topic, value, partition=part,
                             headers=[(TXN_ID_HEADER, txn.to_bytes())])
        else:
            tc = rng.randrange(self.client.tc.num_coordinators)
            rec = TcEndpoint(tc, "forger", dead, 1 << 50)
            producer.produce(self.client.config.topics.endpoints, rec.encode(),
                             key=str(tc).encode(), partition=tc)
        return True

    # ------------------------------------------------------------------ the process

    def loop(self) -> None:
        """Run the threads until stopped; counts every few seconds."""
        threads = [threading.Thread(target=fn, daemon=True, name=fn.__name__)
                   for fn in (self._learn, self._stranger, self._anonymous, self._raw,
                              *((self._forger,) if self.forge else ()))]
        for th in threads:
            th.start()
        while not self.stop.wait(STATS_EVERY_S):
            self._write_stats()
        for th in threads:
            th.join(15)
        self._write_stats()

    def close(self) -> None:
        """Close the extra clients and the truth file."""
        for c in self.anonymous:
            c.close()
        self.truth.close()


def run(args: RoleArgs) -> int:
    """The intruder process, until SIGTERM."""
    return run_role(Intruder, args)
