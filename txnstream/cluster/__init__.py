"""A local Apache Kafka (KRaft) cluster without Docker: ``txnstream cluster up|status|down``.

The broker jars come from Maven Central via ``mvn`` (or ``$KAFKA_HOME/libs``), are cached
and verified, and one or three combined broker+controller nodes run on 127.0.0.1.
"""

from txnstream.cluster.jars import KAFKA_VERSION
from txnstream.cluster.layout import ScramUser
from txnstream.cluster.local import LocalCluster, NodeStatus, StartupReport
from txnstream.cluster.report import RecordingReporter, Reporter, StderrReporter

__all__ = [
    "KAFKA_VERSION",
    "LocalCluster",
    "NodeStatus",
    "RecordingReporter",
    "Reporter",
    "ScramUser",
    "StartupReport",
    "StderrReporter",
]
