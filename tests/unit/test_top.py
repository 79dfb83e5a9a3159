"""``txnstream top``'s model: rates, the oldest open txn, lag and blocking txns."""

from __future__ import annotations

from rich.console import Console

from txnstream.admin import CoordinatorStats
from txnstream.buffer.transaction_buffer import BufferStats
from txnstream.coordinator.protocol import TxnInfo
from txnstream.top import Sample, build_view, render
from txnstream.types import TopicPartition, TxnID, TxnStatus

NOW = 1_800_000_000_000
TP0, TP1, TP2 = (TopicPartition("orders", 0), TopicPartition("orders", 1),
                 TopicPartition("pay", 0))


def _tc(tc: int, owner: str, committed: int, aborted: int, open_: int) -> CoordinatorStats:
    return CoordinatorStats(tc, owner, {"ended.COMMITTED": committed, "ended.ABORTED": aborted,
                                        "status.OPEN": open_})


def _txn(tc: int, seq: int, status: TxnStatus, age_s: float, *parts: TopicPartition) -> TxnInfo:
    return TxnInfo(TxnID(tc, seq), status, int(NOW - age_s * 1000), 60_000,
                   tuple(str(p) for p in parts), ())


def test_rates_oldest_and_blocking() -> None:
    blocker, other = TxnID(1, 7), TxnID(0, 3)
    prev = Sample(100.0, NOW - 2000, [_tc(0, "w1", 10, 1, 0), _tc(1, "w2", 5, 0, 1)], [], {})
    cur = Sample(102.0, NOW, [_tc(0, "w1", 30, 3, 1), _tc(1, "w2", 5, 0, 2)],
                 [_txn(1, 7, TxnStatus.OPEN, 40, TP0, TP2), _txn(1, 9, TxnStatus.OPEN, 5, TP1),
                  _txn(0, 3, TxnStatus.OPEN, 12, TP1), _txn(0, 1, TxnStatus.COMMITTED, 99)],
                 {TP0: BufferStats(TP0, 120, 99, 1, 0, blocker, 100, 40.0),
                  TP1: BufferStats(TP1, 50, 40, 2, 0, other, 41, 12.0),
                  TP2: BufferStats(TP2, 10, 10, 0, 0, None, None, None)})
    view = build_view(prev, cur)
    tc0, tc1 = view.coordinators
    assert (tc0.commit_rate, tc0.abort_rate) == (10.0, 1.0)
    assert (tc1.commit_rate, tc1.abort_rate) == (0.0, 0.0)
    assert tc0.oldest_txn == TxnID(0, 3) and abs((tc0.oldest_age_s or 0) - 12) < 1e-6
    assert tc1.oldest_txn == blocker and tc1.open_txns == 2
    # blocked partitions first, longest blocked on top; lag = folded - readable
    assert [r.tp for r in view.partitions] == [TP0, TP1, TP2]
    assert [r.lag for r in view.partitions] == [21, 10, 0]
    assert view.partitions[0].blocking_txn == blocker
    assert view.blocking == [blocker, other]


def test_no_rate_without_a_previous_sample_or_after_an_owner_change() -> None:
    cur = Sample(10.0, NOW, [_tc(0, "w2", 3, 0, 0)], [], {})
    assert build_view(None, cur).coordinators[0].commit_rate is None
    prev = Sample(8.0, NOW - 2000, [_tc(0, "w1", 500, 9, 0)], [], {})
    row = build_view(prev, cur).coordinators[0]
    assert row.commit_rate is None and row.abort_rate is None, "a new owner's counters restart"


def test_unserved_partition_shows_why_and_render_names_the_blocker() -> None:
    blocker = TxnID(2, 11)
    cur = Sample(1.0, NOW, [_tc(2, "w1", 0, 0, 1)], [_txn(2, 11, TxnStatus.OPEN, 8, TP0, TP1)],
                 {TP0: BufferStats(TP0, 9, 4, 1, 0, blocker, 5, 8.0), TP1: "not served yet"})
    view = build_view(None, cur)
    assert view.partitions[1].note == "not served yet" and view.partitions[1].lag is None
    console = Console(width=160, record=True)
    console.print(render(view, selected=0))
    text = console.export_text()
    assert "orders-0" in text and str(blocker) in text and "not served yet" in text


def test_watched_subscriptions_show_their_redelivery_counts_the_highest_first() -> None:
    from txnstream.pendingack.handle import PendingAckStats
    from txnstream.top import AckRow

    calm = PendingAckStats("billing", TP0, 40, 0, 0, 0, None, 3)
    poison = PendingAckStats("billing", TP1, 12, 5, 1, 1, None, 3, redelivered_offsets=1,
                             max_redelivery_count=3)
    cur = Sample(1.0, NOW, [_tc(0, "w1", 0, 0, 0)], [], {},
                 [AckRow("billing", TP0, calm), AckRow("billing", TP1, poison),
                  AckRow("audit", TP0, None, "not read: timed out")])
    view = build_view(None, cur)
    assert [a.tp for a in view.acks][:1] == [TP1], "the poison record's partition is not first"
    console = Console(width=160, record=True)
    console.print(render(view))
    text = console.export_text()
    assert "subscriptions" in text and "billing" in text and "not read: timed out" in text
    line = next(x for x in text.splitlines() if "orders-1" in x and "billing" in x)
    assert [c.strip() for c in line.split("│") if c.strip()][-2:] == ["1", "3"], line


def test_a_subscription_to_watch_is_topic_colon_name() -> None:
    import argparse

    import pytest

    from txnstream.cli.top import _topic_sub

    assert _topic_sub("orders:billing:eu") == ("orders", "billing:eu")
    for bad in ("orders", ":billing", "orders:"):
        with pytest.raises(argparse.ArgumentTypeError, match="TOPIC:SUBSCRIPTION"):
            _topic_sub(bad)
