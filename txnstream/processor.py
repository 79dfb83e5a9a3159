"""``ExactlyOnceProcessor``: consume-transform-produce, exactly once (Pulsar Functions' case).

One transaction per batch: the outputs of every input in the batch are produced with
the transaction and the inputs are acked with it, then it commits. Crash semantics:

1. a crash before the commit request: the txn stays open, the coordinator aborts it at
   its timeout, its outputs are never delivered and its acks are undone (ABORT marks),
   so the inputs are redelivered to whoever owns their partitions then;
2. a crash after the commit request: the coordinator finishes the commit (it is logged);
   the outputs become visible and the acks apply, so the inputs are not seen again;
3. in both cases each input's output is visible exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from txnstream.client import Client
from txnstream.consumer import Message
from txnstream.errors import TransactionOutcomeUnknownError, TxnStreamError

__all__ = ["ExactlyOnceProcessor", "ProcessorStats"]

log = logging.getLogger(__name__)

Output = bytes | tuple[bytes | None, bytes]
Function = Callable[[Message], Iterable[Output] | Output | None]


@dataclass
class ProcessorStats:
    """What a run did."""

    batches: int = 0
    inputs: int = 0
    outputs: int = 0
    aborted_batches: int = 0


class ExactlyOnceProcessor:
    """Reads ``inputs`` as ``subscription``, writes ``fn``'s results to ``output``."""

    def __init__(self, client: Client, inputs: str | Sequence[str], subscription: str,
                 output: str, fn: Function, batch_size: int = 100,
                 batch_interval_s: float = 0.5, txn_timeout_s: float = 30.0,
                 cumulative: bool = False, **consumer_options: object) -> None:
        self.client = client
        self.fn = fn
        self.batch_size = batch_size
        self.batch_interval_s = batch_interval_s
        self.txn_timeout_s = txn_timeout_s
        self.cumulative = cumulative
        """Ack a batch with one cumulative ack per partition (its last input) instead
        of one individual ack per input, where that covers only this batch's inputs
        (not inputs redelivered after an abort and not processed yet)."""
        self.consumer = client.subscribe(inputs, subscription=subscription,
                                         **consumer_options)
        self.producer = client.create_producer(output)
        self.stats = ProcessorStats()

    def _emit(self, result: Iterable[Output] | Output | None, txn: object) -> int:
        if result is None:
            return 0
        items = [result] if isinstance(result, (bytes, tuple)) else list(result)
        for item in items:
            key, value = item if isinstance(item, tuple) else (None, item)
            self.producer.send(value, key=key, txn=txn)  # type: ignore[arg-type]
        return len(items)

    def run_batch(self) -> int:
        """Process one batch in one transaction; returns the inputs it committed."""
        txn = None
        n = outs = 0
        last: dict[tuple[str, int], Message] = {}
        batch: dict[tuple[str, int], dict[int, Message]] = {}
        deadline = time.monotonic() + self.batch_interval_s
        try:
            while n < self.batch_size:
                left = deadline - time.monotonic()
                msg = self.consumer.receive(timeout_s=max(left, 0.01) if txn else 0.5)
                if msg is None:
                    if txn is None or time.monotonic() >= deadline:
                        break
                    continue
                if txn is None:
                    txn = self.client.new_transaction(timeout_s=self.txn_timeout_s)
                    deadline = time.monotonic() + self.batch_interval_s
                outs += self._emit(self.fn(msg), txn)
                if self.cumulative:
                    last[(msg.topic, msg.partition)] = msg
                    batch.setdefault((msg.topic, msg.partition), {})[msg.offset] = msg
                else:
                    self.consumer.acknowledge(msg, txn=txn)
                n += 1
            if txn is None:
                return 0
            for (topic, part), msg in last.items():
                mine = batch[(topic, part)]
                if set(self.consumer.cumulative_coverage(msg)) <= mine.keys():
                    self.consumer.acknowledge_cumulative(msg, txn=txn)
                else:  # it would also ack inputs redelivered but not processed here
                    for m in mine.values():
                        self.consumer.acknowledge(m, txn=txn)
            txn.commit()
        except TransactionOutcomeUnknownError as exc:
            # Not aborted: its acks hold the inputs until the coordinator's outcome
            # reaches the consumer (redelivered only if it aborted), so nothing is redone.
            log.warning("batch of %d: commit outcome unknown (%s)", n, exc)
            return 0
        except TxnStreamError as exc:
            log.warning("batch of %d aborted: %s", n, exc)
            self.stats.aborted_batches += 1
            if txn is not None and txn.status.value == "OPEN":
                try:
                    txn.abort()
                except TxnStreamError:
                    pass  # it times out at the coordinator anyway
            return 0
        self.stats.batches += 1
        self.stats.inputs += n
        self.stats.outputs += outs
        return n

    def run(self, max_idle_s: float | None = None, stop: Callable[[], bool] | None = None
            ) -> ProcessorStats:
        """Batches until ``stop()`` or ``max_idle_s`` without input."""
        idle_since = time.monotonic()
        while not (stop and stop()):
            if self.run_batch():
                idle_since = time.monotonic()
            elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                break
        return self.stats

    def close(self) -> None:
        """Leave the group and flush."""
        self.consumer.close()
        self.producer.flush()
