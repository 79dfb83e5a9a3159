"""Asking a starting cluster whether it answers yet, quietly."""

from __future__ import annotations

import logging
import socket
from typing import Any

__all__ = ["ClusterProbe", "accepts"]

PROBE_TIMEOUT_S = 2.0
"""One metadata request while waiting; short so an early exit is noticed quickly."""

# librdkafka's "connection refused" chatter while we poll a starting broker goes here
# and no further (a probe failing is what waiting means).
_PROBE_LOGGER = logging.getLogger("txnstream.cluster.probe")
_PROBE_LOGGER.addHandler(logging.NullHandler())
_PROBE_LOGGER.propagate = False


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """True if a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class ClusterProbe:
    """Which brokers a cluster's metadata lists right now (empty while it does not answer).

    The Kafka client is only created once every client port accepts TCP, so a cluster
    that is still starting costs a few socket connects per probe, not a client's retries.
    """

    def __init__(self, bootstrap: str, ports: list[int],
                 settings: dict[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.ports = ports
        self.settings = settings or {}
        """librdkafka settings added to the probe's client (SASL on a secured cluster)."""
        self._admin: Any = None

    def brokers(self) -> set[int]:
        """Node ids in a fresh metadata response, or an empty set if none came."""
        if self._admin is None:
            if not all(accepts(p) for p in self.ports):
                return set()
            from confluent_kafka.admin import AdminClient  # heavy; only once ports are open

            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.settings},
                                      logger=_PROBE_LOGGER)
        try:
            return set(self._admin.list_topics(timeout=PROBE_TIMEOUT_S).brokers)
        except Exception:  # noqa: BLE001 - not answering yet is what we are waiting for
            return set()
