"""Prometheus metrics of a worker (``txnstream worker --metrics-port``), listed in docs/metrics.md.

A worker's coordinator role serves them on ``--metrics-port``; its buffer role runs in a
child process and serves its own on ``--metrics-port + 1``. Names follow Prometheus
conventions: ``_total`` counters, ``_seconds`` in base units. Label values are bounded:
``tc`` by ``num_coordinators``, ``op``/``outcome``/``result`` by enums, ``topic`` and
``partition`` by the partitions a worker serves, and ``txn`` appears only on
``txnstream_buffer_partition_blocked_seconds``: one series per blocked partition, removed
when the partition unblocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["TXN_ENDED", "TXN_DURATION_SECONDS", "REQUESTS", "REQUEST_SECONDS", "TURN_SECONDS",
           "TCS_SERVED", "INVALID_RECORDS", "OPEN_TXNS", "RESERVED_TXNS", "OLDEST_OPEN_TXN_SECONDS",
           "PREPARED_TXNS", "OLDEST_PREPARED_TXN_SECONDS",
           "PENDING_ACK_SUBSCRIPTIONS", "TC_OWNERSHIP_CHANGES", "BUFFER_SLOTS",
           "BUFFER_PARTITIONS", "BUFFER_DELTAS", "BUFFER_RECORDS_FOLDED", "BUFFER_BLOCKED",
           "BUFFER_BLOCKED_SECONDS", "BUFFER_LAG", "BUFFER_READ_LAG", "BUFFER_FOLD_LAG",
           "remove_series", "serve"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60)

# --- coordinator role -------------------------------------------------------------
TXN_ENDED = Counter("txnstream_txn_ended_total", "Transactions finalized (markers written)",
                    ["tc", "outcome"])
TXN_DURATION_SECONDS = Histogram("txnstream_txn_duration_seconds",
                                 "Open to finalized (markers written), per outcome",
                                 ["outcome"], buckets=_LATENCY_BUCKETS)
REQUESTS = Counter("txnstream_tc_requests_total", "Coordinator requests handled",
                   ["op", "result"])
REQUEST_SECONDS = Histogram("txnstream_tc_request_seconds",
                            "A coordinator request from arrival to its reply (END: markers "
                            "written)", ["op"], buckets=_LATENCY_BUCKETS)
TURN_SECONDS = Histogram("txnstream_worker_turn_seconds", "One batch turn of the worker loop",
                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
TCS_SERVED = Gauge("txnstream_tcs_served", "Coordinators this worker serves")
INVALID_RECORDS = Counter("txnstream_log_invalid_records_total",
                          "Log records ignored by the fencing rule or undecodable", ["tc"])
OPEN_TXNS = Gauge("txnstream_open_txns",
                  "Transactions not yet final (open or ending); reserved TxnIDs not handed "
                  "out yet are not counted", ["tc"])
RESERVED_TXNS = Gauge("txnstream_reserved_txns",
                      "TxnIDs clients reserved and have not handed out yet: no writer holds "
                      "them, but the low watermark waits for them until their lease ends",
                      ["tc"])
OLDEST_OPEN_TXN_SECONDS = Gauge("txnstream_oldest_open_txn_age_seconds",
                                "Age of the oldest transaction not yet final, from its hand-out "
                                "(0: none; reserved TxnIDs not handed out are not counted)",
                                ["tc"])
PREPARED_TXNS = Gauge("txnstream_prepared_txns",
                      "Prepared transactions waiting for their completion (each blocks its "
                      "partitions' committed-only readers)", ["tc"])
OLDEST_PREPARED_TXN_SECONDS = Gauge("txnstream_oldest_prepared_txn_age_seconds",
                                    "How long the oldest prepared transaction has waited for "
                                    "its completion (0: none)", ["tc"])
PENDING_ACK_SUBSCRIPTIONS = Gauge("txnstream_pending_ack_subscriptions",
                                  "Subscription partitions with acks pending in transactions "
                                  "not yet final", ["tc"])
TC_OWNERSHIP_CHANGES = Counter("txnstream_tc_ownership_changes_total",
                               "Coordinators this worker started serving (after a replay) "
                               "or stopped serving: failovers and rebalances", ["event"])

# --- buffer role (its own process: --metrics-port + 1) ------------------------------
BUFFER_SLOTS = Gauge("txnstream_buffer_slots_owned", "Buffer slots this worker owns")
BUFFER_PARTITIONS = Gauge("txnstream_buffer_partitions_served",
                          "Data partitions this worker's buffer role serves")
BUFFER_DELTAS = Counter("txnstream_buffer_deltas_total", "Buffer state deltas published",
                        ["result"])
BUFFER_RECORDS_FOLDED = Counter("txnstream_buffer_records_folded_total",
                                "Data records folded by the buffer role")
BUFFER_BLOCKED = Gauge("txnstream_buffer_partitions_blocked",
                       "Served partitions an open txn blocks (max read position < end)")
BUFFER_BLOCKED_SECONDS = Gauge("txnstream_buffer_partition_blocked_seconds",
                               "How long the txn holding back a partition's committed "
                               "readers has been open there", ["topic", "partition", "txn"])
BUFFER_LAG = Gauge("txnstream_buffer_lag_records",
                   "Offsets written but not yet readable by committed readers (log end "
                   "offset minus max read position): fold lag plus read lag",
                   ["topic", "partition"])
BUFFER_READ_LAG = Gauge("txnstream_buffer_max_read_lag_records",
                        "Offsets folded but not yet readable (folded position minus max "
                        "read position)", ["topic", "partition"])
BUFFER_FOLD_LAG = Gauge("txnstream_buffer_fold_lag_records",
                        "Offsets written but not yet folded (log end minus folded position)",
                        ["topic", "partition"])

# --- clients (the application's own process, if it serves metrics) -------------------
DEAD_LETTERED = Counter("txnstream_consumer_dead_lettered_total",
                        "Records a consumer wrote to its dead-letter topic with their ack, "
                        "past the policy's redelivery count", ["subscription"])
REDELIVERED = Counter("txnstream_consumer_redelivered_total",
                      "Records a consumer handed out again unacked (an aborted txn's acks, "
                      "a negative ack, redeliver_unacknowledged)", ["subscription"])
DELAYED = Counter("txnstream_consumer_delayed_total",
                  "Records a consumer read before their delivery time and held for it "
                  "(deliver_after, deliver_at, retry letters)", ["subscription"])
RETRIED = Counter("txnstream_consumer_retried_total",
                  "Records a consumer wrote to its retry topic with their ack "
                  "(reconsume_later)", ["subscription"])


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on ``host:port`` (``0.0.0.0`` inside a container, to be scraped)."""
    start_http_server(port, addr=host)


def remove_series(gauge: Gauge, gone: Iterable[tuple[str, ...]]) -> None:
    """Drop the series of these label values from ``gauge``; one already absent is fine.

    How per-partition and per-TC gauges keep their cardinality bounded: a series whose
    partition unblocked, or whose TC moved away, leaves the endpoint at the next export.
    """
    for labels in gone:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
