"""``TcGauges``: the per-TC gauges a coordinator worker exports (prometheus-client).

Open txns, reserved ones, the oldest open txn's age and the pending-ack subscriptions
of every TC this worker serves, recomputed once a second rather than per turn: each is
a pass over the TC's live txns. A TC this worker no longer serves has its series
removed, so a dashboard never shows one TC twice (old owner and new) after a failover.
"""

from __future__ import annotations

import time

from txnstream import metrics
from txnstream.coordinator.ownership import TcOwnership
from txnstream.types import TxnStatus

__all__ = ["METRICS_EXPORT_S", "TcGauges"]

METRICS_EXPORT_S = 1.0
"""How often the per-TC gauges are recomputed (each is a pass over live txns)."""


class TcGauges:
    """The gauges of the TCs one :class:`TcOwnership` serves."""

    def __init__(self, ownership: TcOwnership) -> None:
        self._ownership = ownership
        self._due_at = 0.0
        self._exported_tcs: set[int] = set()

    def turn(self, now: float) -> None:
        """Export if :data:`METRICS_EXPORT_S` has passed since the last export.

        ``now``: ``time.perf_counter()`` at the start of the worker's turn.
        """
        if now >= self._due_at:
            self._due_at = now + METRICS_EXPORT_S
            self.export()

    def export(self) -> None:
        """Set every served TC's gauges; remove those of TCs no longer served here."""
        metrics.TCS_SERVED.set(len(self._ownership.serving_ids()))
        now_ms = int(time.time() * 1000)
        served: set[int] = set()
        for tc in list(self._ownership.tcs.values()):
            if not self._ownership.serving(tc):
                continue
            served.add(tc.tc_id)
            live = tc.store.handed_out()  # reserved TxnIDs are no writer's txns yet
            label = str(tc.tc_id)
            metrics.OPEN_TXNS.labels(label).set(len(live))
            metrics.RESERVED_TXNS.labels(label).set(tc.store.reserved_count())
            oldest = min((m.open_time_ms for m in live), default=None)
            metrics.OLDEST_OPEN_TXN_SECONDS.labels(label).set(
                0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000))
            metrics.PENDING_ACK_SUBSCRIPTIONS.labels(label).set(
                sum(len(m.subscriptions) for m in live))
            prepared = [m.prepared_at_ms for m in live if m.status is TxnStatus.PREPARED
                        and m.prepared_at_ms is not None]
            metrics.PREPARED_TXNS.labels(label).set(len(prepared))
            metrics.OLDEST_PREPARED_TXN_SECONDS.labels(label).set(
                max(0.0, (now_ms - min(prepared)) / 1000) if prepared else 0.0)
        gone = [(str(tc_id),) for tc_id in self._exported_tcs - served]
        for gauge in (metrics.OPEN_TXNS, metrics.RESERVED_TXNS, metrics.OLDEST_OPEN_TXN_SECONDS,
                      metrics.PENDING_ACK_SUBSCRIPTIONS, metrics.PREPARED_TXNS,
                      metrics.OLDEST_PREPARED_TXN_SECONDS):
            metrics.remove_series(gauge, gone)
        self._exported_tcs = served
