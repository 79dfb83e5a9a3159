"""What each process believes happened: one append-only JSON-lines file per process.

Every role process appends its events to its own file, flushed and fsynced before it
moves on, so a kill -9 right after an event leaves the event on disk (and at worst one
torn last line, which the reader skips). The checker joins all files by TxnID.

Events (field ``e``):

- ``open``: ``txn`` was issued to this process (``by`` = writer, ``timeout``).
- ``sent``: records of ``txn`` whose sends this process saw acknowledged
  (``txn.flush()`` passed): ``recs`` = ``[[id, topic, partition, writer, seq], ...]``;
  ``late`` if sent after the opener's commit returned (item 7's probe); ``foreign`` if
  the opener sent them after its peer committed the txn (their ``commit()`` answers for
  them), ``unsure`` too if that ``commit()`` raised another error than
  ``RecordsExcludedError`` (their fate is unknown); processors add ``pairs`` =
  ``[[output id, input id], ...]``.
- ``excluded``: the writer ``by`` was told (``RecordsExcludedError``) that its records
  of ``txn`` at ``at`` = ``[[topic, partition, offset], ...]`` are out of it (they
  landed after its first marker; readers drop them); ``how``: ``foreign`` (the opener's
  commit), ``late`` (the peer's flush) or ``cocommit`` (the peer's commit). Its other
  records of the txn are in.
- ``late_rejected``: a late send was refused with an error (what Pulsar does); ``rec``
  if the send was handed over before the error (its fate is unknown).
- ``end``: the opener's outcome for ``txn``: ``want`` (commit/abort/abandon/slow/late/
  foreign), ``outcome`` (committed/aborted/unknown), the client's ``status`` and the
  ``error``; the peer logs one too for a txn it committed (``want`` ``cocommit``).
- ``cocommit_refused``: the peer could not attach to the txn it was asked to commit.
- ``recv``: records a committed-only consumer received: ``recs`` = ``[[id, topic,
  partition, offset, txn], ...]``.
- ``admin_abort``: the harness aborted ``txn`` through ``client.admin`` (``status``).
- ``regress`` / ``dup_in_batch``: a processor got an offset at or below one it had got
  before (redelivery) / the same message twice in one batch (the second dropped; one
  an earlier batch of the checkpoint took comes again after an abort: processed);
  counted, not judged.

Record values are JSON: ``{"id", "txn", "w" (writer), "p" (partition), "s" (per writer
and partition sequence), ...}``; processor outputs add ``"in"`` (the input's id).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["TruthLog", "read_events", "encode_value", "decode_value"]


class TruthLog:
    """Appends events to one file; thread-safe; each event durable before it returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any], sync: bool = True) -> None:
        """Append ``event`` as one line; fsync unless ``sync`` is False."""
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            if sync:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            os.close(self._fd)


def read_events(truth_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every event of every file in ``truth_dir`` as ``(file stem, event)``.

    A torn line (the process was killed mid-write) is skipped.
    """
    for f in sorted(truth_dir.glob("*.jsonl")):
        with f.open("rb") as fh:
            for raw in fh:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    yield f.stem, ev


def encode_value(fields: dict[str, Any]) -> bytes:
    """A record value."""
    return json.dumps(fields, separators=(",", ":")).encode()


def decode_value(value: bytes | None) -> dict[str, Any] | None:
    """A record value, or None if it is not one of ours."""
    if not value:
        return None
    try:
        v = json.loads(value)
    except ValueError:
        return None
    return v if isinstance(v, dict) and "id" in v else None
