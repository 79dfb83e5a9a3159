"""``WorkerSettings``: the tuning of a coordinator worker (``txnstream worker`` flags).

One frozen object, each value with why it is what it is; the Kafka and line settings it
renders are built where the clients and the listener are made
(:mod:`txnstream.coordinator.kafka_clients`, :mod:`txnstream.coordinator.worker`).
"""

from __future__ import annotations

from dataclasses import dataclass

from txnstream.kafka.clients import COOPERATIVE

__all__ = ["WorkerSettings"]


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Tuning of a coordinator worker; each value says why."""

    session_timeout_ms: int = 10_000
    """How long a silent worker keeps its TCs: failover time is about this long."""
    tc_assignment_strategy: str = COOPERATIVE
    """How the coordinators' group hands TCs out, and the buffer owners' group buffer
    slots (librdkafka's ``partition.assignment.strategy``). ``cooperative-sticky``: a
    worker joining or leaving moves only the TCs (slots) that change owner; the others
    serve on. ``range`` (eager,
    the protocol of workers before stop 71): every worker gives up every TC at every
    change and replays each one it gets back. A group cannot mix the two (librdkafka
    does not migrate online): a rolling upgrade from such workers passes ``range``."""
    heartbeat_interval_ms: int = 1_000
    batch_max: int = 2_000
    """Requests handled per turn: one log flush and one marker flush for all of them."""
    idle_poll_s: float = 0.05
    readback_timeout_s: float = 15.0
    """Longer than any healthy append; past it the worker re-replays that TC."""
    checkpoint_interval_s: float = 30.0
    end_retention_ms: int = 300_000
    """Ended txns stay in the log this long, so a client retrying its commit sees the outcome."""
    finalize_backoff_max_s: float = 5.0
    buffer_role: bool = True
    """Also host the buffer role (:class:`~txnstream.buffer.worker.BufferWorker`): readers
    of transactional topics need one somewhere."""
    buffer_topics: tuple[str, ...] | None = None
    """Serve only these data topics (names, or regexes starting with ``^``); None: all."""
    buffer_snapshot_interval_s: float = 10.0
    endpoint_republish_s: float = 30.0
    """Each served TC's endpoint record is written again this often: ``_tc_endpoints``
    is compacted by TC and clients keep the records they read last, so a forged record
    written after the genuine one hides it for at most this long (DESIGN.md section 10)."""
    listen: str = "127.0.0.1:0"
    """Address of the direct line to clients (port 0: any free port); every TC it serves
    is reached there."""
    advertise: str | None = None
    """Address clients are told (``host:port``); default: the listen host and the port
    bound (this host's name when listening on every interface). Give it behind a NAT."""
    allow_unauthenticated: bool = False
    """Serve a line beyond loopback with no authentication (no secret, no mutual TLS):
    refused by default, since anyone who reaches the port could then act as anyone."""
    unsigned: bool = False
    """Run without the workers' key (``--unsigned``): markers are not signed and records'
    membership of txns is not checked, so any producer of a data topic can forge markers.
    Refused by default: a worker with no key (:mod:`txnstream.workers_key`) does not
    start without it, and with it logs a warning at start."""
    max_connections: int = 1_024
    """Open client connections; one more is refused (closed after a ``NO`` naming this)."""
    max_inflight_per_connection: int = 1_000
    """Requests of one connection awaiting their reply; past it the connection is refused
    further requests with ``TooManyRequestsError`` until replies drain."""
    max_request_bytes: int = 1 << 20
    """A request frame larger than this closes its connection (the largest honest request,
    a RESERVE or an ADD of many partitions, is a few KB)."""
    slow_request_s: float = 1.0
    """A request answered this long after it arrived is logged with where its time went
    (:mod:`~txnstream.coordinator.origins`)."""
    idle_timeout_s: float = 600.0
    """A connection with no frame in this long is closed (clients reconnect on demand)."""
    max_open_txns_per_principal: int = 10_000
    """Open txns one principal may hold on one TC (reserved ones included); a NEW or
    RESERVE past it is refused with ``TooManyRequestsError``."""
    max_handshakes: int = 256
    """Connections still in their handshake, from every address; one more is closed at
    once (authenticated connections never wait behind them)."""
    max_handshakes_per_host: int = 32
    """... from one address (Kafka's ``max.connections.per.ip``)."""
    read_share: float = 0.05
    """Share of the worker's time one principal's reads (GET, LIST, STATS) may take, in
    bursts of up to ``read_burst_s``; past it none of its requests is taken until it is
    back under (Kafka's ``request_percentage`` quota). Admins and the workers' principal
    are exempt, and so is every client of a line that does not authenticate. 5% was 450
    LIST pages of 25 txns a second against 3,600 unthrottled (``test_fair_worker``)."""
    read_burst_s: float = 0.25
    """Handling time a principal's reads may take at once before the share applies."""
    max_queued_per_connection: int = 256
    """Requests of one connection read and not yet taken by the worker: the connection is
    not read further until the worker takes some (backpressure; nothing is refused)."""
    max_queued_bytes_per_connection: int = 4 << 20
    """... and their bytes."""
    max_queued_bytes: int = 64 << 20
    """Bytes of every connection's requests read and not yet taken: no connection is read
    past it (Kafka's ``queued.max.requests``, in bytes)."""
