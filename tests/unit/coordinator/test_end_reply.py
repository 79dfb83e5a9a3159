"""When an END is answered: at its decision, or after its markers. No broker.

Kafka answers EndTxn once PrepareCommit is logged; Pulsar after the markers. A txn's
END is answered at its decision (the worker sends the reply once the COMMITTING record
reads back) when its opener's handle was its only writer: opened by this incarnation,
never looked up while OPEN. A txn someone looked up (a process attaching to it, to write
into it) waits for its markers, so a record that process sends after ``commit()``
returned lands after them and is dropped, as its ``flush()`` reports. So does every txn
a new owner replayed: an earlier owner may have let someone attach.
"""

from __future__ import annotations

from txnstream.config import Config, TopicNames
from txnstream.coordinator.handlers import Caller, TcRequestHandler
from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.ownership import TcIncarnation, TcPhase
from txnstream.coordinator.protocol import TcOp, TcReply, TcRequest
from txnstream.types import TxnStatus

CONFIG = Config(bootstrap_servers="127.0.0.1:1", topics=TopicNames("__unit"))
NOW_MS = 1_000_000
OPENER = Caller("alice", admin=False)


def _request(op: TcOp, n: int, **fields: object) -> TcRequest:
    return TcRequest(f"{op.value}-{n}", "c", -1, op, 0, NOW_MS + 60_000, **fields)


class Tc:
    """One served TC incarnation and the handler, as the worker drives them."""

    def __init__(self, replayed: int = 0) -> None:
        store = TransactionMetadataStore(0, "w")
        for _ in range(replayed):  # opened under an earlier owner
            store.new_txn(f"old-{store.next_sequence}", 60_000, NOW_MS, principal="alice")
        store.unlogged()
        self.tc = TcIncarnation(0, store, 0, TcPhase.SERVING)
        self.tc.fresh_from = store.next_sequence  # as the worker sets it when serving
        self.handler = TcRequestHandler(CONFIG, "w", {})
        self.n = 0

    def send(self, op: TcOp, **fields: object) -> TcReply | None:
        self.n += 1
        return self.handler.handle(self.tc, _request(op, self.n, **fields), NOW_MS, OPENER)

    def new(self) -> int:
        reply = self.send(TcOp.NEW, timeout_ms=60_000)
        assert reply is not None and reply.error_kind is None
        return reply.txn_seq

    def end(self, seq: int, commit: bool) -> TcReply | None:
        return self.send(TcOp.END, txn_seq=seq, commit=commit)


def test_a_txn_only_its_opener_wrote_is_answered_at_its_decision():
    t = Tc()
    committed, aborted = t.new(), t.new()
    for seq, commit, status in ((committed, True, TxnStatus.COMMITTING),
                                (aborted, False, TxnStatus.ABORTING)):
        reply = t.end(seq, commit)
        assert reply is not None and reply.error_kind is None, reply
        assert t.tc.store.txns[seq].status is status  # decided; markers still to come
    assert not t.tc.end_waiters


def test_a_txn_looked_up_while_open_is_answered_after_its_markers():
    t = Tc()
    seq = t.new()
    info = t.send(TcOp.GET, txn_seq=seq)  # what attach_transaction and flush() send
    assert info is not None and info.error_kind is None
    assert t.end(seq, True) is None
    assert [r.txn_seq for r in t.tc.end_waiters[seq]] == [seq]


def test_a_txn_opened_under_an_earlier_owner_is_answered_after_its_markers():
    t = Tc(replayed=2)
    old = t.tc.fresh_from - 1
    assert t.end(old, True) is None
    fresh = t.new()
    reply = t.end(fresh, True)
    assert reply is not None and reply.error_kind is None


def test_a_lookup_after_the_decision_changes_nothing_and_a_repeat_is_answered_alike():
    t = Tc()
    seq = t.new()
    first = t.end(seq, True)
    assert first is not None and first.error_kind is None
    t.send(TcOp.GET, txn_seq=seq)  # COMMITTING: an attach is refused now
    again = t.handler.handle(t.tc, _request(TcOp.END, 2, txn_seq=seq, commit=True),
                             NOW_MS, OPENER)  # END-2 again: a resend
    assert again is not None and again.error_kind is None


def test_an_end_the_other_way_than_decided_waits_and_is_refused_by_the_finalizer():
    """A commit arriving after the txn was decided to abort (its timeout, an admin) is
    not answered at once with success: the finalizer answers it with the abort."""
    t = Tc()
    seq = t.new()
    assert t.end(seq, False) is not None  # decided: ABORTING
    reply = t.end(seq, True)
    assert reply is None or reply.error_kind is not None
