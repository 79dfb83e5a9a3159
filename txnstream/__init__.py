"""txnstream: Apache Pulsar's transactions on Apache Kafka.

Coordinator, transaction buffer and pending acks, in Python:

    import txnstream
    client = txnstream.Client("127.0.0.1:9092")
    with client.transaction(timeout_s=60) as txn:
        ...

The names below are imported when first used (PEP 562), so a process that needs one
part (the Spark source's driver, started afresh for every streaming query, imports the
config and the buffer state follower) does not pay for the client, the consumer and
the metrics.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txnstream.client import Client
    from txnstream.config import Config, TopicNames
    from txnstream.lifecycle import DeadLetterPolicy
    from txnstream.transaction import Transaction
    from txnstream.types import TopicPartition, TxnID, TxnStatus

__all__ = ["Client", "Config", "DeadLetterPolicy", "TopicNames", "Transaction", "TopicPartition",
           "TxnID", "TxnStatus"]
__version__ = "0.1.0"

_HOMES = {"Client": "client", "Config": "config", "TopicNames": "config",
          "DeadLetterPolicy": "lifecycle", "Transaction": "transaction",
          "TopicPartition": "types", "TxnID": "types", "TxnStatus": "types"}
"""Where each public name lives (``txnstream.<module>``)."""


if not TYPE_CHECKING:  # mypy sees the imports above, so a misspelt name still fails it

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'txnstream' has no attribute {name!r}")
        value = getattr(import_module(f"txnstream.{home}"), name)
        globals()[name] = value  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
