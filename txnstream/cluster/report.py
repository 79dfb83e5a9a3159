"""How the local cluster tells a person what it is doing, without knowing who is watching.

The library reports through a :class:`Reporter`; the CLI passes one that drives a rich
spinner, tests pass one that records, and the default logs and prints notes to stderr.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol

__all__ = ["Reporter", "StderrReporter", "RecordingReporter"]

log = logging.getLogger("txnstream.cluster")


class Reporter(Protocol):
    """Receives progress from :class:`~txnstream.cluster.local.LocalCluster`."""

    def status(self, text: str) -> None:
        """What is happening now (a spinner's text); transient."""

    def note(self, text: str) -> None:
        """Something the user should read later: a repair made, where the logs are."""


class StderrReporter:
    """Default: status goes to the log at INFO, notes to stderr (and the log)."""

    def status(self, text: str) -> None:
        """Log the step."""
        log.info("%s", text)

    def note(self, text: str) -> None:
        """Print the note on stderr."""
        log.info("%s", text)
        print(f"txnstream cluster: {text}", file=sys.stderr, flush=True)


class RecordingReporter:
    """Keeps every status and note, in order (for tests and callers that render later)."""

    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.notes: list[str] = []

    def status(self, text: str) -> None:
        """Record the step."""
        self.statuses.append(text)

    def note(self, text: str) -> None:
        """Record the note."""
        self.notes.append(text)
