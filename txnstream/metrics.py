"""Prometheus metrics of the coordinator worker (``txnstream worker --metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["TXN_ENDED", "REQUESTS", "TURN_SECONDS", "TCS_SERVED", "INVALID_RECORDS",
           "OPEN_TXNS", "serve"]

TXN_ENDED = Counter("txnstream_txn_ended_total", "Transactions finalized", ["tc", "outcome"])
REQUESTS = Counter("txnstream_tc_requests_total", "Coordinator requests handled", ["op", "result"])
TURN_SECONDS = Histogram("txnstream_worker_turn_seconds", "One batch turn of the worker loop",
                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
TCS_SERVED = Gauge("txnstream_tcs_served", "Coordinators this worker serves")
INVALID_RECORDS = Counter("txnstream_log_invalid_records_total",
                          "Log records ignored by the fencing rule or undecodable", ["tc"])
OPEN_TXNS = Gauge("txnstream_open_txns", "Open transactions", ["tc"])


def serve(port: int) -> None:
    """Expose /metrics on 127.0.0.1:``port``."""
    start_http_server(port, addr="127.0.0.1")
BUFFER_SLOTS = Gauge("txnstream_buffer_slots_owned", "Buffer slots this worker owns")
BUFFER_PARTITIONS = Gauge("txnstream_buffer_partitions_served",
                          "Data partitions this worker's buffer role serves")
BUFFER_DELTAS = Counter("txnstream_buffer_deltas_total", "Buffer state deltas published",
                        ["result"])
BUFFER_RECORDS_FOLDED = Counter("txnstream_buffer_records_folded_total",
                                "Data records folded by the buffer role")
BUFFER_BLOCKED = Gauge("txnstream_buffer_partitions_blocked",
                       "Served partitions an open txn blocks (max read position < end)")
