"""The hostile profile's flood (issue 34): principals that try to stall, evict, lock out.

One process, idle for the first ``quiet_s`` of the workload (the run's quiet phase: the
harness compares honest commit latency before and during the flood, :mod:`chaos.latency`),
then a ``phase`` truth event ``flood`` and these threads, as principal ``chaos-flooder``
(valid credentials) unless said otherwise:

- **lister**: ``list_connections`` connections of its own to the live workers,
  pipelining LIST and STATS requests of the TCs each worker serves, ``list_window`` at a
  time per connection, as fast as the worker answers, while the principal opens
  ``own_txns`` txns on every TC, so a LIST has pages to show (issue 34 item 2).
- **evictor**: RESERVEs TxnIDs within its limit and group-commits them one per group
  under keys of 4,000-15,000 bytes, ``evict_rate`` a second (a thread per TC), to push
  other principals' group outcomes out of the coordinators' memory (item 1). The
  **sentinel** (principal ``chaos-groups``, honest) commits a few groups on every TC
  before the flood and replays one every few seconds: the replay must find its key
  committed (``already``); a replay that commits is an ``intrusion`` (a Spark batch
  committed twice).
- **anonymous**: a client whose principal is literally ``anonymous`` with a secret of
  its own, and one with none, asking to end the sentinel's groups under its keys, bare
  and scoped with the separator (``chaos-groups`` U+001F key), and to LIST; the flooder
  sends the scoped keys too (item 6). Any of these accepted by a worker is an intrusion.
- **garbage**: connections that pass the handshake, then send one frame with a valid tag
  and a payload that is no request, and a STATS after it; a worker that answers the
  STATS, or keeps the connection open :data:`GARBAGE_CLOSE_S`, is an intrusion (item 8).
- **idle**: :class:`~chaos.roles.decoys.IdleHolder`, ``idle_sockets`` connections per
  worker from ``idle_hosts`` loopback addresses that never handshake (item 3).
- **forger**: a plain confluent-kafka producer writing endpoint records, every
  :data:`FORGE_EVERY_S`, for every TC: one naming an :class:`~chaos.roles.decoys.Impostor`
  (item 5), ``tarpit_records`` naming a :class:`~chaos.roles.decoys.Tarpit` (item 7), and
  one naming a live genuine worker that is not the TC's owner (item 4), all with huge
  epochs. Their ``owner_id`` starts with ``flood-``.

It finds the live workers as any holder of credentials could: the endpoint records'
addresses, each kept while a handshake with it proves the worker. Every outcome is
counted in a ``flood_stats`` truth event (``who op outcome`` -> n); what a worker accepts
that it must not is an ``intrusion`` (the checker's ``line_intrusion``). At SIGTERM it
aborts the txns it still holds and exits.
"""

from __future__ import annotations

import functools
import os
import random
import string
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from chaos.credentials import GROUPS
from chaos.roles.common import RoleArgs, run_role
from chaos.roles.decoys import (
    FORGED_OWNER_PREFIX,
    IdleHolder,
    Impostor,
    Tarpit,
    forge_endpoints,
)
from chaos.truth import TruthLog
from txnstream import Client
from txnstream.coordinator.client_connection import ClientConnection
from txnstream.coordinator.endpoints import TcEndpoint
from txnstream.coordinator.protocol import GROUP_SCOPE, TcOp, TcReply, TcRequest
from txnstream.coordinator.transport import Endpoint, IoLoop
from txnstream.errors import TxnStreamError
from txnstream.types import ANONYMOUS

__all__ = ["run"]

STATS_EVERY_S = 5.0
PROBE_EVERY_S = 10.0
"""Live workers are proved again this often (a worker restarted by the nemesis moves)."""
FORGE_EVERY_S = 30.0
SENTINEL_GROUPS = 4  # groups the sentinel commits per TC before the flood
SENTINEL_EVERY_S = 2.0
OWN_TIMEOUT_S = 3600.0
"""The lister's own txns': a worker's longest, longer than any run (ended at stop)."""
EVICT_LEASE_S = 600.0
GARBAGE_CLOSE_S = 60.0
"""A garbage frame waits behind its principal's own flood in the worker's inbox (and a
paused worker closes nothing): a connection not closed within this is kept open."""
REQUEST_S = 5.0
RELEASE_S = 8.0
"""The stop's release is retried this long; with a request's 5 s and the threads' 5 s
it stays within the harness's stop grace (20 s)."""
RESERVE_MAX = 256


def _set(event: threading.Event, _data: bytes) -> None:
    event.set()


def _key(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choices(string.ascii_letters, k=rng.randint(lo, hi)))


class Flood:
    """The flood threads of one process."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        sp = args.spec
        self.args, self.client, self.stop = args, client, stop
        self.quiet_s: float = sp.get("quiet_s", 0.0)
        self.list_connections: int = sp.get("list_connections", 3)
        self.list_window: int = sp.get("list_window", 16)
        self.own_txns: int = sp.get("own_txns", 1_000)
        self.evict_rate: float = sp.get("evict_rate", 20.0)
        self.rate: float = sp.get("rate", 2.0)
        self.tarpit_records: int = sp.get("tarpit_records", 2)
        self.pause_s: float = sp.get("pause_s", 10.0)
        self.rng = random.Random(args.seed * 104729 + args.incarnation)
        self.truth = TruthLog(args.truth)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.ntc = client.tc.num_coordinators
        cfg = client.config
        self.principal, self.secret = cfg.tc_principal, cfg.tc_secret
        self.cluster = client.tc.cluster
        groups_secret = Path(sp["groups_secret_file"]).read_text().strip()
        self.sentinel = Client(config=cfg.with_(tc_principal=GROUPS, tc_secret=groups_secret))
        self.anonymous = [Client(config=cfg.with_(tc_principal=ANONYMOUS,
                                                  tc_secret=uuid.uuid4().hex)),
                          Client(config=cfg.with_(tc_principal=ANONYMOUS, tc_secret=None))]
        self.io = IoLoop("flood-line")
        self.impostor = Impostor(self._count, self._intrusion, args.seed, self.cluster)
        self.tarpit = Tarpit(self._count)
        self.idle = IdleHolder(self._count, self._intrusion, sp.get("idle_sockets", 200),
                               sp.get("idle_hosts", 4), self.pause_s)
        self.seen: dict[Endpoint, int] = {}
        """Addresses of genuine-looking endpoint records -> failed probes in a row."""
        self.records: dict[int, dict[int, Endpoint]] = {}
        """Per TC, epoch -> address of every record not forged by this process."""
        self.live: list[Endpoint] = []
        self.owner: dict[int, Endpoint] = {}
        self.sentinel_keys: list[tuple[int, str, int]] = []
        """(tc, key, first seq) of the sentinel's committed groups."""
        self.own: dict[int, list[int]] = {}
        self.evict_pool: dict[int, deque[int]] = {tc: deque() for tc in range(self.ntc)}

    def _count(self, who: str, op: str, outcome: str) -> None:
        with self._lock:
            self.counts[f"{who} {op} {outcome}"] += 1

    def _intrusion(self, who: str, op: str, detail: str) -> None:
        self.truth.write({"e": "intrusion", "who": who, "op": op, "txn": None,
                          "detail": detail[:500], "by": self.args.writer, "t": time.time()})

    def _write_stats(self) -> None:
        with self._lock:
            counts = dict(self.counts)
        self.truth.write({"e": "flood_stats", "by": self.args.writer, "counts": counts},
                         sync=False)

    def _ask(self, who: str, client: Client, op: str, tc_op: TcOp, tc: int,
             **fields: Any) -> TcReply | None:
        """One request; its outcome counted; the reply if it succeeded."""
        try:
            reply = client.tc.request(tc_op, tc, timeout_s=REQUEST_S, **fields)
        except TxnStreamError as exc:
            self._count(who, op, type(exc).__name__)
        except (OSError, ConnectionError) as exc:
            self._count(who, op, type(exc).__name__)
        else:
            self._count(who, op, "impostor" if reply.owner_id == "impostor" else "accepted")
            return reply
        return None

    def _reserve(self, who: str, client: Client, tc: int, count: int,
                 lease_s: float) -> list[int]:
        r = self._ask(who, client, "reserve", TcOp.RESERVE, tc, count=count,
                      timeout_ms=int(lease_s * 1000))
        return [] if r is None else list(r.group_seqs)

    def _release(self, who: str, client: Client, tc: int, seqs: list[int]) -> bool:
        """Abort ``seqs`` (txns of ``client``'s principal) in one group end; whether it did."""
        return not seqs or self._ask(who, client, "release", TcOp.END_GROUP, tc,
                                     group_key=f"release-{uuid.uuid4().hex}",
                                     group_seqs=tuple(seqs), commit=False) is not None

    def _discover(self) -> None:
        """Tail the endpoint records; prove each address by a handshake, now and then."""
        topic = self.client.config.topics.endpoints
        c = Consumer(self.client.config.consumer(f"chaos-flood-{self.args.writer}",
                                                 **{"enable.auto.commit": False}))
        next_probe = 0.0
        try:
            c.assign([KafkaTP(topic, p, OFFSET_BEGINNING) for p in range(self.ntc)])
            while not self.stop.is_set():
                for m in c.consume(200, timeout=0.5):
                    if m.error() is not None:
                        continue
                    try:
                        ep = TcEndpoint.decode(m.value())
                    except TxnStreamError:
                        continue
                    if ep.owner_id.startswith(FORGED_OWNER_PREFIX) or ep.owner_id == "forger":
                        continue
                    self.records.setdefault(ep.tc_id, {})[ep.epoch_offset] = ep.endpoint
                    self.seen.setdefault(ep.endpoint, 0)
                if time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + PROBE_EVERY_S
                    self._probe()
        finally:
            c.close()

    def _probe(self) -> None:
        live = []
        for ep in list(self.seen):
            try:
                conn = ClientConnection.open(self.io, ep, self.secret, None, lambda _d: None,
                                             lambda _c: None, 2.0, self.principal,
                                             self.cluster)
            except (OSError, TxnStreamError):
                self.seen[ep] += 1
                if self.seen[ep] >= 3:
                    del self.seen[ep]  # gone for good (a killed worker's old port)
                continue
            conn.close()
            self.seen[ep] = 0
            live.append(ep)
        owner = {}
        for tc, recs in self.records.items():
            for epoch in sorted(recs, reverse=True):
                if recs[epoch] in live:
                    owner[tc] = recs[epoch]
                    break
        self.live, self.owner = sorted(live, key=str), owner

    def _lister(self, index: int) -> None:
        while not self.stop.is_set():
            if not self.live:
                self.stop.wait(1.0)
                continue
            ep = self.live[index % len(self.live)]
            tcs = [tc for tc, o in self.owner.items() if o == ep] or list(range(self.ntc))
            window = threading.Semaphore(self.list_window)

            def on_reply(data: bytes, window: threading.Semaphore = window) -> None:
                window.release()
                if len(data) > 4096:
                    self._count("lister", "reply", "page")
                    return
                try:
                    kind = TcReply.decode(data).error_kind or "ok"
                except TxnStreamError:
                    kind = "undecodable"
                self._count("lister", "reply", kind)

            try:
                conn = ClientConnection.open(self.io, ep, self.secret, None, on_reply,
                                             lambda _c: None, 2.0, self.principal,
                                             self.cluster)
            except (OSError, TxnStreamError) as exc:
                self._count("lister", "connect", type(exc).__name__)
                self.stop.wait(1.0)
                continue
            until = time.monotonic() + PROBE_EVERY_S  # then the owners may have moved
            while not self.stop.is_set() and not conn.closed.is_set() \
                    and time.monotonic() < until:
                if not window.acquire(timeout=1.0):
                    continue
                op = TcOp.LIST if self.rng.random() < 0.5 else TcOp.STATS
                req = TcRequest(uuid.uuid4().hex, "flood", -1, op, self.rng.choice(tcs),
                                int((time.time() + 30) * 1000), after_seq=-1)
                conn.send(req.encode())
                self._count("lister", op.value.lower(), "sent")
            conn.close()

    def _own_txns(self) -> None:
        """Open ``own_txns`` txns on every TC while the listers list them.

        Reserved, then activated (a LIST shows no reserved txn), with the longest timeout
        a worker allows; the flooder ends them when it stops. (Opened before the LIST
        flood, at the ~7 activations a second a loaded 2-core machine allows, they took
        the whole flood phase of a 10-minute run: no LIST was ever sent.)
        """
        with ThreadPoolExecutor(8, thread_name_prefix="activate") as pool:
            for tc in range(self.ntc):
                mine = self.own.setdefault(tc, [])
                for _ in range(-(-self.own_txns // RESERVE_MAX) * 2):  # retries too
                    if len(mine) >= self.own_txns or self.stop.is_set():
                        break
                    got = self._reserve("lister", self.client, tc,
                                        min(RESERVE_MAX, self.own_txns - len(mine)),
                                        OWN_TIMEOUT_S)
                    if self.stop.is_set():  # the stop's release may have passed them
                        self._release("lister", self.client, tc, got)
                        break
                    mine += got  # ended at stop, activated or not
                    list(pool.map(self._activate, [tc] * len(got), got,
                                  [int(time.time() * 1000)] * len(got)))

    def _activate(self, tc: int, seq: int, now_ms: int) -> None:
        self._ask("lister", self.client, "activate", TcOp.ACTIVATE, tc, txn_seq=seq,
                  timeout_ms=int(OWN_TIMEOUT_S * 1000), open_time_ms=now_ms)

    def _sentinel_commit(self) -> None:
        """The honest principal's groups, committed before the flood."""
        for tc in range(self.ntc):
            for g in range(SENTINEL_GROUPS):
                seqs = self._reserve("sentinel", self.sentinel, tc, 1, 60.0)
                if not seqs:
                    continue
                key = f"batch-{self.args.writer}-{tc}-{g}"
                r = self._ask("sentinel", self.sentinel, "commit", TcOp.END_GROUP, tc,
                              group_key=key, group_seqs=tuple(seqs), commit=True)
                if r is not None and not r.already:
                    self.sentinel_keys.append((tc, key, seqs[0]))

    def _sentinel(self) -> None:
        self._sentinel_commit()
        while not self.stop.wait(SENTINEL_EVERY_S):
            if not self.sentinel_keys:
                continue
            tc, key, first = self.rng.choice(self.sentinel_keys)
            seqs = self._reserve("sentinel", self.sentinel, tc, 1, 60.0)
            if not seqs:
                continue
            try:
                r = self.sentinel.tc.request(TcOp.END_GROUP, tc, timeout_s=REQUEST_S,
                                             group_key=key, group_seqs=tuple(seqs),
                                             commit=True)
            except (TxnStreamError, OSError) as exc:
                self._count("sentinel", "replay", type(exc).__name__)
                continue
            if r.already and first in r.group_seqs:
                self._count("sentinel", "replay", "recognised")
            else:
                self._count("sentinel", "replay", "committed_again")
                self._intrusion("evictor", "end_group", f"the replay of {GROUPS}'s group "
                                f"{key!r} on TC {tc} committed again (txn seq {seqs[0]}; "
                                f"already={r.already}, seqs {r.group_seqs[:4]}): its "
                                "outcome was forgotten")

    def _evictor(self, tc: int) -> None:
        """Group commits on TC ``tc`` (one thread per TC: each waits for its commit)."""
        rng = random.Random(self.rng.random())
        pool = self.evict_pool[tc]
        while not self.stop.wait(rng.expovariate(self.evict_rate / self.ntc)):
            if not pool:
                pool.extend(self._reserve("evictor", self.client, tc, RESERVE_MAX,
                                          EVICT_LEASE_S))
                if not pool:
                    continue
            seq = pool.popleft()
            self._ask("evictor", self.client, "end_group", TcOp.END_GROUP, tc,
                      group_key=_key(rng, 4_000, 15_000), group_seqs=(seq,), commit=True)

    def _anonymous(self) -> None:
        while not self.stop.wait(self.rng.expovariate(self.rate)):
            if not self.sentinel_keys:
                continue
            tc, key, first = self.rng.choice(self.sentinel_keys)
            scoped = f"{GROUPS}{GROUP_SCOPE}{key}"
            r = self.rng.random()
            if r < 0.3:  # a valid principal spelling another's scoped key
                who, client, gkey = "flooder", self.client, scoped
            else:
                client = self.rng.choice(self.anonymous)
                who = "anonymous" if client.config.tc_secret is None else "anonymous_secret"
                gkey = self.rng.choice((key, scoped))
            if r > 0.85:
                reply = self._ask(who, client, "list", TcOp.LIST, tc, after_seq=-1)
            else:
                reply = self._ask(who, client, "end_group", TcOp.END_GROUP, tc,
                                  group_key=gkey, group_seqs=(first,),
                                  commit=self.rng.random() < 0.5)
            if reply is None:
                continue
            if reply.owner_id == "impostor":  # no worker: only a client without a secret
                continue
            if r > 0.85:
                if any(t.owner != client.config.tc_principal for t in reply.txns):
                    self._intrusion(who, "list", f"LIST on TC {tc} showed {ANONYMOUS!r}-"
                                    f"named client others' txns: {str(reply)[:300]}")
                continue
            self._intrusion(who, "end_group", f"accepted on TC {tc} from "
                            f"{client.config.tc_principal!r} (key {gkey[:80]!r}): "
                            f"{str(reply)[:300]}")

    def _garbage(self) -> None:
        """A frame with a valid tag and no request in it, then a STATS that must go unanswered.

        The worker takes a connection's frames in order and closes it at the garbage, so
        an answer to the STATS means it kept serving that connection.
        """
        while not self.stop.wait(self.rng.expovariate(self.rate / 2)):
            if not self.live:
                continue
            ep = self.rng.choice(self.live)
            answered = threading.Event()
            try:
                conn = ClientConnection.open(self.io, ep, self.secret, None,
                                             functools.partial(_set, answered),
                                             lambda _c: None, 2.0, self.principal,
                                             self.cluster)
            except (OSError, TxnStreamError) as exc:
                self._count("garbage", "connect", type(exc).__name__)
                continue
            t0 = time.monotonic()
            conn.send(b"\xff" + os.urandom(self.rng.randrange(16, 4096)))
            conn.send(TcRequest(uuid.uuid4().hex, "flood", -1, TcOp.STATS,
                                self.rng.randrange(self.ntc),
                                int((time.time() + 60) * 1000)).encode())
            closed = conn.closed.wait(GARBAGE_CLOSE_S)
            self._count("garbage", "frame", "answered" if answered.is_set() else
                        "closed" if closed else "kept_open")
            if closed:  # how long it waited in the worker's inbox, behind the flood
                secs = time.monotonic() - t0
                self._count("garbage", "closed within", "5 s" if secs < 5 else
                            "20 s" if secs < 20 else f"{GARBAGE_CLOSE_S:g} s")
            if answered.is_set() or not closed:
                self._intrusion("garbage", "frame", f"{ep} kept serving a connection after a "
                                "frame with a valid tag and no request in it: "
                                + ("answered the request after it" if answered.is_set()
                                   else f"open {GARBAGE_CLOSE_S:g} s later"))
            conn.close()

    def _forger(self) -> None:
        producer = Producer(self.client.config.producer(**{"linger.ms": 5}))
        try:
            while not self.stop.is_set():
                for tc in range(self.ntc):
                    others = [e for e in self.live if e != self.owner.get(tc)]
                    forge_endpoints(producer, self.client.config.topics.endpoints, tc,
                                    self.impostor.port, self.tarpit.port,
                                    self.tarpit_records,
                                    self.rng.choice(others) if others else None, self._count)
                producer.flush(10)
                self.stop.wait(FORGE_EVERY_S)
        finally:
            producer.flush(10)

    def loop(self) -> None:
        """Quiet, then flood until stopped; counts every few seconds."""
        early = [threading.Thread(target=fn, daemon=True, name=fn.__name__)
                 for fn in (self._discover, self._sentinel)]
        for th in early:
            th.start()
        if self.stop.wait(self.quiet_s):
            self._write_stats()
            return
        self.truth.write({"e": "phase", "phase": "flood", "t": time.time(),
                          "by": self.args.writer})
        self._write_stats()  # the quiet phase's counts (the sentinel's)
        threads = [threading.Thread(target=self.idle.run, args=(self.stop, lambda: self.live),
                                    daemon=True, name="idle"),
                   *(threading.Thread(target=self._evictor, args=(tc,), daemon=True,
                                      name=f"evictor-{tc}") for tc in range(self.ntc)),
                   *(threading.Thread(target=self._lister, args=(i,), daemon=True,
                                      name=f"lister-{i}") for i in range(self.list_connections)),
                   *(threading.Thread(target=fn, daemon=True, name=fn.__name__)
                     for fn in (self._own_txns, self._anonymous, self._garbage, self._forger))]
        for th in threads:
            th.start()
        while not self.stop.wait(STATS_EVERY_S):
            self._write_stats()
        self.truth.write({"e": "phase", "phase": "flood_end", "t": time.time(),
                          "by": self.args.writer})
        # End what it holds (the drain waits for no open txn): every TC at once, retried
        # while a broker or worker is down (seed 24: one timed-out release left 591 open).
        deadline = time.monotonic() + RELEASE_S

        def release(tc: int) -> None:
            for who, seqs in (("lister", self.own.pop(tc, [])),
                              ("evictor", list(self.evict_pool[tc]))):
                while not self._release(who, self.client, tc, seqs) \
                        and time.monotonic() < deadline:
                    time.sleep(0.2)  # stop is set: wait() would not
        with ThreadPoolExecutor(max(1, self.ntc), thread_name_prefix="release") as pool:
            list(pool.map(release, range(self.ntc)))
        deadline = time.monotonic() + 5.0  # within the harness's stop grace (20 s)
        for th in threads + early:
            th.join(max(0.0, deadline - time.monotonic()))
        self._write_stats()

    def close(self) -> None:
        """Close the decoys, the extra clients and the truth file."""
        self.impostor.close()
        self.tarpit.close()
        for c in (self.sentinel, *self.anonymous):
            c.close()
        self.io.close()
        self.truth.close()


def run(args: RoleArgs) -> int:
    """The flood process, until SIGTERM."""
    return run_role(Flood, args)
