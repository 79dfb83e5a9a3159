"""Records as the holders of the workers' key write them, for tests that lay a partition
out by hand (txn records of a coordinator that does not exist, markers no coordinator
wrote).

The run's workers sign their markers and check records' membership of txns (the run's
key: tests/conftest.py), so a hand-made marker counts, and a hand-made txn record is its
txn's, only with the tag a worker (or the txn's writer) would give it. A test about
forged records writes them without these.
"""

from __future__ import annotations

from txnstream.config import Config
from txnstream.markers import TXN_ID_HEADER, TXN_TAG_HEADER, MarkerSigner, TxnMarker
from txnstream.types import TopicPartition, TxnID
from txnstream.workers_key import default_key_path, workers_signer

Headers = list[tuple[str, str | bytes | None]]


_SIGNERS: dict[tuple[str, str | None, str | None, str], MarkerSigner] = {}


def signer(config: Config) -> MarkerSigner:
    """The workers' signer of ``config`` on its broker's cluster (made once per key)."""
    k = (config.bootstrap_servers, config.workers_key_file, config.tc_secret,
         str(default_key_path()))
    if k not in _SIGNERS:
        from confluent_kafka.admin import AdminClient

        cluster = AdminClient(config.admin()).list_topics(timeout=10).cluster_id
        assert cluster, f"the broker at {config.bootstrap_servers} reported no cluster id"
        made = workers_signer(config, cluster)
        assert made is not None, "no workers' key (tests/conftest.py gives the run one)"
        _SIGNERS[k] = made
    return _SIGNERS[k]


def txn_record_headers(config: Config, txn_id: TxnID, topic: str,
                       partition: int) -> Headers:
    """The headers of a member record of ``txn_id`` at ``topic``-``partition``."""
    membership = signer(config).membership
    assert membership is not None
    return [(TXN_ID_HEADER, txn_id.to_bytes()),
            (TXN_TAG_HEADER, membership.tag(txn_id, TopicPartition(topic, partition)))]


def marker_headers(config: Config, marker: TxnMarker, topic: str, partition: int) -> Headers:
    """The headers of ``marker`` (value ``marker.encode()``) as a worker writes it there."""
    return signer(config).headers(marker, topic, partition, marker.encode())
