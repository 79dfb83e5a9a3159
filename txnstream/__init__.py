"""txnstream: Apache Pulsar's transactions on Apache Kafka.

Coordinator, transaction buffer and pending acks, in Python:

    import txnstream
    client = txnstream.Client("127.0.0.1:9092")
    with client.transaction(timeout_s=60) as txn:
        ...
"""

from txnstream.client import Client
from txnstream.config import Config, TopicNames
from txnstream.lifecycle import DeadLetterPolicy
from txnstream.transaction import Transaction
from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["Client", "Config", "DeadLetterPolicy", "TopicNames", "Transaction", "TopicPartition",
           "TxnID", "TxnStatus"]
__version__ = "0.1.0"
