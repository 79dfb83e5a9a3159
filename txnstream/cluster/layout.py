"""Where a local cluster's nodes live and listen, and the ``server.properties`` each one gets.

Pure functions over plain data: nothing here touches the network or starts a process, so
the rendering is unit-tested without Java (``tests/unit/test_cluster_config.py``).

State directory layout (one per cluster)::

    <state_dir>/
      cluster.json            ClusterLayout + cluster id, written on first ``up``
      node-<i>/
        server.properties     rendered on every ``up`` (ports may change between runs)
        server.log            the JVM's stdout+stderr, appended across restarts
        format.log            output of the one-time KRaft storage format
        kafka.pid             pid of the running JVM; removed by ``down``
        data/                 ``log.dirs``: KRaft metadata log and topic data
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from txnstream.errors import ClusterError

__all__ = [
    "ClusterLayout",
    "CONTROLLER_PORT_OFFSET",
    "SUPPORTED_BROKER_COUNTS",
    "new_cluster_id",
    "ScramUser",
    "render_server_properties",
    "read_cluster_file",
    "write_cluster_file",
]

CONTROLLER_PORT_OFFSET = 100
"""Controller ports default to the client port + 100, so one ``--port`` picks both ranges."""

SUPPORTED_BROKER_COUNTS = (1, 3)
"""One node for development, three for failure tests (RF 3 with min ISR 2 survives one loss)."""

CLUSTER_FILE = "cluster.json"

# Failure detection. Kafka's defaults (heartbeat 2 s, session 9 s) make a killed broker
# hold partition leadership for ~9 s; 1 s / 6 s halves the failover time of fault tests
# while staying far above the pauses a 512 MiB heap sees on a loaded 2-core machine.
BROKER_HEARTBEAT_MS = 1_000
BROKER_SESSION_TIMEOUT_MS = 6_000

# Internal topics default to 50 partitions each; on a laptop or CI runner creating
# 50 x RF partitions is what makes the first consumer group or transaction slow.
# 10 keeps coordinator load spread while making that first use ~5x cheaper.
INTERNAL_TOPIC_PARTITIONS = 10


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """The shape of a local cluster: how many nodes, which ports, where its state lives.

    Node ``i`` (1-based) listens for clients on ``port + i - 1`` and for the KRaft
    controller quorum on ``controller_port + i - 1``, all on 127.0.0.1 only.
    """

    state_dir: Path
    brokers: int = 1
    port: int = 9092
    controller_port: int = 9092 + CONTROLLER_PORT_OFFSET

    def __post_init__(self) -> None:
        if self.brokers not in SUPPORTED_BROKER_COUNTS:
            raise ClusterError(f"brokers must be 1 or 3, not {self.brokers}")
        for name, base in (("port", self.port), ("controller port", self.controller_port)):
            if not 1024 <= base <= 65535 - self.brokers:
                raise ClusterError(f"{name} {base} is out of range (1024..{65535 - self.brokers})")
        clients = set(self.client_ports())
        if clients & set(self.controller_ports()):
            raise ClusterError(
                f"client ports {sorted(clients)} overlap controller ports "
                f"{self.controller_ports()}; pick a controller port at least {self.brokers} away")

    @classmethod
    def create(cls, state_dir: Path, brokers: int = 1, port: int = 9092,
               controller_port: int | None = None) -> ClusterLayout:
        """A layout with the controller ports defaulting to ``port + 100``."""
        cport = port + CONTROLLER_PORT_OFFSET if controller_port is None else controller_port
        return cls(Path(state_dir).resolve(), brokers, port, cport)

    @property
    def node_ids(self) -> range:
        """KRaft node ids, 1-based."""
        return range(1, self.brokers + 1)

    def client_port(self, node_id: int) -> int:
        """PLAINTEXT port of one node."""
        return self.port + node_id - 1

    def controller_port_of(self, node_id: int) -> int:
        """CONTROLLER listener port of one node."""
        return self.controller_port + node_id - 1

    def client_ports(self) -> list[int]:
        """Every node's client port, in node order."""
        return [self.client_port(i) for i in self.node_ids]

    def controller_ports(self) -> list[int]:
        """Every node's controller port, in node order."""
        return [self.controller_port_of(i) for i in self.node_ids]

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` naming every node."""
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports())

    @property
    def quorum_voters(self) -> str:
        """Static ``controller.quorum.voters``: every node is a voter."""
        return ",".join(f"{i}@127.0.0.1:{self.controller_port_of(i)}" for i in self.node_ids)

    def node_dir(self, node_id: int) -> Path:
        """``<state_dir>/node-<i>``."""
        return self.state_dir / f"node-{node_id}"

    def properties_path(self, node_id: int) -> Path:
        """The node's ``server.properties``; its path also marks the JVM as ours."""
        return self.node_dir(node_id) / "server.properties"

    def data_dir(self, node_id: int) -> Path:
        """The node's ``log.dirs``."""
        return self.node_dir(node_id) / "data"

    def log_path(self, node_id: int) -> Path:
        """Where the node's JVM writes stdout and stderr."""
        return self.node_dir(node_id) / "server.log"

    def pid_path(self, node_id: int) -> Path:
        """The pid file of the node's running JVM."""
        return self.node_dir(node_id) / "kafka.pid"


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID as 22 chars of URL-safe base64 (Kafka's ``Uuid``).

    Like Kafka's ``Uuid.randomUuid`` it never starts with ``-``, which the storage tool's
    command line would take for an option.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


@dataclass(frozen=True, slots=True)
class ScramUser:
    """The one SASL/SCRAM user of a secured local cluster (brokers and clients share it).

    The password never prints (``repr``); it is written only to files readable by the
    owner: the nodes' ``server.properties`` and the state dir's ``client.properties``.
    """

    username: str
    password: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        if self.mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ClusterError(f"SASL mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512, "
                               f"not {self.mechanism!r}")
        bad = set('"\\;,[]=') & set(self.username + self.password)
        if not self.username or not self.password or bad:
            raise ClusterError("SCRAM username and password must be non-empty, without "
                               'any of: " \\ ; , [ ] =')

    def client_settings(self) -> dict[str, str]:
        """Return the librdkafka settings that log in as this user (SASL_PLAINTEXT)."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": self.mechanism,
                "sasl.username": self.username, "sasl.password": self.password}

    def format_arg(self) -> str:
        """The ``kafka-storage format --add-scram`` value creating the credential."""
        return f"{self.mechanism}=[name={self.username},password={self.password}]"


def render_server_properties(layout: ClusterLayout, node_id: int,
                             scram: ScramUser | None = None) -> str:
    """The ``server.properties`` of one combined broker+controller KRaft node.

    With ``scram`` the client listener (also used between brokers) is SASL_PLAINTEXT and
    takes only that SCRAM user; the controller listener stays on 127.0.0.1 in plaintext.
    """
    if node_id not in layout.node_ids:
        raise ClusterError(f"node {node_id} is not in a {layout.brokers}-node cluster")
    client = "SASL_PLAINTEXT" if scram else "PLAINTEXT"
    multi = layout.brokers > 1
    rf = 3 if multi else 1
    min_isr = 2 if multi else 1
    props: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": layout.quorum_voters,
        "listeners": (f"{client}://127.0.0.1:{layout.client_port(node_id)},"
                      f"CONTROLLER://127.0.0.1:{layout.controller_port_of(node_id)}"),
        "advertised.listeners": f"{client}://127.0.0.1:{layout.client_port(node_id)}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        "log.dirs": str(layout.data_dir(node_id)),
        # Replication: every internal topic gets RF 3 / min ISR 2 on three nodes (one
        # node may die without losing acks=all writes), RF 1 / min ISR 1 on one node.
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        "offsets.topic.num.partitions": INTERNAL_TOPIC_PARTITIONS,
        "transaction.state.log.num.partitions": INTERNAL_TOPIC_PARTITIONS,
        "share.coordinator.state.topic.num.partitions": INTERNAL_TOPIC_PARTITIONS,
        # A test's first consumer joins at once instead of waiting 3 s for company.
        "group.initial.rebalance.delay.ms": 0,
        "broker.heartbeat.interval.ms": BROKER_HEARTBEAT_MS,
        "broker.session.timeout.ms": BROKER_SESSION_TIMEOUT_MS,
        "num.partitions": 1,
        "auto.create.topics.enable": "true",
    }
    if scram:
        mech = scram.mechanism
        props.update({
            "sasl.enabled.mechanisms": mech,
            "sasl.mechanism.inter.broker.protocol": mech,
            f"listener.name.sasl_plaintext.{mech.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{scram.username}" password="{scram.password}";'),
        })
    header = (f"# Rendered by txnstream.cluster.layout for node {node_id} of {layout.brokers};\n"
              "# re-rendered on every `txnstream cluster up`: edits are lost.\n")
    return header + "".join(f"{k}={v}\n" for k, v in props.items())


def write_cluster_file(layout: ClusterLayout, cluster_id: str) -> None:
    """Record the layout and cluster id so ``status``/``down`` need no flags."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    data = {"cluster_id": cluster_id, "brokers": layout.brokers, "port": layout.port,
            "controller_port": layout.controller_port}
    tmp = layout.state_dir / (CLUSTER_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(layout.state_dir / CLUSTER_FILE)  # atomic: readers see old or new, never half


def read_cluster_file(state_dir: Path) -> tuple[ClusterLayout, str] | None:
    """The layout and cluster id recorded in ``state_dir``, or None if there is none."""
    path = Path(state_dir).resolve() / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(
            f"cannot read {path}: {exc}; remove the state dir to start over") from exc
    layout = ClusterLayout(path.parent, int(data["brokers"]), int(data["port"]),
                           int(data["controller_port"]))
    return layout, str(data["cluster_id"])
