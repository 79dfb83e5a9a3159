"""A delivered record (:class:`Message`) and the one rule that reads txn headers.

Every record of a data topic is one of three kinds, told by its headers alone (DESIGN.md
section 3): a **plain** record (no ``txn.id``), a **txn record** (``txn.id``: the TxnID
of the txn that wrote it) or a **marker** (``txn.id`` and ``txn.marker``: a commit or
abort written by a coordinator, tagged with ``txn.mac``). :func:`split_headers` is that
rule for every reader (the consumer, the buffer's fold, the Spark task filter): the
reserved headers out, the user's headers kept in their order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from txnstream.native import native
from txnstream.types import TopicPartition, TxnID

__all__ = ["DELIVER_AFTER_HEADER", "DELIVER_AT_HEADER", "Headers", "Message",
           "RESERVED_HEADERS", "TXN_ID_HEADER", "TXN_MAC_HEADER", "TXN_MARKER_HEADER",
           "TXN_TAG_HEADER", "make_message", "split_headers"]

TXN_ID_HEADER = "txn.id"
TXN_MARKER_HEADER = "txn.marker"
TXN_MAC_HEADER = "txn.mac"
TXN_TAG_HEADER = "txn.tag"
"""A txn record's proof of membership (:mod:`txnstream.membership`), beside ``txn.id``."""
DELIVER_AT_HEADER = "txn.deliver.at"
"""Delayed delivery (:mod:`txnstream.delayed`): deliver no earlier than this epoch ms."""
DELIVER_AFTER_HEADER = "txn.deliver.after"
"""Delayed delivery of a txn record: this many ms after its txn commits."""
RESERVED_HEADERS = frozenset((TXN_ID_HEADER, TXN_MARKER_HEADER, TXN_MAC_HEADER,
                              TXN_TAG_HEADER, DELIVER_AT_HEADER, DELIVER_AFTER_HEADER))
"""Header names a user's record may not carry."""

Headers = Sequence[tuple[str, bytes | None]] | None
"""A record's headers as confluent-kafka hands them out (None: none)."""


Delay = tuple[str, bytes | None] | None
"""A record's delayed-delivery header as sent (its name and raw value), if it has one."""


SplitHeaders = tuple[bytes | None, bool, list[tuple[str, bytes]], Delay]


def _split_headers(headers: Headers) -> SplitHeaders:
    """``(txn.id value or None, has a txn.marker header, the user's headers, delay)``.

    The values are not parsed here: a reader that needs the TxnID parses (and caches)
    it, and the buffer's fold has already hidden a record whose ``txn.id`` is garbage;
    a delay header is read by :func:`txnstream.delayed.due_ms`. (:func:`split_headers`
    is this rule in C where ``txnstream._native`` is built.)
    """
    txn_raw: bytes | None = None
    marker = False
    delay: Delay = None
    user: list[tuple[str, bytes]] = []
    for k, v in headers or ():
        if k == TXN_ID_HEADER:
            txn_raw = v
        elif k == TXN_MARKER_HEADER:
            marker = True
        elif k == TXN_TAG_HEADER:
            continue
        elif k == DELIVER_AT_HEADER or k == DELIVER_AFTER_HEADER:
            delay = (k, v)
        else:
            user.append((k, v))  # type: ignore[arg-type]  # a user header's value as sent
    return txn_raw, marker, user, delay


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered record: only user headers; ``txn_id`` if it was written in a txn."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    txn_id: TxnID | None = None
    redelivery_count: int = field(default=0, compare=False)
    """How many times this record came back to the subscription unacked before this
    delivery: an aborted txn's acks, a negative ack, ``redeliver_unacknowledged``
    (Pulsar's ``getRedeliveryCount``; kept in the pending-ack log, so it survives a
    crash of the consumer). 0 on its first delivery. Not compared: the same record
    delivered again equals its earlier delivery."""

    @property
    def tp(self) -> TopicPartition:
        """Where it came from."""
        return TopicPartition(self.topic, self.partition)


split_headers: Callable[[Headers], SplitHeaders] = getattr(
    native(), "split_headers", _split_headers)
"""The header rule (:func:`_split_headers`), in C where ``txnstream._native`` is built:
every record a consumer reads passes through it."""

MessageMaker = Callable[[str, int, int, bytes | None, bytes | None,
                         tuple[tuple[str, bytes], ...], int, TxnID | None, int], Message]


def _message_maker() -> MessageMaker:
    maker = getattr(native(), "Maker", None)
    if maker is None or hasattr(Message, "__post_init__"):  # the maker would skip it
        return Message
    return maker(Message, tuple(f.name for f in fields(Message)))  # type: ignore[no-any-return]


make_message: MessageMaker = _message_maker()
"""``Message(...)`` from every field, positionally (``redelivery_count`` too): the
consumer's fetch loop makes one per record. In C where ``txnstream._native`` is built,
which stores the fields in the slots at once (``Message``'s own ``__init__``, frozen,
sets each through ``object.__setattr__``: 3 µs for nine); else ``Message`` itself."""
