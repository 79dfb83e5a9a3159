"""Admin views on a real broker and worker (issue 20, item 7).

Reserved TxnIDs (a client's ``RESERVE`` block, not handed out) are not open txns: not in
``coordinator_stats``' open count or oldest age, not in LIST, not in the worker's
``txnstream_open_txns`` / ``txnstream_oldest_open_txn_age_seconds`` gauges, not in
``top``. A partition a txn registered whose buffer owner does not serve it yet is
reported as such by ``admin.buffer_stats``, not raised as an error.

Each test runs its own worker on internal topics of its own (``own_config``), so txns
other tests left open cannot enter the counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from tests.integration.coordinator.conftest import (  # noqa: F401
    FAST_FAILOVER_MS,
    make_topic,
    wait_until,
)
from txnstream import Client, Config, TopicPartition, TxnStatus
from txnstream.coordinator.settings import WorkerSettings
from txnstream.coordinator.worker import CoordinatorWorker
from txnstream.top import Sampler, build_view

pytestmark = pytest.mark.integration


def _start(config: Config, buffer_role: bool) -> CoordinatorWorker:
    w = CoordinatorWorker(config, settings=WorkerSettings(session_timeout_ms=FAST_FAILOVER_MS,
                                                          buffer_role=buffer_role))
    w.start()
    wait_until(lambda: len(w.serving()) == config.num_coordinators, 60, "worker serving")
    return w


@pytest.fixture
def tc_only(own_config: Config) -> Iterator[tuple[CoordinatorWorker, Client]]:  # noqa: F811
    """A coordinator-only worker (no buffer role) and a client, on topics of their own."""
    w = _start(own_config, buffer_role=False)
    c = Client(config=own_config)
    try:
        yield w, c
    finally:
        c.close()
        w.stop()


def _gauge(name: str, tc: int) -> float | None:
    return REGISTRY.get_sample_value(name, {"tc": str(tc)})


def test_reserved_txnids_are_not_open_txns_in_stats_list_metrics_or_top(tc_only) -> None:
    """One txn handed out from a block of four: every view says one open txn, as old as
    its hand-out; the two TxnIDs still reserved are counted apart."""
    _, client = tc_only
    topic = make_topic(client.config, 1, "views")
    tp = TopicPartition(topic, 0)
    first = client.new_transaction()  # reserves a block of 4 on one TC
    first.commit()
    time.sleep(3)  # the block's reservation is now 3 s older than the txn below
    held = client.new_transaction(timeout_s=120)  # TxnID 2 of 4: two left reserved
    held.register_partitions([tp])
    held.flush()
    assert held.id.tc_id == first.id.tc_id, "both from the same reserved block"
    handed_out_at = time.monotonic()
    time.sleep(2)
    tc = held.id.tc_id
    problems: list[str] = []

    def age_ok(what: str, age_s: float | None) -> None:
        true_age = time.monotonic() - handed_out_at
        if age_s is None or abs(age_s - true_age) > 1.5:
            problems.append(f"{what}: oldest open txn {age_s} s old, the one open txn "
                            f"{held.id} is {true_age:.1f} s old")

    stats = {s.tc_id: s.stats for s in client.admin.coordinator_stats()}
    opened = sum(s.get(f"status.{TxnStatus.OPEN.value}", 0) for s in stats.values())
    if opened != 1:
        problems.append(f"coordinator_stats: {opened} open txns, expected 1 "
                        f"({ {t: s.get('status.OPEN') for t, s in stats.items()} })")
    if stats[tc].get("status.reserved") != 2:
        problems.append(f"coordinator_stats: status.reserved of tc {tc} is "
                        f"{stats[tc].get('status.reserved')}, expected 2")
    age_ok("coordinator_stats oldest_open_ms", stats[tc].get("oldest_open_ms", 0) / 1000)

    listed = [t.txn_id for t in client.admin.list_transactions()
              if t.status is TxnStatus.OPEN]
    if listed != [held.id]:
        problems.append(f"list_transactions: open {listed}, expected [{held.id}]")

    # the worker's gauges (this process: an in-process worker), exported once a second
    time.sleep(1.5)
    gauge_open = _gauge("txnstream_open_txns", tc)
    if gauge_open != 1:
        problems.append(f"metric txnstream_open_txns{{tc={tc}}} is {gauge_open}, expected 1")
    gauge_reserved = _gauge("txnstream_reserved_txns", tc)
    if gauge_reserved != 2:
        problems.append(f"metric txnstream_reserved_txns{{tc={tc}}} is {gauge_reserved}, "
                        "expected 2")
    age_ok("metric txnstream_oldest_open_txn_age_seconds",
           _gauge("txnstream_oldest_open_txn_age_seconds", tc))

    sampler = Sampler(client)
    try:
        view = build_view(None, sampler.sample())
    finally:
        sampler.close()
    top_open = {r.tc_id: r.open_txns for r in view.coordinators}
    if sum(top_open.values()) != 1:
        problems.append(f"top: open {top_open}, expected 1 in all")
    [row] = [r for r in view.coordinators if r.tc_id == tc]
    if row.oldest_txn != held.id:
        problems.append(f"top: oldest open txn {row.oldest_txn}, expected {held.id}")
    age_ok("top oldest age", row.oldest_age_s)

    held.abort()
    assert not problems, "\n".join(problems)


def test_buffer_stats_of_a_registered_partition_not_served_yet_says_so(tc_only) -> None:
    """No buffer owner runs: the partition a txn registered is reported waiting, and
    the numbers say nothing is known readable; top says the same."""
    _, client = tc_only
    topic = make_topic(client.config, 1, "views")
    tp = TopicPartition(topic, 0)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout_s=120)
    producer.send(b"held", partition=0, txn=txn)
    txn.flush()
    try:
        stats = client.admin.buffer_stats(tp)
    except Exception as exc:  # noqa: BLE001 - the old behaviour, named in the failure
        pytest.fail(f"buffer_stats of a registered partition nobody serves raised "
                    f"{type(exc).__name__}: {exc}")
    assert stats.tp == tp
    assert stats.state == "waiting", stats
    assert stats.max_read_position < 0 and stats.last_offset >= 0, stats
    assert stats.blocking_txn is None, stats

    plain = TopicPartition(make_topic(client.config, 1, "plain"), 0)
    plain_producer = client.create_producer(plain.topic)
    plain_producer.send(b"p", partition=0)
    plain_producer.flush()
    assert client.admin.buffer_stats(plain).state == "plain"

    sampler = Sampler(client)
    try:
        rows = {r.tp: r for r in build_view(None, sampler.sample()).partitions}
    finally:
        sampler.close()
    assert rows[tp].note == "not served yet" and rows[tp].lag is None, rows[tp]
    txn.abort()
