"""The workers' key: what signs markers and endpoints and makes records members of txns.

Every worker of a deployment holds the same **root key**, from one of:

1. a key file (``Config.workers_key_file``, ``--workers-key-file``,
   ``TXNSTREAM_WORKERS_KEY_FILE``): 32 random bytes as hex, made by
   :func:`generate_key_file` (``txnstream keygen``). The root key is random, so no record
   written with it can be used to guess it;
2. else the workers' line secret (``tc_secret``), stretched by scrypt
   (:func:`~txnstream.membership.workers_root_key`), and refused when weak
   (:func:`check_secret_strength`): a guess costs tens of milliseconds, and there are
   too many to try;
3. else the default key file, :func:`default_key_path` (``txnstream init`` and
   ``txnstream cluster up`` make it if there is none), whatever authenticates the line
   (mutual TLS included).

A worker with none of them refuses to start (:func:`worker_config`) unless it is told to
run unsigned (``--unsigned``, ``WorkerSettings(unsigned=True)``), and then says so.

Each purpose has its own subkey (HKDF, RFC 5869): the marker key (``txn.mac`` of
markers and endpoint records) and the membership key (:mod:`txnstream.membership`).
Neither is the line's secret, so a reader of a data topic holds nothing that speaks
on the line.

Markers written before this version were tagged with one HMAC of the secret (version
1); a buffer owner still accepts that tag on records it judges by the old rules
(below :attr:`~txnstream.buffer.TransactionBuffer.legacy_until`), never after.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from txnstream.config import Config
from txnstream.errors import ConfigError
from txnstream.markers import MarkerSigner
from txnstream.membership import workers_root_key

__all__ = ["KEY_BYTES", "MIN_SECRET_CHARS", "check_secret_strength", "default_key_path",
           "ensure_default_key", "generate_key_file", "load_key_file", "root_key",
           "warn_unsigned", "worker_config", "workers_signer"]

KEY_BYTES = 32
"""A root key: 256 random bits."""
HOME_ENV = "TXNSTREAM_HOME"
KEY_FILE_NAME = "workers.key"
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
            "Give the workers a key file instead (`txnstream keygen FILE`, then "
            "--workers-key-file FILE), or a longer random secret.")


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
    """The workers' root key of ``config`` (None: none).

    Its key file, else its secret, else the default key file if there is one.
    """
    if config.workers_key_file:
        return load_key_file(config.workers_key_file)
    if config.tc_secret:
        check_secret_strength(config.tc_secret, "the workers' secret (tc_secret)")
        return workers_root_key(config.tc_secret)
    default = default_key_path()
    return load_key_file(default) if default.exists() else None


def workers_signer(config: Config, cluster_id: str) -> MarkerSigner | None:
    """The workers' :class:`MarkerSigner` on Kafka cluster ``cluster_id`` (None: no key).

    With the version-1 marker key of ``tc_secret`` beside it when there is a secret,
    for markers judged by the old rules.
    """
    root = root_key(config)
    if root is None:
        return None
    return MarkerSigner.from_root(root, cluster_id, config.tc_secret)


def default_key_path() -> Path:
    """Where workers look for the key when given none (no key file, no secret).

    ``$TXNSTREAM_HOME/workers.key`` if ``TXNSTREAM_HOME`` is set, else
    ``~/.config/txnstream/workers.key``; read at each call, never at import.
    ``txnstream init``, ``txnstream cluster up`` and ``txnstream keygen`` make it.
    """
    home = os.environ.get(HOME_ENV)
    base = Path(home).expanduser() if home else Path.home() / ".config" / "txnstream"
    return base / KEY_FILE_NAME


def worker_config(config: Config, unsigned: bool) -> Config:
    """The config a worker runs with: its key found and checked before anything starts.

    ``config`` itself when it names a key file or a secret, or when ``unsigned`` (no
    key is used then, whatever is configured); else ``config`` with the default key
    file (:func:`default_key_path`) named, so that both roles (the buffer role may run
    in a child process) use the same. ``ConfigError`` if there is no key and not
    ``unsigned`` (naming how to get one and ``--unsigned``), if the key file cannot be
    read or holds no key (naming it), or if the secret is too weak.
    """
    if unsigned:
        return config
    if not config.has_workers_key:
        path = default_key_path()
        if not path.exists():
            raise ConfigError(
                "this worker has no workers' key, so its markers could not be signed nor "
                "records' membership of txns checked: any producer that may write a data "
                "topic could forge them. Make one with `txnstream keygen` (it writes "
                f"{path}, where a worker given no key looks; `txnstream init` makes it "
                "too) and give every worker of the deployment the same file "
                "(--workers-key-file FILE or TXNSTREAM_WORKERS_KEY_FILE), or pass "
                "--unsigned (WorkerSettings(unsigned=True)) to run without signed markers")
        config = config.with_(workers_key_file=str(path))
    root_key(config)
    return config


def warn_unsigned(log: logging.Logger, who: str) -> None:
    """Log, at the start of a worker run with ``unsigned``, what that costs."""
    log.warning("%s: running unsigned (--unsigned): markers are not signed and records' "
                "membership of txns is not checked, so any producer that may write a data "
                "topic can forge markers and end or block txns (docs/security.md)", who)


def ensure_default_key(config: Config) -> str:
    """What ``txnstream init`` and ``cluster up`` do for the key, as one line to print.

    With no key file configured and no secret, make the default key file if there is
    none. A configured key file is never made here (``txnstream keygen FILE`` does it):
    a mistyped path would otherwise become a second key.
    """
    if config.workers_key_file:
        path = Path(config.workers_key_file)
        if path.exists():
            return f"workers' key: {path}"
        return (f"workers' key: {path} (--workers-key-file or TXNSTREAM_WORKERS_KEY_FILE) "
                f"does not exist: make it with `txnstream keygen {path}`")
    if config.tc_secret:
        return "workers' key: from the workers' secret (tc_secret)"
    path = default_key_path()
    try:
        made = generate_key_file(path)
    except OSError as exc:  # e.g. a container user without a home: init still did its part
        return (f"workers' key: cannot make {path} ({exc.strerror or exc}): make one with "
                "`txnstream keygen FILE` and give every worker --workers-key-file FILE")
    if made:
        return (f"workers' key: made {path} (mode 0600); every worker of this deployment "
                "needs this same file")
    return f"workers' key: {path}"
