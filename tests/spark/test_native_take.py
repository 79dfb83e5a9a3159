"""The source task reads the same rows natively and through confluent-kafka (issue 35).

``_read_partition(native=True)`` takes librdkafka's messages in C (``Scan.take``);
``native=False`` reads confluent-kafka Messages and filters them with ``take_rows`` and
the full rule. On the real broker, over generated logs (plain records, txn records
named, unnamed and undecodable, markers, user headers, delays, null keys and values) and
generated plans (the range, hidden offsets, aborted spans, a range planned plain), both
give the same Arrow batches' rows. And a range that ends in a Kafka transaction's
control record (never handed to any reader as a record) is read to its end.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.spark.conftest import make_topic
from txnstream.markers import TXN_ID_HEADER, TXN_MARKER_HEADER, TXN_TAG_HEADER
from txnstream.message import DELIVER_AFTER_HEADER
from txnstream.types import TxnID
from txnstream_spark import take, task
from txnstream_spark.partition import TxnStreamPartition

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not take.task_scan_loads(), reason="txnstream._native not built "
                       "(or TXNSTREAM_NATIVE=0): the confluent-kafka read only"),
]

RAWS = [TxnID(1, 2).to_bytes(), TxnID(3, 4).to_bytes(), TxnID(1, 7).to_bytes(), b"junk"]

raw = st.sampled_from(RAWS)
headers = st.one_of(
    st.none(),
    raw.map(lambda r: [(TXN_ID_HEADER, r)]),
    raw.map(lambda r: [(TXN_ID_HEADER, r), (TXN_TAG_HEADER, b"tag")]),
    st.just([(TXN_MARKER_HEADER, b"COMMIT")]),
    st.just([("user", b"u"), ("other", None)]),
    raw.map(lambda r: [(TXN_ID_HEADER, r), ("user", b"x")]),
    raw.map(lambda r: [(TXN_ID_HEADER, r), (TXN_TAG_HEADER, b"t"), (DELIVER_AFTER_HEADER, b"5")]),
    st.just([(TXN_ID_HEADER, None)]),
    st.just([(TXN_TAG_HEADER, b"tag")]),
)
record = st.tuples(headers, st.sampled_from([None, b"", b"k"]),
                   st.sampled_from([None, b"", b"value"]))


@st.composite
def plans(draw, n: int):
    start = draw(st.integers(0, n))
    end = draw(st.integers(start, n + 1))  # n: the log's end; n + 1: beyond it
    hidden = draw(st.lists(st.integers(0, n), unique=True, max_size=6))
    spans = [(r, f, f + draw(st.integers(0, n))) for r in draw(
        st.lists(raw, unique=True, max_size=2)) for f in [draw(st.integers(0, n))]]
    return start, min(end, n), hidden, spans, draw(st.booleans())


def _read(p: TxnStreamPartition, native: bool) -> tuple[list[dict], str | None]:
    """The rows a task delivers, or the error it fails with."""
    try:
        batches = list(task._read_partition(p, native=native))
    except RuntimeError as exc:
        return [], str(exc)
    return [r for b in batches for r in b.to_pylist()], None


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(record, min_size=1, max_size=60), st.data())
def test_native_and_confluent_kafka_reads_deliver_the_same_rows(config, log, data):
    # Records stamped in 1970 are past any time retention: kept for good, or the broker's
    # retention check (every 5 min) may delete the log between the two reads (a CI run
    # saw the second read find the log starting past the range: "were deleted").
    topic = make_topic(config, 1, topic_config={"retention.ms": "-1"})
    raw_producer = Producer(config.producer())
    for i, (h, key, value) in enumerate(log):
        raw_producer.produce(topic, value, key=key, partition=0, headers=h, timestamp=1000 + i)
    assert raw_producer.flush(10) == 0
    for _ in range(4):
        start, end, hidden, spans, plain = data.draw(plans(len(log)))
        p = TxnStreamPartition(config, topic, 0, start, end, sorted(hidden), spans, plain=plain)
        native, confluent = _read(p, True), _read(p, False)
        assert native == confluent, (start, end, hidden, spans, plain)


def test_a_range_ending_in_a_kafka_txns_control_record_is_read_to_its_end(config):
    topic = make_topic(config, 1)
    kp = Producer({"bootstrap.servers": config.bootstrap_servers,
                   "transactional.id": f"native-take-{topic}"})
    kp.init_transactions(30)
    for t in range(3):
        kp.begin_transaction()
        for i in range(5):
            kp.produce(topic, b"v%d-%d" % (t, i), partition=0)
        kp.commit_transaction(30)
    end = 18  # 15 records and 3 commit markers: the last offset is a marker
    p = TxnStreamPartition(config, topic, 0, 0, end, plain=True)
    rows, failed = _read(p, True)
    assert failed is None
    assert [r["value"] for r in rows] == [b"v%d-%d" % (t, i) for t in range(3) for i in range(5)]
    assert _read(p, False) == (rows, None)
