"""``ExactlyOnceProcessor``: consume-transform-produce, exactly once (Pulsar Functions' case).

One transaction per batch: the outputs of every input in the batch are produced with
the transaction, then the inputs are acked with it in one pending-ack record per
partition (cumulative where the batch holds the partition's next records, as Kafka's
``send_offsets_to_transaction`` commits one offset per partition), then it commits.

Crash semantics:

1. a crash before the commit request: the txn stays open, the coordinator aborts it at
   its timeout, its outputs are never delivered and its acks are undone (ABORT marks),
   so the inputs are redelivered to whoever owns their partitions then;
2. a crash after the commit request: the coordinator finishes the commit (it is logged);
   the outputs become visible and the acks apply, so the inputs are not seen again;
3. in both cases each input's output is visible exactly once.

A batch that aborts while the process lives (its function's error, a send or an ack
refused, a conflict, the txn's timeout) gives every input it took back: those its txn
acked come back by the abort, those not acked yet by ``redeliver_unacknowledged``.
Without the latter they stayed delivered-and-unacked in the consumer, never delivered
again while it kept their partitions (their outputs went missing until a rebalance).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txnstream.client import Client
from txnstream.errors import TransactionOutcomeUnknownError, TxnStreamError
from txnstream.message import Message
from txnstream.types import TopicPartition, TxnStatus

if TYPE_CHECKING:
    from txnstream.transaction import Transaction

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
                 cumulative: bool = True, **consumer_options: Any) -> None:
        self.client = client
        self.fn = fn
        self.batch_size = batch_size
        self.batch_interval_s = batch_interval_s
        self.txn_timeout_s = txn_timeout_s
        self.cumulative = cumulative
        """Kept for compatibility (``txnstream process --cumulative``): every batch acks
        with one record per partition, cumulative wherever that acks exactly the
        batch's inputs (``Consumer.acknowledge_batch``)."""
        # Its txns live and die with its member: a takeover aborts a predecessor's at
        # once, so inputs come back in order after a crash (Kafka's initTransactions).
        consumer_options.setdefault("abort_predecessor_txns", True)
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
        txn: Transaction | None = None
        taken: list[Message] = []
        outs = 0
        seen: set[TopicPartition] = set()
        deadline = time.monotonic() + self.batch_interval_s
        try:
            while len(taken) < self.batch_size:
                left = deadline - time.monotonic()
                msg = self.consumer.receive(timeout_s=max(left, 0.01) if txn else 0.5)
                if msg is None:
                    if txn is None or time.monotonic() >= deadline:
                        break
                    continue
                taken.append(msg)  # from here on it is acked or given back
                if txn is None:
                    txn = self.client.new_transaction(timeout_s=self.txn_timeout_s)
                    deadline = time.monotonic() + self.batch_interval_s
                if msg.tp not in seen:  # its ack's registration, sent as the batch fills
                    seen.add(msg.tp)
                    self.consumer.prepare_acks([msg], txn)
                outs += self._emit(self.fn(msg), txn)
            if txn is None:
                self._give_back(None, taken)
                return 0
            self.consumer.acknowledge_batch(taken, txn=txn)
            txn.commit()
        except TransactionOutcomeUnknownError as exc:
            # Not aborted: its acks hold the inputs until the coordinator's outcome
            # reaches the consumer (redelivered only if it aborted), so nothing is redone.
            log.warning("batch of %d: commit outcome unknown (%s)", len(taken), exc)
            self.consumer.redeliver_unacknowledged(taken)  # none, unless not acked yet
            return 0
        except TxnStreamError as exc:
            log.warning("batch of %d aborted: %s", len(taken), exc)
            self.stats.aborted_batches += 1
            self._give_back(txn, taken)
            return 0
        except BaseException:
            self._give_back(txn, taken)
            raise
        self.stats.batches += 1
        self.stats.inputs += len(taken)
        self.stats.outputs += outs
        return len(taken)

    def _give_back(self, txn: Transaction | None, taken: list[Message]) -> None:
        """An aborted batch: end its txn, then every input it took comes back.

        1. abort the txn (if still OPEN): its acks are undone and the inputs it acked
           are redelivered (if the abort gets no answer, or the txn timed out, the
           coordinator's ABORT mark does that later);
        2. the inputs it took and never acked are redelivered now, in offset order.
        """
        if txn is not None and txn.status is TxnStatus.OPEN:
            try:
                txn.abort()
            except TxnStreamError:
                pass  # it times out at the coordinator anyway
        self.consumer.redeliver_unacknowledged(taken)

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
