"""The source's planner asks a wide topic's log bounds in one round, not one per partition.

Asked of the planner's follower consumer, each partition's watermarks waited behind
that consumer's fetch parked on the broker (up to ``FOLLOW_FETCH_WAIT_MS``): a plan of a
256-partition topic took about half a minute, each micro-batch as long.
"""

from __future__ import annotations

import time

import pytest

from tests.spark.conftest import make_topic, wait_until
from tests.spark.test_spark import opts
from txnstream import TopicPartition
from txnstream.buffer.follower import FOLLOW_FETCH_WAIT_MS
from txnstream.buffer.snapshot_store import TransactionBufferSnapshotStore

pytestmark = pytest.mark.spark

PARTITIONS = 32


def test_a_plan_of_a_wide_topic_waits_for_no_fetch_per_partition(config, worker):
    from txnstream_spark.options import SourceOptions
    from txnstream_spark.planner import Planner

    topic = make_topic(config, PARTITIONS)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    assert TransactionBufferSnapshotStore(config).register(tps, 10)
    planner = Planner(SourceOptions.parse(opts(config, subscribe=topic), stream=True))
    try:
        planner.starts("earliest")
        # served, and followed: from then on the follower's fetch is parked on the broker
        wait_until(lambda: planner.refresh() is not None
                   and all(tp in planner.follower.views for tp in tps), 60,
                   "every partition served and followed")
        time.sleep(0.5)
        t0 = time.monotonic()
        starts = planner.starts("earliest")  # every partition's log start
        took = time.monotonic() - t0
    finally:
        planner.close()
    assert starts, "no start offsets planned"
    one_wait_each = PARTITIONS * FOLLOW_FETCH_WAIT_MS / 1000
    assert took < one_wait_each / 4, (
        f"a plan of {PARTITIONS} partitions took {took:.2f} s: about one fetch wait "
        f"each ({one_wait_each:.1f} s in all)")
