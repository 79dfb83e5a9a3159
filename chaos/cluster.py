"""The harness's own 3-broker cluster, its topics, and what they hold on disk.

:class:`ChaosCluster` starts a :class:`~txnstream.cluster.LocalCluster` (3 KRaft nodes)
on free ports in the run directory, creates the internal topics with replication 3 and
``min.insync.replicas=2`` (set here on any internal topic ``ensure_topics`` left without
it) and the data topics alike, and always stops every node on :meth:`down`, also after a
failure or Ctrl-C (the caller's ``finally``).
"""

from __future__ import annotations

import logging
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from txnstream import Config, TopicNames
from txnstream.admin_topics import ensure_topics
from txnstream.cluster import LocalCluster
from txnstream.errors import ClusterError

__all__ = ["ChaosCluster", "TopicSize", "free_port_block"]

log = logging.getLogger(__name__)

MIN_ISR = "2"
"""With 3 replicas, one broker may die without losing an acknowledged write."""
CONTROLLER_OFFSET = 100
"""LocalCluster puts node i's controller on port + 100 + i - 1."""


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default otherwise)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(n: int = 3) -> int:
    """A port p with p..p+n-1 and p+100..p+100+n-1 free on 127.0.0.1.

    Below the ephemeral range: a broker the nemesis killed must get its ports back when
    it restarts, and a port in that range can meanwhile be taken by any outgoing
    connection (a 30-minute soak lost a broker for its second half that way).
    """
    low, _ = ephemeral_ports()
    top = min(low, 65536) - CONTROLLER_OFFSET - n
    if top <= 1024:
        raise RuntimeError(f"no room for broker ports below the ephemeral range ({low})")
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(1024, top)
        ports = [base + i for i in range(n)] + [base + CONTROLLER_OFFSET + i for i in range(n)]
        if all(_free(p) for p in ports):
            return base
    raise RuntimeError("no free block of broker ports on 127.0.0.1")


def free_port() -> int:
    """One free TCP port on 127.0.0.1, below the ephemeral range.

    A role restarted by the nemesis listens on it again.
    """
    low, _ = ephemeral_ports()
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(1024, low)
        if _free(port):
            return port
    raise RuntimeError("no free port on 127.0.0.1 below the ephemeral range")


@dataclass(frozen=True, slots=True)
class TopicSize:
    """What one topic holds: records between the watermarks, bytes on one broker's disk."""

    topic: str
    records: int
    disk_bytes: int
    """The largest, over the brokers, of the topic's partition directories' sizes."""


class _LogReporter:
    """LocalCluster progress to logging (the harness prints its own lines)."""

    def status(self, text: str) -> None:
        log.debug("%s", text)

    def note(self, text: str) -> None:
        log.info("%s", text)


class ChaosCluster:
    """A 3-broker LocalCluster with RF=3 / min ISR 2 topics, in ``state_dir``."""

    def __init__(self, state_dir: Path, prefix: str = "__txn", coordinators: int = 4,
                 heap: str = "384m", kafka_logger: logging.Logger | None = None) -> None:
        self.cluster = LocalCluster(state_dir, brokers=3, port=free_port_block(3), heap=heap,
                                    reporter=_LogReporter())
        self.topics = TopicNames(prefix)
        self.coordinators = coordinators
        self.kafka_logger = kafka_logger

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers of all three nodes."""
        return self.cluster.bootstrap

    def config(self) -> Config:
        """The Config every harness client and role process uses."""
        kafka = {"logger": self.kafka_logger} if self.kafka_logger is not None else {}
        return Config(bootstrap_servers=self.bootstrap, topics=self.topics,
                      num_coordinators=self.coordinators, replication_factor=3, kafka=kafka)

    def up(self) -> float:
        """Start the nodes; the seconds it took."""
        t0 = time.monotonic()
        self.cluster.up()
        return time.monotonic() - t0

    def down(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after a short grace); safe to call twice."""
        try:
            self.cluster.down(timeout_s=10.0)
        except Exception:  # noqa: BLE001 - teardown must go on
            log.exception("stopping the chaos cluster")

    def kill_node(self, node_id: int) -> None:
        """Kill -9 one broker."""
        self.cluster.kill(node_id)

    def start_node(self, node_id: int, port_wait_s: float = 60.0) -> None:
        """Restart one broker and wait until the cluster lists it.

        A killed broker's accepted connections linger (FIN_WAIT) for a moment after the
        kill and keep its port taken; the restart waits for the port instead of failing.
        """
        deadline = time.monotonic() + port_wait_s
        while True:
            try:
                self.cluster.start_node(node_id, timeout_s=120.0)
                return
            except ClusterError as exc:
                if "already in use" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def node_ids(self) -> list[int]:
        """The brokers' node ids."""
        return list(self.cluster.layout.node_ids)

    def node_pids(self) -> dict[int, int]:
        """Running brokers: node id -> pid."""
        return self.cluster.pids()

    # ------------------------------------------------------------------ topics

    def create_topics(self, data: dict[str, int]) -> dict[str, str]:
        """Internal topics (RF 3) and ``data`` (name -> partitions); min ISR 2 everywhere.

        Returns topic -> its ``min.insync.replicas`` as the brokers report it.
        """
        cfg = self.config()
        ensure_topics(cfg)
        admin = AdminClient(cfg.admin())
        futures = admin.create_topics(
            [NewTopic(t, n, 3, config={"min.insync.replicas": MIN_ISR}) for t, n in data.items()],
            operation_timeout=30)
        for f in futures.values():
            try:
                f.result(60)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
        names = self.topics.all() + list(data)
        self._wait_topics(admin, names)
        return self._enforce_min_isr(admin, names)

    @staticmethod
    def _wait_topics(admin: AdminClient, names: list[str]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            meta = admin.list_topics(timeout=10).topics
            if all(n in meta and meta[n].error is None for n in names):
                return
            time.sleep(0.2)
        raise RuntimeError(f"topics {names} did not appear within 60 s")

    @staticmethod
    @retry(retry=retry_if_exception_type(KafkaException), stop=stop_after_delay(60),
           wait=wait_fixed(0.5), reraise=True)
    def _enforce_min_isr(admin: AdminClient, names: list[str]) -> dict[str, str]:
        """Set ``min.insync.replicas=2`` on each topic that does not have it explicitly."""
        # Retried: just after creation a broker may not know a topic yet
        # (UNKNOWN_TOPIC_OR_PART); setting a config twice is harmless.
        res = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
        described = {r.name: f.result(30) for r, f in admin.describe_configs(res).items()}
        todo = []
        for name, entries in described.items():
            e = entries.get("min.insync.replicas")
            if e is None or e.value != MIN_ISR or e.is_default:
                todo.append(ConfigResource(
                    ConfigResource.Type.TOPIC, name, incremental_configs=[ConfigEntry(
                        "min.insync.replicas", MIN_ISR,
                        incremental_operation=AlterConfigOpType.SET)]))
        for f in admin.incremental_alter_configs(todo).values() if todo else ():
            f.result(30)
        final = {r.name: f.result(30) for r, f in admin.describe_configs(res).items()}
        return {n: final[n]["min.insync.replicas"].value for n in names}

    def topic_sizes(self, topics: list[str]) -> dict[str, TopicSize]:
        """Records between the watermarks and on-disk bytes, per topic."""
        cfg = self.config()
        c = Consumer(cfg.consumer("chaos-sizes"))
        out = {}
        try:
            meta = c.list_topics(timeout=15).topics
            for t in topics:
                records = 0
                for p in (meta[t].partitions if t in meta else {}):
                    lo, hi = c.get_watermark_offsets(KafkaTP(t, p), timeout=15)
                    records += max(0, hi - lo)
                out[t] = TopicSize(t, records, self._disk_bytes(t))
        finally:
            c.close()
        return out

    def _disk_bytes(self, topic: str) -> int:
        best = 0
        for i in self.cluster.layout.node_ids:
            data = self.cluster.layout.data_dir(i)
            total = 0
            for d in data.glob(f"{topic}-*"):
                if d.is_dir() and d.name.rsplit("-", 1)[-1].isdigit():
                    # Segments only: index files are preallocated (10 MB each) and say
                    # nothing about what the topic holds.
                    total += sum(f.stat().st_size for f in d.glob("*.log"))
            best = max(best, total)
        return best
