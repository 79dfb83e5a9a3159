"""The chaos cluster's line credentials: one principal per role, as a deployment would.

Every run authenticates the coordinator line (docs/security.md): the workers hold a
users file, each role process proves its own principal's secret, the harness's monitor
is an admin. The workers share a workers' key file (``txnstream keygen``'s), as a
deployment's do: it signs their markers, and the checker verifies them with it. The
hostile profile adds a ``stranger``: a principal with valid credentials that owns none
of the honest txns, and clients with none at all; and the flood's principals: the
``flooder`` (valid credentials, floods and evicts) and ``groups``, an honest principal
whose group outcomes the flooder tries to evict (:mod:`chaos.roles.flooder`). No
principal is named ``anonymous``: a users file naming it is refused (the flooder tries
that name with a secret of its own, which no worker knows).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from txnstream import Config
from txnstream.workers_key import generate_key_file

__all__ = ["Credentials", "WORKER", "HARNESS", "STRANGER", "FLOODER", "GROUPS", "TWOPHASE"]

WORKER = "chaos-worker"
HARNESS = "chaos-harness"
STRANGER = "chaos-stranger"
FLOODER = "chaos-flooder"
GROUPS = "chaos-groups"
TWOPHASE = "chaos-twophase"
ROLE_PRINCIPALS = ("chaos-producer", "chaos-processor", "chaos-consumer", TWOPHASE)
"""Producers share one principal: each co-writes into its peer's txns (attach by
principal). Processors, consumers and the two-phase writers have their own (the writers'
recovery completes every prepared txn its principal may see)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Secret files (mode 0600) of every principal and the workers' users file."""

    directory: Path
    secrets: dict[str, str]

    @classmethod
    def create(cls, directory: Path) -> Credentials:
        """New random secrets for every principal, written to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        made = {p: secrets.token_urlsafe(32)
                for p in (WORKER, HARNESS, STRANGER, FLOODER, GROUPS, *ROLE_PRINCIPALS)}
        creds = cls(directory, made)
        for principal, secret in made.items():
            _write_private(creds.secret_file(principal), secret + "\n")
        _write_private(creds.users_file, "".join(f"{p}={s}\n" for p, s in made.items()))
        generate_key_file(creds.workers_key_file)
        return creds

    def secret_file(self, principal: str) -> Path:
        """Where ``principal``'s secret is."""
        return self.directory / f"{principal}.secret"

    @property
    def workers_key_file(self) -> Path:
        """The workers' key (mode 0600)."""
        return self.directory / "workers.key"

    @property
    def users_file(self) -> Path:
        """The workers' ``principal=secret`` file."""
        return self.directory / "tc-users"

    def env(self, principal: str) -> dict[str, str]:
        """The environment of a role process acting as ``principal``."""
        return {"TXNSTREAM_TC_PRINCIPAL": principal,
                "TXNSTREAM_TC_SECRET_FILE": str(self.secret_file(principal)),
                "TXNSTREAM_TC_SECRET": ""}

    def worker_env(self) -> dict[str, str]:
        """A coordinator worker's environment: principal, users, admins, workers' key."""
        return self.env(WORKER) | {"TXNSTREAM_TC_USERS_FILE": str(self.users_file),
                                   "TXNSTREAM_TC_ADMINS": f"{WORKER},{HARNESS}",
                                   "TXNSTREAM_WORKERS_KEY_FILE": str(self.workers_key_file)}

    def config(self, base: Config, principal: str) -> Config:
        """``base`` acting as ``principal``."""
        return base.with_(tc_principal=principal, tc_secret=self.secrets[principal])


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
