"""Run profiles: how much workload, how many processes, which faults, which bounds.

``short`` fits in ``make chaos`` / ``make test`` (about 3-4 minutes with the cluster
start on a 2-core machine); ``soak`` is the same run stretched to ``--minutes N`` with a
few more processes. Every number says why it has its value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Profile", "Bounds", "PROFILES", "profile"]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What must stay small after N txns: state that grows with use is a defect (item 6)."""

    worker_rss_mb: float = 400.0
    """A coordinator worker (TC + buffer roles) holds open txns, a few hundred recent
    ended ones and the folded buffers: ~100 MB of Python and librdkafka; 4x is a leak."""
    log_records: int = 60_000
    """Retained ``__txn_log`` records (high - low watermark, all partitions). Ended txns
    are kept ``end_retention`` (300 s) plus a checkpoint interval: at this harness's
    rate (~10 txns/s, ~6 records each) that is ~25k; a log never truncated passes 60k
    in about 20 minutes of soak. The hostile profile's flood adds its own txns and
    reservations, so there this count follows the flood's rate: ``log_oldest_s`` is
    the bound on truncation itself."""
    log_oldest_s: float = 480.0
    """Age of the oldest retained ``__txn_log`` record after the drain. A TC keeps an
    ended txn's records ``end_retention`` (300 s) and truncates after each checkpoint
    (every 30 s), at the EPOCH renewal (every 30 s) before the first record it needs;
    a new owner checkpoints one interval after its replay: 300 + 3 x 30 s, and 90 s for
    a takeover in the drain's first minute. A log truncated late, or never, ages with
    the run (30 minutes in a soak)."""
    log_held_margin_s: float = 120.0
    """When txns were held open through the run (the hostile flood's lister holds 1,000
    per TC, with the longest timeout, from the flood's start to its end), the log keeps
    every record since the EPOCH renewal before the first of them (docs/coordinator.md's
    bounds): their age, plus 30 s to that renewal and 90 s for a takeover's replay."""

    def log_age_bound(self, held_s: float | None) -> float:
        """The bound on the oldest ``__txn_log`` record's age, in seconds.

        ``held_s``: how long ago the first txn held open through the run began (None:
        none was).
        """
        return self.log_oldest_s if held_s is None else max(
            self.log_oldest_s, held_s + self.log_held_margin_s)

    pending_ack_records: int = 60_000
    """Retained pending-ack records: bounded like the TC log (DESIGN.md section 7)."""
    snapshot_records: int = 20_000
    """Retained buffer-snapshot records (compacted: about one live key per partition)."""
    snapshot_record_bytes: int = 256 * 1024
    """Largest single snapshot: a snapshot grows with aborted txns kept; at 1 MB the
    produce fails (MSG_SIZE_TOO_LARGE) and the buffer worker dies."""
    topic_disk_mb: float = 256.0
    """On-disk size of each internal topic on one broker (all its partitions)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One run's shape."""

    name: str
    workload_s: float
    """Producers and the nemesis run this long; then the drain and the checks."""
    workers: int = 2
    producers: int = 2
    """Producer processes; each opens txns and co-writes into its peer's txns."""
    producer_threads: int = 2
    """Openers per producer process: concurrent txns on one client."""
    processors: int = 2
    consumers: int = 2
    in_partitions: int = 6
    out_partitions: int = 4
    coordinators: int = 4
    session_timeout_ms: int = 6_000
    """Group session timeout of workers, processors and consumers: pauses are longer."""
    pause_s: float = 10.0
    """SIGSTOP length: past the session timeout, so the paused member is a zombie."""
    fault_gap_s: tuple[float, float] = (2.0, 6.0)
    """Quiet time between two faults (uniform)."""
    broker_down_s: tuple[float, float] = (3.0, 8.0)
    restart_delay_s: tuple[float, float] = (0.5, 3.0)
    """How long a kill -9ed role process stays dead before its restart."""
    txn_timeout_s: float = 20.0
    """Producers' normal txns: long enough to ride a coordinator failover (~6 s)."""
    processor_txn_timeout_s: float = 15.0
    """Longer than a pause, so a resumed zombie may still try to commit (item 2)."""
    max_redeliver_count: int = 3
    """The processors' dead-letter policy (issue 38): an input whose txns aborted more often
    goes to the dead-letter topic with its ack; faults abort enough of them that a run
    dead-letters some, so the checker sees both fates."""
    retry_ratio: float = 0.03
    """The share of inputs an individually-acking processor retries later
    (``reconsume_later`` in its txn, issue 38) instead of processing; a retried one is
    retried again half the time, so some pass the count and are dead-lettered that way."""
    retry_delay_s: tuple[float, float] = (0.2, 3.0)
    process_s: tuple[float, float] = (0.0, 0.4)
    """A processor's work per batch, between its acks and its commit: the window in which
    a pause turns it into a zombie holding acked inputs."""
    abort_ratio: float = 0.2
    slow_ratio: float = 0.06
    """Txns held open past their (short) timeout, then committed: must not commit."""
    slow_timeout_s: float = 4.0
    slow_overrun_s: tuple[float, float] = (1.0, 8.0)
    """How far past its timeout a slow txn's commit comes: long enough, now and then, for
    a coordinator failover in between (item 5: a timeout abort the new owner never saw)."""
    abandon_ratio: float = 0.03
    """Txns never ended by their client: the coordinator must abort them at timeout."""
    abandon_timeout_s: float = 8.0
    late_ratio: float = 0.05
    """Txns whose co-writer sends once more after the commit (item 7; issue 33: its
    flush says whether the record is in)."""
    foreign_ratio: float = 0.1
    """Txns the co-writer commits from its process while the opener still writes
    (issue 33): the opener's ``commit()`` names the records that are out. A short run
    has ~80 producer txns: this gives it ~8."""
    hold_s: tuple[float, float] = (0.0, 1.2)
    """How long an opener keeps a txn open before ending it (admin aborts hit these)."""
    admin_abort_every_s: float = 9.0
    grace_s: float = 30.0
    """No txn may stay un-ended past its timeout plus this (failover + finalization)."""
    drain_s: float = 75.0
    """After the workload: the longest wait for processors and consumers to catch up."""
    twophase_writers: int = 2
    """Two-phase writers (issue 39, :mod:`chaos.twophase`): one txn across Kafka and
    PostgreSQL per input; two, so one recovers what the other leaves (a paused one's too)."""
    twophase_rate: float = 0.5
    """Their inputs a second, which the two keep up with through the faults, so a drain
    completes with every input processed. At 2 a second two hostile soaks left most
    inputs (seeds 36 and 37: 0.5 and 0.8 done a second; each writer is killed or paused
    about every 40 s, PostgreSQL killed every 30-40 s, and each input takes five
    coordinator round trips, slow under the flood)."""
    bounds: Bounds = Bounds()
    hostile: bool = False
    """Add the hostile actors (issues 19/20): an intruder process on the line."""
    faults: bool = True
    """Run the nemesis. Off (``hostile-flood``): the flood's cost to honest commits
    measured alone, its p99 set by the flood and not by broker kills (a soak's broker is
    down for most of its run, and each phase's p99 is its worst commit or two)."""
    doomed_ratio: float = 0.1
    """(hostile) Txns that also write to the topic the harness deletes halfway through."""
    intruder_rate: float = 4.0
    """Requests a second from each intruder thread (the stranger; half that anonymous)."""
    flood_quiet_share: float = 0.5
    """(hostile) Share of the workload the flood idles first: the quiet phase, whose honest
    commit p99 the flood phase's is held to (2x). Halves: the two p99s are of samples
    alike in size. A short run's half has ~25 commits, too few to judge; on a loaded
    2-core machine (~0.2 commits/s) ``--minutes 10`` gives each phase ~60."""
    flood_list_connections: int = 3
    """Connections pipelining LIST and STATS (issue 34 item 2 used 3)."""
    flood_list_window: int = 16
    """Requests in flight per flood connection: it sends the next as each reply comes."""
    flood_own_txns: int = 1_000
    """Reserved txns the flooder holds per TC, so each LIST has a full page (1,000) to
    show; 10x the honest open txns, a tenth of its per-principal limit."""
    flood_evict_rate: float = 20.0
    """Group commits a second under 400-4,000-byte keys: the byte budget of a TC's
    outcomes (~250 KB) is full within seconds; more would only grow the log."""
    flood_rate: float = 2.0
    """Requests a second of the anonymous-named clients (garbage frames: half that)."""
    flood_idle_sockets: int = 200
    """Connections per worker that never handshake: hundreds, far below the fd limit."""
    flood_idle_hosts: int = 4
    """Loopback addresses they come from (127.0.0.2...): 4 x the per-host cap of 32 is
    half the worker's cap of 256 handshakes from all addresses; from 8 or more addresses
    they would fill that cap, a limit the worker states (Kafka's likewise)."""
    flood_tarpit_records: int = 2
    """Forged endpoint records per TC naming the tarpit (with one naming the impostor and
    one a live worker: 4 forged, under the 8 records a client keeps per TC)."""


_SHORT = Profile("short", workload_s=110.0)
_SOAK = Profile("soak", workload_s=30 * 60.0, producers=2, processors=3, consumers=2,
                workers=3, drain_s=180.0)
PROFILES = {
    "short": _SHORT,
    "soak": _SOAK,
    "hostile": replace(_SHORT, name="hostile", hostile=True),
    "hostile-soak": replace(_SOAK, name="hostile-soak", hostile=True),
    "hostile-flood": replace(_SOAK, name="hostile-flood", hostile=True, faults=False,
                             workload_s=10 * 60.0),
}


def profile(name: str, minutes: float | None = None) -> Profile:
    """The named profile, with the workload stretched to ``minutes`` if given."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
    p = PROFILES[name]
    if minutes is not None:
        if minutes <= 0:
            raise ValueError(f"--minutes must be positive, got {minutes}")
        p = replace(p, workload_s=minutes * 60.0)
    return p
