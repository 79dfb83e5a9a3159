"""The workers' key: what signs markers and endpoints and makes records members of txns.

Every worker of a deployment holds the same **root key**, from one of:

1. a key file (``Config.workers_key_file``, ``TXNSTREAM_WORKERS_KEY_FILE``): 32 random
   bytes as hex (:func:`generate_key_file` writes one). The root key is random, so no
   record written with it can be used to guess it;
2. else the workers' line secret (``tc_secret``), stretched by scrypt
   (:func:`~txnstream.membership.workers_root_key`), and refused when weak
   (:func:`check_secret_strength`): a guess costs tens of milliseconds, and there are
   too many to try.

Each purpose has its own subkey (HKDF, RFC 5869): the marker key (``txn.mac`` of
markers and endpoint records) and the membership key (:mod:`txnstream.membership`).
Neither is the line's secret, so a reader of a data topic holds nothing that speaks
on the line.

Markers written before this version were tagged with one HMAC of the secret (version
1); a buffer owner still accepts that tag on records it judges by the old rules
(below :attr:`~txnstream.buffer.TransactionBuffer.legacy_until`), never after.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from txnstream.config import Config
from txnstream.errors import ConfigError
from txnstream.markers import MarkerSigner
from txnstream.membership import workers_root_key

__all__ = ["KEY_BYTES", "MIN_SECRET_CHARS", "check_secret_strength", "generate_key_file",
           "load_key_file", "root_key", "workers_signer"]

KEY_BYTES = 32
"""A root key: 256 random bits."""
MIN_SECRET_CHARS = 16
MIN_DISTINCT_CHARS = 8
"""A workers' secret used as key material has at least this many characters, and this
many different ones: ``Summer2026!`` (found in 13,135 guesses from one marker when
markers were one HMAC of it) is refused."""


def check_secret_strength(secret: str, what: str) -> None:
    """``ConfigError`` naming ``what`` if ``secret`` is too weak to derive keys from."""
    if len(secret) < MIN_SECRET_CHARS or len(set(secret)) < MIN_DISTINCT_CHARS:
        raise ConfigError(
            f"{what} is too weak to derive the workers' keys from: it needs at least "
            f"{MIN_SECRET_CHARS} characters, {MIN_DISTINCT_CHARS} of them different. "
            "Give the workers a key file instead (32 random bytes as hex, e.g. "
            "`python -c 'import secrets; print(secrets.token_hex(32))' > FILE`, mode 0600, "
            "then TXNSTREAM_WORKERS_KEY_FILE=FILE), or a longer random secret.")


def load_key_file(path: str | os.PathLike[str]) -> bytes:
    """The root key in ``path`` (hex); ``ConfigError`` naming the file, never its text."""
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"workers' key file {path}: cannot read it: "
                          f"{exc.strerror or exc}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"workers' key file {path}: not a hex key (it holds 32 random "
                          "bytes as hex)") from None
    if len(key) < KEY_BYTES:
        raise ConfigError(f"workers' key file {path}: {len(key)} bytes, at least "
                          f"{KEY_BYTES} needed (32 random bytes as hex)")
    return key


def generate_key_file(path: str | os.PathLike[str]) -> bool:
    """Write a new random key to ``path`` (mode 0600) unless a file is there.

    Whether it wrote one. Made with ``O_EXCL``, so two processes starting at once
    cannot both write (the loser reads the winner's).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(KEY_BYTES) + "\n")
    return True


def root_key(config: Config) -> bytes | None:
    """The workers' root key from ``config`` (None: neither a key file nor a secret)."""
    if config.workers_key_file:
        return load_key_file(config.workers_key_file)
    if config.tc_secret:
        check_secret_strength(config.tc_secret, "the workers' secret (tc_secret)")
        return workers_root_key(config.tc_secret)
    return None


def workers_signer(config: Config, cluster_id: str) -> MarkerSigner | None:
    """The workers' :class:`MarkerSigner` on Kafka cluster ``cluster_id`` (None: no key).

    With the version-1 marker key of ``tc_secret`` beside it when there is a secret,
    for markers judged by the old rules.
    """
    root = root_key(config)
    if root is None:
        return None
    return MarkerSigner.from_root(root, cluster_id, config.tc_secret)
