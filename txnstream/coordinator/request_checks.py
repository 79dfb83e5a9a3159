"""What a coordinator checks of a request before it touches any state.

A request comes from the line, from whoever reached the port: every field is checked
against the bounds below before the store sees it, and a field out of bounds is refused
with :class:`~txnstream.errors.InvalidRequestError` naming it. Nothing here raises
anything else, so a malformed request never restarts a coordinator.
"""

from __future__ import annotations

import re

from txnstream.coordinator.protocol import TcOp, TcRequest
from txnstream.errors import InvalidRequestError

__all__ = ["check_request", "MAX_GROUP_KEY_BYTES", "MAX_PARTITIONS_PER_REQUEST",
           "MAX_GROUP_SEQS", "MAX_ID_CHARS", "GET_PAGE"]

MAX_ID_CHARS = 64
"""Request and client ids: a uuid's hex is 32."""
MAX_GROUP_KEY_BYTES = 16 * 1024
"""A group key (the Spark sink's is ``<query id>:<batch id>``, under 60 bytes). Group
outcomes are carried in checkpoints, which bound their bytes, so this only keeps one
request from carrying megabytes (a 1.5 MB key used to restart a coordinator)."""
MAX_PARTITIONS_PER_REQUEST = 10_000
"""Partitions or subscriptions one ADD may register (Kafka caps a topic near 10k too)."""
MAX_GROUP_SEQS = 10_000
"""Txns one END_GROUP may end (a Spark batch has one per task attempt)."""
GET_PAGE = 25
"""Txns one GET of many may name (``group_seqs``): as many as a LIST page, the unit the
worker's fair turns were measured at (``handlers.LIST_PAGE``)."""
MAX_REASON_CHARS = 64
MAX_SUBSCRIPTION_CHARS = 255
MAX_SEQ = (1 << 62) - 1
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""Kafka's legal topic names."""
_WITH_TXN = {TcOp.ACTIVATE, TcOp.ADD_PARTITIONS, TcOp.ADD_SUBSCRIPTIONS, TcOp.END, TcOp.GET,
             TcOp.PREPARE}


def _bad(req: TcRequest, field: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{req.op.value} request refused: {field} {why}")


def check_request(req: TcRequest, max_timeout_ms: int, max_reserve: int,
                  max_prepared_ms: int = 86_400_000) -> None:
    """Raise ``InvalidRequestError`` naming the first field out of bounds."""
    if not 0 < len(req.request_id) <= MAX_ID_CHARS:
        raise _bad(req, "request_id", f"must be 1-{MAX_ID_CHARS} characters")
    if len(req.client_id) > MAX_ID_CHARS:
        raise _bad(req, "client_id", f"is over {MAX_ID_CHARS} characters")
    many = req.op is TcOp.GET and bool(req.group_seqs)  # a GET of many: no txn_seq
    if many and len(req.group_seqs) > GET_PAGE:
        raise _bad(req, "group_seqs", f"names {len(req.group_seqs)} txns, over a GET's "
                   f"{GET_PAGE}")
    if req.op in _WITH_TXN and not many and not 0 <= req.txn_seq <= MAX_SEQ:
        raise _bad(req, "txn_seq", f"must be a TxnID sequence 0..{MAX_SEQ}, got {req.txn_seq}")
    if req.op is TcOp.PREPARE and not (
            req.max_prepared_ms == 0 or 1 <= req.max_prepared_ms <= max_prepared_ms):
        raise _bad(req, "max_prepared_ms", f"must be 1..{max_prepared_ms} ms (the "
                   f"coordinator's max_prepared_s), or 0 for its default; got "
                   f"{req.max_prepared_ms}")
    if req.op in (TcOp.NEW, TcOp.RESERVE, TcOp.ACTIVATE, TcOp.END, TcOp.PREPARE) and not (
            req.timeout_ms == 0 or 1 <= req.timeout_ms <= max_timeout_ms):
        raise _bad(req, "timeout_ms", f"must be 1..{max_timeout_ms} ms (the coordinator's "
                   f"max_txn_timeout_s), or 0 for its default; got {req.timeout_ms}")
    if req.op is TcOp.RESERVE and not 1 <= req.count <= max_reserve:
        raise _bad(req, "count", f"must be 1..{max_reserve}, got {req.count}")
    if req.op in (TcOp.ACTIVATE, TcOp.END, TcOp.PREPARE) and req.open_time_ms < 0:
        raise _bad(req, "open_time_ms", f"must be >= 0, got {req.open_time_ms}")
    if req.reason is not None and len(req.reason) > MAX_REASON_CHARS:
        raise _bad(req, "reason", f"is over {MAX_REASON_CHARS} characters")
    if req.group_key is not None and len(req.group_key.encode()) > MAX_GROUP_KEY_BYTES:
        raise _bad(req, "group_key", f"is {len(req.group_key.encode())} bytes, over the "
                   f"{MAX_GROUP_KEY_BYTES}-byte bound")
    if req.group_key is not None and any(ord(c) < 0x20 or c == "\x7f" for c in req.group_key):
        # U+001F is the scope separator (protocol.GROUP_SCOPE): a key holding it could
        # spell another principal's scoped key
        raise _bad(req, "group_key", "holds a control character")
    if req.op is TcOp.END_GROUP and not req.group_key:
        raise _bad(req, "group_key", "is missing")
    if len(req.group_seqs) > MAX_GROUP_SEQS:
        raise _bad(req, "group_seqs", f"names {len(req.group_seqs)} txns, over the "
                   f"{MAX_GROUP_SEQS} bound")
    if any(not 0 <= s <= MAX_SEQ for s in req.group_seqs):
        raise _bad(req, "group_seqs", "holds a sequence out of range")
    for name, items in (("partitions", req.partitions), ("subscriptions", req.subscriptions)):
        if len(items) > MAX_PARTITIONS_PER_REQUEST:
            raise _bad(req, name, f"names {len(items)}, over the "
                       f"{MAX_PARTITIONS_PER_REQUEST} bound")
        for item in items:
            if not _TOPIC.fullmatch(item.topic):
                raise _bad(req, name, f"holds {item.topic[:100]!r}, not a Kafka topic name")
            if item.partition < 0:
                raise _bad(req, name, f"holds partition {item.partition} of {item.topic}")
    for sub in req.subscriptions:
        if not 0 < len(sub.subscription) <= MAX_SUBSCRIPTION_CHARS:
            raise _bad(req, "subscriptions", f"holds a subscription name of "
                       f"{len(sub.subscription)} characters (1-{MAX_SUBSCRIPTION_CHARS})")
    if req.min_age_ms < 0:
        raise _bad(req, "min_age_ms", f"must be >= 0, got {req.min_age_ms}")
    if req.after_seq < -1:
        raise _bad(req, "after_seq", f"must be >= -1, got {req.after_seq}")
