"""Pending acks: transactional acknowledgement per subscription partition (Pulsar's TP)."""

from txnstream.pendingack.handle import AckEffect, PendingAckHandle, PendingAckStats
from txnstream.pendingack.records import PendingAckEntry, PendingAckKind

__all__ = ["PendingAckHandle", "AckEffect", "PendingAckStats", "PendingAckEntry",
           "PendingAckKind"]
