"""Many handles folded from one read of the pending-ack log (issue 37), no broker.

A fold over a log partition that many keys share must give each handle exactly what
folding its own key's records in its range gives: the records of its key only, a
checkpoint's state first with its key's earlier records after it, nothing past its
``through``; and a checkpoint not where the pointer says leaves the handle untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.pendingack.handle import PendingAckHandle
from txnstream.pendingack.records import (
    CHECKPOINT_HEADER,
    PendingAckEntry,
    PendingAckKind,
    key_of,
)
from txnstream.pendingack.replay import Fold, hand_out
from txnstream.types import TopicPartition, TxnID

SUB = "job"


@dataclass
class Rec:
    """A record read from the log (confluent-kafka's Message, as the fold reads it)."""

    _offset: int
    _key: bytes
    _value: bytes
    _headers: list | None = None

    def topic(self) -> str:
        return "__pa"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list | None:
        return self._headers

    def error(self) -> None:
        return None


def entry(tp: TopicPartition, i: int) -> PendingAckEntry:
    if i % 5 == 0:
        return PendingAckEntry(PendingAckKind.OWNER, SUB, tp.topic, tp.partition,
                               generation=i, member_id=f"m-{i}", cursor=i // 2)
    return PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, SUB, tp.topic, tp.partition,
                           TxnID(0, i), (i,), (i // 5) * 5, f"m-{(i // 5) * 5}")


def state(h: PendingAckHandle) -> bytes:
    return h.checkpoint().encode()


def fold_all(log: list[Rec], folds: list[Fold]) -> None:
    keyed: dict[bytes, list[Fold]] = {}
    for f in folds:
        f.end = len(log) if f.through is None else f.through + 1
        keyed.setdefault(f.key, []).append(f)
    hand_out(log, {0: (0, len(log))}, {0: keyed}, {0})
    for f in folds:  # as fold_log ends it: a checkpoint never met is gone
        if f.gone is None and f.checkpoint_at is not None:
            f._give_up("not found")


@settings(max_examples=60, deadline=None)
@given(owners=st.lists(st.integers(0, 3), min_size=1, max_size=60),
       starts=st.lists(st.integers(0, 60), min_size=4, max_size=4),
       throughs=st.lists(st.one_of(st.none(), st.integers(0, 60)), min_size=4, max_size=4))
def test_each_fold_over_a_shared_log_equals_folding_its_key_alone(owners, starts, throughs):
    tps = [TopicPartition("in", p) for p in range(4)]
    log = []
    mine: dict[int, list[tuple[int, PendingAckEntry]]] = {p: [] for p in range(4)}
    for off, p in enumerate(owners):
        e = entry(tps[p], off)
        log.append(Rec(off, key_of(SUB, tps[p]), e.encode()))
        mine[p].append((off, e))
    folds = [Fold(PendingAckHandle(SUB, tp), 0, start=starts[p], through=throughs[p])
             for p, tp in enumerate(tps)]
    fold_all(log, folds)
    for p, f in enumerate(folds):
        alone = PendingAckHandle(SUB, tps[p])
        last = len(log) - 1 if throughs[p] is None else throughs[p]
        for off, e in mine[p]:
            if starts[p] <= off <= last:
                alone.apply(e)
        assert f.gone is None
        assert state(f.handle) == state(alone), p


def test_a_checkpoint_restores_first_then_its_keys_earlier_records():
    a, b = TopicPartition("in", 0), TopicPartition("in", 1)
    ka, kb = key_of(SUB, a), key_of(SUB, b)
    before = PendingAckHandle(SUB, a)
    e0, e1, e2 = entry(a, 5), entry(a, 6), entry(a, 7)
    before.apply(e0)
    ckpt = before.checkpoint()  # the state as of offset 1 (after e0)
    log = [Rec(0, ka, e0.encode()), Rec(1, ka, e1.encode()), Rec(2, kb, entry(b, 8).encode()),
           Rec(3, ka, ckpt.encode(), [(CHECKPOINT_HEADER, b"checkpoint")]),
           Rec(4, ka, e2.encode())]
    f = Fold(PendingAckHandle(SUB, a), 0, start=1, checkpoint_at=3)
    fold_all(log, [f])
    want = PendingAckHandle(SUB, a)
    for e in (e0, e1, e2):
        want.apply(e)
    assert f.gone is None and state(f.handle) == state(want)


def test_a_checkpoint_not_where_the_pointer_says_leaves_the_handle_untouched():
    a = TopicPartition("in", 0)
    ka = key_of(SUB, a)
    log = [Rec(0, ka, entry(a, 5).encode()), Rec(1, ka, entry(a, 6).encode())]
    f = Fold(PendingAckHandle(SUB, a), 0, start=0, checkpoint_at=0)  # not a checkpoint
    g = Fold(PendingAckHandle(SUB, a), 0, start=0, checkpoint_at=7)  # never met
    fold_all(log, [f, g])
    assert f.gone and g.gone
    for h in (f.handle, g.handle):
        assert state(h) == state(PendingAckHandle(SUB, a))


def test_a_replayed_ack_of_the_current_generation_that_conflicts_is_named_in_a_warning(
        caplog):
    """Stop 54's duplicate was a replay that silently left out a transactional ack the
    live owner had taken (logged before the mark of the END it depended on). Such an ack
    is now named in a WARNING; an ack of a fenced generation is left out quietly, as
    before (it was never valid)."""
    tp = TopicPartition("in", 0)
    k = key_of(SUB, tp)
    owner = PendingAckEntry(PendingAckKind.OWNER, SUB, tp.topic, 0, generation=0,
                            member_id="m-0", cursor=0)
    first = PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, SUB, tp.topic, 0, TxnID(0, 1),
                            (3,), 0, "m-0")
    clash = PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, SUB, tp.topic, 0, TxnID(0, 2),
                            (3,), 0, "m-0")
    fenced = PendingAckEntry(PendingAckKind.ACK_INDIVIDUAL, SUB, tp.topic, 0, TxnID(0, 3),
                             (3,), -1, "m-old")
    log = [Rec(i, k, e.encode()) for i, e in enumerate((owner, first, fenced, clash))]
    with caplog.at_level("WARNING", logger="txnstream.pendingack.replay"):
        fold_all(log, [Fold(PendingAckHandle(SUB, tp), 0, start=0)])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "ACK_INDIVIDUAL of offsets [3] in txn" in lines[0], lines[0]
    assert str(TxnID(0, 2)) in lines[0] and "__pa[0]@3" in lines[0], lines[0]
