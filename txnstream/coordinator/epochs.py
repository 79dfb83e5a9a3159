"""``EpochFencedTable``: a TC's txns folded from its log under the EPOCH fencing rule.

Replay (:meth:`EpochFencedTable.replay`) takes every record of ``__txn_log[p]`` in offset
order and decides which are valid (DESIGN.md section 5); the valid ones fold into the
:class:`~txnstream.coordinator.txn_table.TxnMetaTable` it extends. The requests that
plan new records are the :class:`~txnstream.coordinator.metadata_store.TransactionMetadataStore`
built on it.

* **Fencing**: a *takeover* ``EPOCH`` (written by a new owner after its replay,
  ``epoch_offset`` -1) is always valid and becomes the current epoch; any other record
  is valid only if its ``epoch_offset`` equals the offset of the latest valid ``EPOCH``
  before it. Invalid records change nothing (they only raise the sequence floor, so a
  TxnID a zombie handed out can never be handed out again).
* **Epoch renewal**: the owner appends, before each checkpoint, a *renewal* ``EPOCH``
  naming its current epoch (:meth:`~EpochFencedTable.renewal_entry`). Valid by the rule
  above, it becomes the current epoch and the owner's records carry it from then on; a
  zombie's renewal names an epoch that is no longer current, so it is invalid and fences
  nobody. A renewal at the very start of the log (where a truncation left it) is taken
  as valid: only an owner that read it back as valid truncates there. Renewals let
  truncation pass the takeover EPOCH of a long-lived owner:
  :meth:`~EpochFencedTable.truncation_point` cuts at the EPOCH that governs the first
  record still needed, never between that EPOCH and the record.

Records the owner wrote come back through :meth:`~EpochFencedTable.replay` too; they carry
the owner's own epoch and were applied already, so only their offsets are noted.
"""

from __future__ import annotations

import bisect
import logging

from txnstream.coordinator.log_entry import LogEntryKind, TransactionLogEntry
from txnstream.coordinator.txn_table import TxnMetaTable
from txnstream.fencing import admits

__all__ = ["EpochFencedTable"]

log = logging.getLogger(__name__)


class EpochFencedTable(TxnMetaTable):
    """TC ``tc_id``'s txns as the valid records of its log leave them, for owner ``owner_id``."""

    def __init__(self, tc_id: int, owner_id: str = "") -> None:
        super().__init__(tc_id)
        self.owner_id = owner_id
        self.epoch_offset = -1
        self.epoch_owner: str | None = None
        self._own_epoch: int | None = None
        self._own_epochs: set[int] = set()
        self.fenced = False
        self.diverged = False
        """One of this owner's own records read back invalid: its memory holds what the
        log does not. Never expected (see :meth:`renewal_entry`); the owner must replay."""
        self._epochs: list[int] = []
        """Offsets of the valid EPOCH records since the log start (truncation points)."""
        self.checkpoint_offset = -1
        self.invalid_records = 0

    @property
    def own_epoch(self) -> int | None:
        """Offset of this owner's current EPOCH record, once read back.

        None while replaying. Moves to each renewal of the owner as it is read back.
        """
        return self._own_epoch

    @own_epoch.setter
    def own_epoch(self, offset: int | None) -> None:
        self._own_epoch = offset
        if offset is not None:
            self._own_epochs.add(offset)

    def is_valid(self, entry: TransactionLogEntry) -> bool:
        """The fencing rule for ``entry``.

        A takeover EPOCH is always valid; a renewal EPOCH or any other record only under
        the latest valid EPOCH (a renewal also at the log start, before any EPOCH).
        """
        if entry.kind is LogEntryKind.EPOCH and (entry.epoch_offset < 0 or self.epoch_offset < 0):
            return True
        return admits(entry.epoch_offset, self.epoch_offset)

    def replay(self, offset: int, entry: TransactionLogEntry,
               timestamp_ms: int | None = None) -> bool:
        """Fold one log record read at ``offset``; returns whether it was valid.

        ``timestamp_ms`` is the record's Kafka timestamp; it dates the end of a txn
        that finalizes here, for truncation retention after failover.

        Sets :attr:`fenced` when a valid EPOCH of someone else follows our own: the
        caller must stop serving this coordinator at once. Our own renewal moves
        :attr:`own_epoch` to it instead.
        """
        if entry.kind is LogEntryKind.EPOCH and self.is_valid(entry):
            if self.own_epoch is not None:
                if entry.epoch_offset >= 0 and entry.epoch_offset == self.own_epoch:
                    self.own_epoch = offset  # our renewal, read back
                elif offset != self.own_epoch:
                    self.fenced = True
            self.epoch_offset = offset
            self.epoch_owner = entry.owner_id
            self.next_sequence = max(self.next_sequence, entry.next_sequence)
            self._epochs.append(offset)
            return True
        if not self.is_valid(entry):
            self.invalid_records += 1
            if entry.epoch_offset in self._own_epochs:
                self.diverged = True
            if entry.txn_seq >= 0:
                self.next_sequence = max(self.next_sequence, entry.txn_seq + 1)
            log.warning("tc %d: ignoring record at offset %d with stale epoch %d (current %d)",
                        self.tc_id, offset, entry.epoch_offset, self.epoch_offset)
            return False
        own = self.own_epoch is not None and entry.epoch_offset == self.own_epoch
        if not own:
            self.apply(entry, timestamp_ms)
        self._note_offset(offset, entry)
        return True

    def _note_offset(self, offset: int, entry: TransactionLogEntry) -> None:
        if entry.kind is LogEntryKind.CHECKPOINT:
            self.checkpoint_offset = offset
        seqs = entry.group_seqs if entry.kind is LogEntryKind.GROUP_END else (entry.txn_seq,)
        for seq in seqs:
            meta = self.txns.get(seq)
            if meta is not None:
                if meta.first_offset is None:
                    meta.first_offset = offset
                meta.last_offset = offset

    def epoch_entry(self) -> TransactionLogEntry:
        """The takeover EPOCH record a new owner appends after replay."""
        return TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=-1,
                                   owner_id=self.owner_id, next_sequence=self.next_sequence)

    def renewal_entry(self) -> TransactionLogEntry:
        """An EPOCH renewing the owner's current epoch (see the module docstring).

        The owner appends it alone and reads it back before it writes anything else: a
        record it wrote under the old epoch that landed after the renewal would be
        invalid. Until the renewal is read back, :meth:`replay` keeps the old epoch.
        """
        assert self.own_epoch is not None and self.epoch_offset == self.own_epoch
        return TransactionLogEntry(kind=LogEntryKind.EPOCH, epoch_offset=self.epoch_offset,
                                   owner_id=self.owner_id, next_sequence=self.next_sequence)

    # ------------------------------------------------------------- truncation

    def truncation_point(self, now_ms: int, retention_ms: int) -> int:
        """The first log offset to keep; everything below may be deleted.

        Always the offset of a valid EPOCH record, so a replay from there starts under
        an epoch.

        Needed: every record of a txn not final, or final for less than
        ``retention_ms`` (so a client retrying its commit still finds the outcome), and
        the latest CHECKPOINT; the point is the latest EPOCH at or before the first of
        them (their validity hangs on it, and on the renewals after it). Returns -1 when
        nothing may be deleted yet.
        """
        if self.checkpoint_offset < 0 or not self._epochs:
            return -1
        needed = self.checkpoint_offset
        for meta in self.txns.values():
            recent = meta.end_time_ms is None or now_ms - meta.end_time_ms < retention_ms
            if (not meta.status.is_final or recent) and meta.first_offset is not None:
                needed = min(needed, meta.first_offset)
        i = bisect.bisect_right(self._epochs, needed) - 1
        return self._epochs[i] if i >= 0 else -1

    def forget_before(self, offset: int) -> int:
        """Drop final txns whose records all lie below ``offset`` (after truncation)."""
        gone = [s for s, m in self.txns.items()
                if m.status.is_final and m.last_offset is not None and m.last_offset < offset]
        self.index.remove(self.txns[s] for s in gone)
        for s in gone:
            del self.txns[s]
        self._epochs = [e for e in self._epochs if e >= offset]
        return len(gone)
