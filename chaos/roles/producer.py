"""The producer role: multi-partition txns, shared with another process, some aborted.

Each opener thread loops: open a txn, write 1-4 records to each of 2-4 partitions, keep
the txn open a moment, ask the **peer process** to write into the same TxnID too (the
peer attaches with ``client.attach_transaction(txn_id)``; on a txnstream without it,
with the public class built from the id, ``txnstream.Transaction(client.tc, txn_id,
timeout)``), then end it:

- ``commit`` (most), ``abort`` (``abort_ratio``), ``abandon`` (never ended: the
  coordinator must abort it at its timeout), ``slow`` (held past a short timeout, then
  committed: the coordinator must refuse), ``late`` (committed, then the peer sends
  once more into it through its attached handle and flushes: the record is in if it
  landed before the txn's marker, else the flush raises ``RecordsExcludedError``
  naming it), and ``foreign`` (the peer commits it from its process through its
  attached handle while the opener still writes: the opener sends 1-3 more records
  to its partitions, while the peer commits or once it has, and commits; its
  ``commit()`` returns (all its records are in) or raises ``RecordsExcludedError``
  naming those that landed after the marker, logged as an ``excluded`` event: the
  checker holds every record to that answer, record by record).

In the hostile profile a share of txns (``doomed_ratio``) also writes one record to the
``doomed`` topic, which the harness deletes halfway through the workload: txns that
wrote there and commit after it is gone must still end, their other records visible
(the doomed records are not checked; the topic is gone).

The peer protocol is one JSON line each way over a TCP connection to the peer's port:
``{"op": "cowrite", "txn", "timeout", "parts", "n"}`` -> ``{"ok", "recs"|"error"}`` and
``{"op": "late", "txn"}`` -> ``{"ok", "rejected", "excluded"}`` and ``{"op": "cocommit",
"txn", "timeout"}`` -> ``{"ok", "outcome"}``. The peer logs what it wrote, and the end of
the txns it commits, itself.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import socket
import socketserver
import threading
import time
from collections import OrderedDict, defaultdict
from typing import Any

from chaos.roles.common import RoleArgs, commit_outcome, install_stop, make_client
from chaos.truth import TruthLog, encode_value
from txnstream import Client, Transaction, TxnID
from txnstream.errors import RecordsExcludedError, TxnStreamError
from txnstream.producer import Producer

log = logging.getLogger("chaos.producer")

PEER_TIMEOUT_S = 20.0
"""A co-write waits for the peer's flush; the peer's own coordinator calls ride a
failover (~6 s) inside it."""
ATTACHED_MAX = 512
"""Txns of other processes this peer keeps handles of (for late sends); LRU."""
KINDS = ("abort", "slow", "abandon", "late", "foreign")
"""The ways to end a txn other than a plain commit, each with its ``<kind>_ratio``."""
FOREIGN_RACE_S = (0.0, 0.05)
"""Half the foreign txns: the opener's next sends start this long after it asked the
peer to commit, while the peer commits, so they land before the txn's marker or after
it; the other half send once the peer's commit returned (the markers are written right
after the decision: those records are mostly out)."""


def excluded_at(exc: RecordsExcludedError) -> list[list[Any]]:
    """``exc.excluded`` as ``[[topic, partition, offset], ...]`` for the truth log."""
    return [[tp.topic, tp.partition, off] for tp, offs in exc.excluded.items() for off in offs]


class _Writer:
    """One writer id with its per-partition sequence numbers and record ids."""

    def __init__(self, writer: str) -> None:
        self.writer = writer
        self.seq: defaultdict[int, int] = defaultdict(int)
        self.ids = itertools.count()

    def record(self, txn: TxnID, topic: str, partition: int) -> tuple[bytes, list[Any]]:
        s = self.seq[partition]
        self.seq[partition] += 1
        rid = f"{self.writer}-{next(self.ids)}"
        value = encode_value({"id": rid, "txn": str(txn), "w": self.writer, "p": partition,
                              "s": s, "pad": "x" * 64})
        return value, [rid, topic, partition, self.writer, s]


class ProducerRole:
    """An opener (one or more threads) and a co-writer server in one process."""

    def __init__(self, args: RoleArgs, client: Client, stop: threading.Event) -> None:
        self.args = args
        self.spec = args.spec
        self.client = client
        self.stop = stop
        self.topic: str = self.spec["topic"]
        self.producer: Producer = client.create_producer(self.topic)
        self.partitions = self.producer.num_partitions
        self.truth = TruthLog(args.truth)
        self.co = _Writer(f"{args.writer}.co")
        self._co_lock = threading.Lock()
        self._attached: OrderedDict[str, tuple[Transaction, int]] = OrderedDict()
        self._doomed: Producer | None = None
        self._doomed_gone = not self.spec.get("doomed")

    def _doomed_producer(self) -> Producer | None:
        """The doomed topic's producer; None once the topic is gone.

        It never recreates the topic: ``allow.auto.create.topics`` is off.
        """
        if self._doomed is None and not self._doomed_gone:
            try:
                self._doomed = self.client.create_producer(
                    self.spec["doomed"], **{"allow.auto.create.topics": False})
            except TxnStreamError:
                self._doomed_gone = True
        return self._doomed

    # ------------------------------------------------------------ opener

    def opener(self, index: int) -> None:
        """One opener thread: txn after txn until stopped."""
        rng = random.Random(f"{self.args.seed}/{self.args.writer}/{index}")
        w = _Writer(f"{self.args.writer}.t{index}")
        sp = self.spec
        while not self.stop.is_set():
            r = rng.random()
            kind = "commit"
            for name in KINDS:
                r -= sp.get(f"{name}_ratio", 0.0)
                if r < 0:
                    kind = name
                    break
            timeout = {"slow": sp["slow_timeout_s"],
                       "abandon": sp["abandon_timeout_s"]}.get(kind, sp["txn_timeout_s"])
            try:
                txn = self.client.new_transaction(timeout_s=timeout)
            except TxnStreamError as exc:
                log.warning("new_transaction: %s", exc)
                self.stop.wait(0.5)
                continue
            self.truth.write({"e": "open", "txn": str(txn.id), "by": w.writer, "role": "producer",
                              "kind": kind, "timeout": timeout, "t": time.time()})
            self._one_txn(txn, kind, w, rng)

    def _one_txn(self, txn: Transaction, kind: str, w: _Writer, rng: random.Random) -> None:
        sp = self.spec
        recs: list[list[Any]] = []
        failure: str | None = None
        doomed: Producer | None = None
        try:
            k = rng.randint(2, min(4, self.partitions))
            for p in sorted(rng.sample(range(self.partitions), k)):
                for _ in range(rng.randint(1, 4)):
                    value, rec = w.record(txn.id, self.topic, p)
                    self.producer.send(value, txn=txn, partition=p)
                    recs.append(rec)
            doomed = (self._doomed_producer() if rng.random() < sp.get("doomed_ratio", 0.0)
                      else None)
            if doomed is not None:
                doomed.send(encode_value({"id": f"doomed-{txn.id}", "txn": str(txn.id)}),
                            txn=txn, partition=rng.randrange(doomed.num_partitions))
        except TxnStreamError as exc:
            failure = f"send: {exc}"
        self.stop.wait(rng.uniform(*sp["hold_s"]))
        if failure is None:
            parts = rng.sample(range(self.partitions), rng.randint(1, 2))
            reply = self._peer({"op": "cowrite", "txn": str(txn.id), "timeout": txn.timeout_s,
                                "parts": parts, "n": rng.randint(1, 3)})
            if not reply.get("ok"):
                failure = f"peer: {reply.get('error')}"
        try:
            txn.flush()
        except TxnStreamError as exc:
            failure = failure or f"flush: {exc}"
        if failure is not None and doomed is not None and self.spec["doomed"] in failure:
            self._doomed_gone, self._doomed = True, None  # the topic is gone: stop using it
        if recs and failure is None:
            self.truth.write({"e": "sent", "txn": str(txn.id), "recs": recs})
        want = "abort" if failure or kind == "abort" else kind
        end: dict[str, Any] = {"e": "end", "txn": str(txn.id), "by": w.writer, "want": want,
                               "failure": failure}
        if want == "abandon":
            self.truth.write(end | {"outcome": "abandoned", "status": txn.status.value})
            return
        if want == "foreign":
            self._foreign(txn, end, w, rng, sorted({r[2] for r in recs}))
            return
        if want == "slow":
            self.stop.wait(txn.timeout_s + rng.uniform(*sp["slow_overrun_s"]))
        exc: BaseException | None = None
        # the commit's (or abort's) latency: dt, on the monotonic clock; t0 and t place it
        # on the wall clock, which all processes share (chaos.latency)
        t0, m0 = time.time(), time.monotonic()
        if want == "abort":
            try:
                txn.abort()
            except Exception as e:  # noqa: BLE001 - recorded; an abort never commits
                exc = e
            outcome = "aborted"
        else:
            try:
                txn.commit()
            except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
                exc = e
            outcome = commit_outcome(txn, exc)
        self.truth.write(end | {"outcome": outcome, "status": txn.status.value,
                                "error": None if exc is None else f"{type(exc).__name__}: {exc}",
                                "t0": t0, "t": time.time(),
                                "dt": round(time.monotonic() - m0, 6)})
        if want == "late" and outcome == "committed":
            self._peer({"op": "late", "txn": str(txn.id)})

    def _foreign(self, txn: Transaction, end: dict[str, Any], w: _Writer,
                 rng: random.Random, mine: list[int]) -> None:
        """The peer commits ``txn``; this opener sends 1-3 records more and commits.

        The records go out while the peer commits (``racing``) or once it has; either
        way the opener's ``commit()`` comes after the peer's answer, so the peer's END
        usually decides and the opener learns the fate of its records.

        The records logged ``sent`` before were flushed while the txn was open: they are
        in. Of the later ones, those ``RecordsExcludedError`` names are out (logged as
        an ``excluded`` event) and the others in; if ``commit()`` raised anything else,
        their fate is unknown (logged ``unsure``: the checker neither demands nor
        forbids them). Each later record is logged once its send was handed over.
        """
        reply: dict[str, Any] = {}
        asked = threading.Thread(target=lambda: reply.update(self._peer(
            {"op": "cocommit", "txn": str(txn.id), "timeout": txn.timeout_s})),
            name="cocommit", daemon=True)
        asked.start()
        racing = rng.random() < 0.5
        if racing:
            self.stop.wait(rng.uniform(*FOREIGN_RACE_S))
        else:
            asked.join()
        after: list[list[Any]] = []
        refused: str | None = None
        for _ in range(rng.randint(1, 3)):
            p = rng.choice(mine)
            value, rec = w.record(txn.id, self.topic, p)
            try:
                self.producer.send(value, txn=txn, partition=p)
            except TxnStreamError as err:  # not handed over: not sent
                refused = f"{type(err).__name__}: {err}"
                break
            after.append(rec)
        asked.join()  # the peer's commit first (if it got through): this one then learns
        exc: BaseException | None = None
        try:
            txn.commit()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            exc = e
        fated = exc is None or isinstance(exc, RecordsExcludedError)
        if after:
            self.truth.write({"e": "sent", "txn": str(txn.id), "recs": after, "foreign": True}
                             | ({} if fated else {"unsure": True}))
        if isinstance(exc, RecordsExcludedError):
            self.truth.write({"e": "excluded", "txn": str(txn.id), "by": w.writer,
                              "how": "foreign", "at": excluded_at(exc)})
        self.truth.write(end | {"outcome": commit_outcome(txn, exc), "status": txn.status.value,
                                "error": None if exc is None else f"{type(exc).__name__}: {exc}",
                                "peer": reply, "racing": racing, "sent_after": len(after),
                                "refused": refused,
                                "t": time.time()})

    def _peer(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            with socket.create_connection(("127.0.0.1", self.spec["peer_port"]),
                                          timeout=PEER_TIMEOUT_S) as s:
                s.sendall(json.dumps(req).encode() + b"\n")
                data = s.makefile("rb").readline()
            return json.loads(data) if data else {"ok": False, "error": "peer closed"}
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": f"peer unreachable: {exc}"}

    # ------------------------------------------------------------ co-writer (peer side)

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Serve one request of the peer (the opener of a txn this process joins)."""
        if req.get("op") == "cowrite":
            return self._cowrite(req)
        if req.get("op") == "late":
            return self._late(req)
        if req.get("op") == "cocommit":
            return self._cocommit(req)
        return {"ok": False, "error": f"unknown op {req.get('op')!r}"}

    def _attach(self, txn_text: str, timeout: float, first: int) -> Transaction:
        got = self._attached.get(txn_text)
        if got is not None:
            self._attached.move_to_end(txn_text)
            return got[0]
        attach = getattr(self.client, "attach_transaction", None)
        if attach is not None:
            txn = attach(txn_text)
        else:  # a client without attach_transaction: the public class, built from the id
            txn = Transaction(self.client.tc, TxnID.parse(txn_text), timeout)
        self._attached[txn_text] = (txn, first)
        while len(self._attached) > ATTACHED_MAX:
            self._attached.popitem(last=False)
        return txn

    def _cowrite(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._co_lock:
            parts = [int(p) for p in req["parts"]]
            recs = []
            try:
                txn = self._attach(req["txn"], float(req["timeout"]), parts[0])
                for p in parts:
                    for _ in range(int(req["n"])):
                        value, rec = self.co.record(txn.id, self.topic, p)
                        self.producer.send(value, txn=txn, partition=p)
                        recs.append(rec)
                txn.flush()
            except TxnStreamError as exc:
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            self.truth.write({"e": "sent", "txn": req["txn"], "recs": recs, "co": True})
            return {"ok": True, "recs": len(recs)}

    def _late(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._co_lock:
            got = self._attached.get(req["txn"])
            if got is None:
                return {"ok": False, "error": "not attached"}
            txn, p = got
            value, rec = self.co.record(txn.id, self.topic, p)
            handed = False
            try:
                self.producer.send(value, txn=txn, partition=p)
                handed = True
                txn.flush()
            except RecordsExcludedError as exc:  # landed after the marker: out
                self.truth.write({"e": "sent", "txn": req["txn"], "recs": [rec], "late": True})
                self.truth.write({"e": "excluded", "txn": req["txn"], "by": self.co.writer,
                                  "how": "late", "at": excluded_at(exc)})
                return {"ok": True, "rejected": False, "excluded": True}
            except TxnStreamError as exc:
                # Refused; or handed over and then not confirmed either way (the fate
                # check timed out, say): it may be in Kafka, so the checker gets it
                # (``rec``) as a record neither demanded nor forbidden.
                self.truth.write({"e": "late_rejected", "txn": req["txn"],
                                  "error": f"{type(exc).__name__}: {exc}"}
                                 | ({"rec": rec} if handed else {}))
                return {"ok": True, "rejected": True}
            self.truth.write({"e": "sent", "txn": req["txn"], "recs": [rec], "late": True})
            return {"ok": True, "rejected": False, "excluded": False}

    def _cocommit(self, req: dict[str, Any]) -> dict[str, Any]:
        """Commit the opener's txn from this process, through the attached handle."""
        with self._co_lock:
            try:
                txn = self._attach(req["txn"], float(req["timeout"]), 0)
            except TxnStreamError as refused:
                self.truth.write({"e": "cocommit_refused", "txn": req["txn"],
                                  "error": f"{type(refused).__name__}: {refused}"})
                return {"ok": False, "error": f"attach: {type(refused).__name__}: {refused}"}
        exc: BaseException | None = None
        try:
            txn.commit()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to record
            exc = e
        outcome = commit_outcome(txn, exc)
        if isinstance(exc, RecordsExcludedError):  # the opener's END decided it first
            self.truth.write({"e": "excluded", "txn": req["txn"], "by": self.co.writer,
                              "how": "cocommit", "at": excluded_at(exc)})
        self.truth.write({"e": "end", "txn": req["txn"], "by": self.co.writer,
                          "want": "cocommit", "co": True, "outcome": outcome,
                          "status": txn.status.value,
                          "error": None if exc is None else f"{type(exc).__name__}: {exc}",
                          "t": time.time()})
        return {"ok": exc is None, "outcome": outcome}


class _Handler(socketserver.StreamRequestHandler):
    role: ProducerRole

    def handle(self) -> None:
        line = self.rfile.readline()
        try:
            reply = self.role.handle(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - the opener must get an answer
            log.exception("peer request failed")
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def run(args: RoleArgs) -> int:
    """Serve co-writes and open txns until SIGTERM; then end the current txns and exit."""
    stop = install_stop()
    client = make_client(args)
    role = ProducerRole(args, client, stop)
    handler = type("Handler", (_Handler,), {"role": role})
    server = _Server(("127.0.0.1", args.spec["listen_port"]), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="peer").start()
    openers = [threading.Thread(target=role.opener, args=(i,), name=f"opener-{i}")
               for i in range(args.spec.get("threads", 1))]
    for t in openers:
        t.start()
    for t in openers:
        t.join()
    server.shutdown()
    role.producer.flush()
    client.close()
    role.truth.close()
    return 0
