"""Transaction buffer: committed-only visibility of a partition (Pulsar's TB)."""

from txnstream.buffer.snapshot import TransactionBufferSnapshot, restore, take_snapshot
from txnstream.buffer.transaction_buffer import BufferStats, TransactionBuffer, Verdict

__all__ = ["TransactionBuffer", "TransactionBufferSnapshot", "BufferStats", "Verdict",
           "take_snapshot", "restore"]
