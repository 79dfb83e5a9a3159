"""Client <-> coordinator messages, carried by the direct line (``transport``).

A client sends a :class:`TcRequest` to the worker that owns TC ``tc_id``; the worker
executes it and answers a :class:`TcReply` with the same request id on the same
connection. Requests are idempotent by ``request_id``, so a client retries a request
(same id) after a timeout or a coordinator failover without harm.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from txnstream import errors
from txnstream.codec import codec
from txnstream.coordinator.log_entry import SubscriptionRef
from txnstream.coordinator.meta import TxnMeta
from txnstream.errors import CorruptRecordError, TxnStreamError
from txnstream.types import ANONYMOUS, TopicPartition, TxnID, TxnStatus

__all__ = ["TcOp", "TcRequest", "TcReply", "TxnInfo", "error_from_reply", "scoped_group_key",
           "ENDED_NOTICE", "COMMITTED_NOTICE", "unscoped_group_key"]

ENDED_NOTICE = "ended:"
"""Request id prefix of a reply nobody asked for: the txn whose sequence follows ended
without its writer's END (timeout, admin, another handle's abort); the client fails that
txn's next send."""
COMMITTED_NOTICE = "committed:"
"""The same for a txn that committed: a handle that did not commit it fails its next send
(a record sent now would follow the markers: no reader delivers it). A client of an
earlier version ignores it (no request of its has that id)."""
GROUP_SCOPE = "\x1f"
"""Between a group key's principal and the key itself (a character no principal has)."""


def scoped_group_key(principal: str, key: str) -> str:
    """A group key as the coordinator keeps it: scoped to the principal that ends it.

    Another principal naming the same key can neither end nor poison that group. The
    ``anonymous`` principal (a worker that authenticates nobody) keeps keys as they are,
    as before owners existed, so groups committed before an upgrade are still recognised.
    """
    if principal == ANONYMOUS:
        return key
    return f"{principal}{GROUP_SCOPE}{key}"


def unscoped_group_key(key: str | None) -> str | None:
    """The key as its client named it."""
    return None if key is None else key.rpartition(GROUP_SCOPE)[2]


class TcOp(enum.Enum):
    """What a request asks of the coordinator."""

    NEW = "NEW"
    ADD_PARTITIONS = "ADD_PARTITIONS"
    ADD_SUBSCRIPTIONS = "ADD_SUBSCRIPTIONS"
    END = "END"
    END_GROUP = "END_GROUP"
    GET = "GET"
    LIST = "LIST"
    STATS = "STATS"
    RESERVE = "RESERVE"
    """Open ``count`` txns at once, each with the lease ``timeout_ms`` (TxnIDs in blocks)."""
    ACTIVATE = "ACTIVATE"
    """A reserved txn handed out: its deadline is ``open_time_ms`` + ``timeout_ms``."""
    PREPARE = "PREPARE"
    """Log the txn PREPARED (carrying, as END does, what the pipeline has not confirmed):
    it may stay so for ``max_prepared_ms``, then any process of its owner ends it."""


@dataclass(frozen=True, slots=True)
class TcRequest:
    """One request; field for field as ``schemas/tc_request.avsc``."""

    request_id: str
    client_id: str
    reply_partition: int
    op: TcOp
    tc_id: int
    deadline_ms: int
    txn_seq: int = -1
    timeout_ms: int = 0
    commit: bool = False
    reason: str | None = None
    partitions: tuple[TopicPartition, ...] = ()
    subscriptions: tuple[SubscriptionRef, ...] = ()
    group_key: str | None = None
    group_seqs: tuple[int, ...] = ()
    min_age_ms: int = 0
    count: int = 0
    open_time_ms: int = 0
    after_seq: int = -1
    max_prepared_ms: int = 0

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("tc_request").encode({
            "request_id": self.request_id, "client_id": self.client_id,
            "reply_partition": self.reply_partition, "op": self.op.value, "tc_id": self.tc_id,
            "deadline_ms": self.deadline_ms, "txn_seq": self.txn_seq,
            "timeout_ms": self.timeout_ms, "commit": self.commit, "reason": self.reason,
            "partitions": [{"topic": p.topic, "partition": p.partition} for p in self.partitions],
            "subscriptions": [{"topic": s.topic, "partition": s.partition,
                               "subscription": s.subscription} for s in self.subscriptions],
            "group_key": self.group_key, "group_seqs": list(self.group_seqs),
            "min_age_ms": self.min_age_ms, "count": self.count,
            "open_time_ms": self.open_time_ms, "after_seq": self.after_seq,
            "max_prepared_ms": self.max_prepared_ms,
        })

    @classmethod
    def decode(cls, data: bytes | None) -> TcRequest:
        """Parse; ``CorruptRecordError`` on garbage."""
        r = codec("tc_request").decode(data)
        try:
            return cls(
                r["request_id"], r["client_id"], r["reply_partition"], TcOp(r["op"]), r["tc_id"],
                r["deadline_ms"], r["txn_seq"], r["timeout_ms"], r["commit"], r["reason"],
                tuple(TopicPartition(p["topic"], p["partition"]) for p in r["partitions"]),
                tuple(SubscriptionRef(s["topic"], s["partition"], s["subscription"])
                      for s in r["subscriptions"]),
                r["group_key"], tuple(r["group_seqs"]), r["min_age_ms"], r["count"],
                r["open_time_ms"], r["after_seq"], r["max_prepared_ms"],
            )
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"tc_request: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """A transaction as admin tools show it."""

    txn_id: TxnID
    status: TxnStatus
    open_time_ms: int
    timeout_ms: int
    partitions: tuple[str, ...]
    subscriptions: tuple[str, ...]
    abort_reason: str | None = None
    group_key: str | None = None
    owner: str | None = None
    """The principal that opened it."""
    prepared_at_ms: int = -1
    """When it was prepared (-1: never)."""
    max_prepared_ms: int = 0
    """How long it may stay prepared (the coordinator aborts it after)."""

    @classmethod
    def of(cls, meta: TxnMeta) -> TxnInfo:
        """Snapshot a live ``TxnMeta``."""
        return cls(meta.txn_id, meta.status, meta.open_time_ms, meta.timeout_ms,
                   tuple(sorted(str(p) for p in meta.partitions)),
                   tuple(sorted(str(s) for s in meta.subscriptions)),
                   meta.abort_reason, unscoped_group_key(meta.group_key), meta.owner,
                   -1 if meta.prepared_at_ms is None else meta.prepared_at_ms,
                   meta.max_prepared_ms)

    def to_avro(self) -> dict[str, Any]:
        """Avro dict."""
        return {"tc_id": self.txn_id.most_bits, "seq": self.txn_id.least_bits,
                "status": self.status.value, "open_time_ms": self.open_time_ms,
                "timeout_ms": self.timeout_ms, "partitions": list(self.partitions),
                "subscriptions": list(self.subscriptions), "abort_reason": self.abort_reason,
                "group_key": self.group_key, "owner": self.owner,
                "prepared_at_ms": self.prepared_at_ms, "max_prepared_ms": self.max_prepared_ms}

    @classmethod
    def from_avro(cls, r: dict[str, Any]) -> TxnInfo:
        """Inverse of :meth:`to_avro`."""
        return cls(TxnID(r["tc_id"], r["seq"]), TxnStatus(r["status"]), r["open_time_ms"],
                   r["timeout_ms"], tuple(r["partitions"]), tuple(r["subscriptions"]),
                   r["abort_reason"], r["group_key"], r["owner"], r["prepared_at_ms"],
                   r["max_prepared_ms"])


@dataclass(frozen=True, slots=True)
class TcReply:
    """One reply; field for field as ``schemas/tc_reply.avsc``."""

    request_id: str
    client_id: str
    tc_id: int
    error_kind: str | None = None
    error_message: str | None = None
    txn_seq: int = -1
    already: bool = False
    group_seqs: tuple[int, ...] = ()
    txns: tuple[TxnInfo, ...] = ()
    stats: dict[str, int] = field(default_factory=dict)
    owner_id: str | None = None
    more: bool = False
    """LIST: this is one page; the next starts after the last txn of ``txns``."""
    txn_keys: tuple[bytes, ...] = ()
    """The txn keys (:mod:`txnstream.membership`) of the TxnIDs this reply gives: NEW one,
    RESERVE one per ``group_seqs``, GET one per ``txns`` (empty bytes where the caller
    may not write the txn); empty when the workers check no membership."""

    @classmethod
    def failure(cls, req: TcRequest, exc: TxnStreamError, owner_id: str) -> TcReply:
        """A reply carrying an error the client re-raises as the same class."""
        seq = exc.txn_id.least_bits if exc.txn_id is not None else req.txn_seq
        return cls(req.request_id, req.client_id, req.tc_id, type(exc).__name__, str(exc),
                   txn_seq=seq, owner_id=owner_id)

    def encode(self) -> bytes:
        """Version byte + Avro."""
        return codec("tc_reply").encode({
            "request_id": self.request_id, "client_id": self.client_id, "tc_id": self.tc_id,
            "error_kind": self.error_kind, "error_message": self.error_message,
            "txn_seq": self.txn_seq, "already": self.already,
            "group_seqs": list(self.group_seqs), "txns": [t.to_avro() for t in self.txns],
            "stats": dict(self.stats), "owner_id": self.owner_id, "more": self.more,
            "txn_keys": list(self.txn_keys),
        })

    @classmethod
    def decode(cls, data: bytes | None) -> TcReply:
        """Parse; ``CorruptRecordError`` on garbage."""
        r = codec("tc_reply").decode(data)
        try:
            return cls(r["request_id"], r["client_id"], r["tc_id"], r["error_kind"],
                       r["error_message"], r["txn_seq"], r["already"], tuple(r["group_seqs"]),
                       tuple(TxnInfo.from_avro(t) for t in r["txns"]), dict(r["stats"]),
                       r["owner_id"], r["more"], tuple(r["txn_keys"]))
        except (ValueError, KeyError) as exc:
            raise CorruptRecordError(f"tc_reply: {exc!r}") from exc


_ERROR_CLASSES: dict[str, type[TxnStreamError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name), type) and issubclass(cls, TxnStreamError)
}


def error_from_reply(reply: TcReply) -> TxnStreamError | None:
    """The exception a failed reply stands for (same class as the coordinator raised)."""
    if reply.error_kind is None:
        return None
    cls = _ERROR_CLASSES.get(reply.error_kind, TxnStreamError)
    txn_id = TxnID(reply.tc_id, reply.txn_seq) if reply.txn_seq >= 0 else None
    msg = reply.error_message or reply.error_kind
    if cls is errors.InvalidTxnStatusError:
        return errors.InvalidTxnStatusError(txn_id, None, None, msg)
    return cls(msg, txn_id)
