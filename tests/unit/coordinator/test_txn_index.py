"""LIST and STATS read an index kept in step with the txns: it must say what a scan says.

Issue 34 item 2: a LIST sorted the whole table, a STATS counted it, on the worker's one
loop thread, so one principal's stream of them stalled every commit on the worker.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txnstream.coordinator.metadata_store import TransactionMetadataStore
from txnstream.coordinator.txn_index import RESERVED
from txnstream.errors import TxnStreamError
from txnstream.types import COORDINATOR_STATUSES, TxnStatus

PRINCIPALS = ("alice", "bob", "anonymous")

op = st.one_of(
    st.tuples(st.just("new"), st.sampled_from(PRINCIPALS), st.integers(1, 5_000)),
    st.tuples(st.just("reserve"), st.sampled_from(PRINCIPALS), st.integers(1, 4)),
    st.tuples(st.just("activate"), st.integers(0, 12), st.integers(1, 5_000)),
    st.tuples(st.just("end"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("finalize"), st.integers(0, 14), st.none()),
    st.tuples(st.just("tick"), st.integers(1, 3_000), st.none()),
    st.tuples(st.just("forget"), st.none(), st.none()),
    st.tuples(st.just("whole"), st.sampled_from(PRINCIPALS), st.booleans()),
)


def scan_counts(store: TransactionMetadataStore, now: int) -> tuple[dict[str, int], int | None]:
    """What STATS said before the index: a count over every txn."""
    by = {s.value: 0 for s in COORDINATOR_STATUSES}
    by[RESERVED] = 0
    oldest = None
    for m in store.txns.values():
        if m.reserved and m.status is TxnStatus.OPEN:
            by[RESERVED] += 1
            continue
        by[m.status.value] += 1
        if m.status is TxnStatus.OPEN:
            age = now - m.open_time_ms
            oldest = age if oldest is None else max(oldest, age)
    return by, oldest


def scan_list(store: TransactionMetadataStore, after: int, who: str | None) -> list[int]:
    """What LIST walked before the index: the sorted table, filtered by owner."""
    return [s for s in sorted(store.txns) if s > after
            and (who is None or store.txns[s].owner == who)]


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=120))
def test_the_index_says_what_a_scan_says(ops):
    store = TransactionMetadataStore(0, "w1")
    store.own_epoch = 0
    now = 1_000
    peak_open = 0
    for i, (kind, a, b) in enumerate(ops):
        try:
            if kind == "new":
                store.new_txn(f"r{i}", b, now, principal=a)
            elif kind == "reserve":
                store.reserve(f"r{i}", b, 10_000, now, principal=a)
            elif kind == "activate" and a in store.txns:
                store.activate(a, b, now, now)
            elif kind == "end" and a in store.txns:
                store.end_txn(a, b, now)
            elif kind == "finalize" and a in store.txns:
                store.finalize(a, now)
            elif kind == "finalize":
                for m in store.ending():
                    store.finalize(m.txn_id.least_bits, now)
            elif kind == "whole":  # a txn from its open to its end, in one step
                meta, _ = store.new_txn(f"r{i}", 5_000, now, principal=a)
                store.end_txn(meta.txn_id.least_bits, b, now)
                store.finalize(meta.txn_id.least_bits, now)
            elif kind == "tick":
                now += a
                store.expire(now)
            elif kind == "forget":
                for m in store.txns.values():  # as if the log were truncated here
                    if m.status.is_final and m.last_offset is None:
                        m.last_offset = 0
                store.forget_before(1)
        except TxnStreamError:
            pass  # a refused request changes nothing
        store.unlogged()
        stats = store.stats(now)
        by, oldest = scan_counts(store, now)
        assert stats.by_status == by
        peak_open = max(peak_open, by["OPEN"])
        assert stats.oldest_open_ms == oldest
        for who in (None, *PRINCIPALS):
            for after in (-1, 3, 17):
                assert list(store.index.after(after, who)) == scan_list(store, after, who)
        # the heap's bound: twice the most OPEN txns it held at once, and some slack
        assert len(store.index._opened) <= 2 * peak_open + 65
