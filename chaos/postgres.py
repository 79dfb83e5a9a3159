"""A real PostgreSQL server (tests, chaos harness): a fresh cluster per server, on a free port.

Binaries, in order: ``$TXNSTREAM_TEST_PG_BIN`` (a folder holding ``postgres`` and
``initdb``); ``postgres`` and ``initdb`` side by side on PATH; the newest
``/usr/lib/postgresql/*/bin`` (Debian's layout); Debian's packages unpacked into
``.txnstream/tools/postgres`` by ``tools/fetch-postgres`` (``make test`` runs it; their
libraries are found through ``LD_LIBRARY_PATH``).

PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres`` run as the system
user :data:`OS_USER` (created with ``useradd --system`` when missing), which owns the
cluster's folder; as anyone else they run as the caller. The cluster lives in a short
``mkdtemp`` folder of its own (pytest's ``/tmp/pytest-of-root`` is closed to other users,
and a Unix socket's path is limited to 107 bytes), removed by :meth:`PostgresServer.close`;
the server's log goes to the test's ``tmp_path`` and stays there.

Authentication is ``trust`` (local socket and 127.0.0.1): the DSN names the superuser
:data:`DB_USER` and no password. ``max_prepared_transactions`` is on (20), for
``PREPARE TRANSACTION``. :meth:`PostgresServer.kill9` kills the postmaster and every
backend at once (a crash: no shutdown checkpoint), :meth:`PostgresServer.start` starts the
same cluster again (crash recovery replays the WAL).

The tests' ``postgres`` fixture (``tests/postgres.py``) and the chaos harness's
two-phase writers (:mod:`chaos.twophase`) both run one. psycopg and psutil are imported
only when a server is used.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".txnstream" / "tools" / "postgres"
"""Where ``tools/fetch-postgres`` unpacks Debian's packages."""
BIN_ENV = "TXNSTREAM_TEST_PG_BIN"
OS_USER = "txnstream-pg"
"""The unprivileged system user the server runs as when the tests run as root."""
DB_USER = "txnstream"
"""The cluster's superuser (``initdb -U``), whatever OS user runs it."""
DEFAULT_DB = "txnstream_test"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PgBinaries:
    """Where the server's binaries are, and what their processes need."""

    bindir: Path
    env: dict[str, str]
    """What their processes need in the environment besides the caller's (the cached
    tree's ``LD_LIBRARY_PATH``)."""

    @property
    def postgres(self) -> str:
        """The server binary."""
        return str(self.bindir / "postgres")

    @property
    def initdb(self) -> str:
        """The cluster-creating binary."""
        return str(self.bindir / "initdb")


def _has_server(d: Path) -> bool:
    return (d / "postgres").is_file() and os.access(d / "postgres", os.X_OK) \
        and (d / "initdb").is_file() and os.access(d / "initdb", os.X_OK)


def _version_key(path: str) -> tuple[int, ...]:
    """``.../postgresql/15/bin`` -> (15,): the newest version first when sorted reversed."""
    m = re.search(r"/postgresql/([\d.]+)/bin$", path)
    return tuple(int(x) for x in m[1].split(".") if x) if m else ()


def _newest(pattern: str) -> Path | None:
    for d in sorted(glob.glob(pattern), key=_version_key, reverse=True):
        if _has_server(Path(d)):
            return Path(d)
    return None


def _binaries(bindir: Path) -> PgBinaries:
    """``bindir``'s, with the cached tree's libraries when it is that tree's."""
    if not bindir.resolve().is_relative_to(CACHE.resolve()):
        return PgBinaries(bindir, {})
    libs = [d for d in sorted(glob.glob(str(CACHE / "usr/lib/*-linux-gnu*")) +
                              glob.glob(str(CACHE / "lib/*-linux-gnu*")))
            if os.path.isdir(d)]
    old = os.environ.get("LD_LIBRARY_PATH")
    return PgBinaries(bindir, {"LD_LIBRARY_PATH": ":".join(libs + ([old] if old else []))})


def find_binaries() -> PgBinaries:
    """The server's binaries (module docstring, in order); RuntimeError if none."""
    given = os.environ.get(BIN_ENV)
    if given:
        if not _has_server(Path(given)):
            raise RuntimeError(f"${BIN_ENV}={given} holds no executable postgres and initdb")
        return _binaries(Path(given))
    on_path = shutil.which("postgres")
    if on_path:
        d = Path(os.path.realpath(on_path)).parent
        if _has_server(d):
            return _binaries(d)
    found = _newest("/usr/lib/postgresql/*/bin") or \
        _newest(str(CACHE / "usr/lib/postgresql/*/bin"))
    if found:
        return _binaries(found)
    raise RuntimeError("no PostgreSQL server binaries (postgres, initdb): run tools/fetch-postgres "
                "(`make test` does; it unpacks Debian's packages into .txnstream/tools)")


def _server_user() -> pwd.struct_passwd | None:
    """As root, :data:`OS_USER` (created when missing); else None (run as the caller)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(OS_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    res = subprocess.run([useradd, "--system", "--user-group", "--no-create-home",
                          "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                          OS_USER], capture_output=True, text=True)
    try:  # another pytest-xdist worker may have made it meanwhile: exit 9, and it exists
        return pwd.getpwnam(OS_USER)
    except KeyError:
        raise RuntimeError(f"PostgreSQL refuses to run as root, and `useradd --system "
                           f"{OS_USER}` failed (exit {res.returncode}): {res.stderr.strip()}"
                           ) from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_LIVE: set[PostgresServer] = set()


@atexit.register
def _stop_leftovers() -> None:  # an interrupted run: no server outlives it
    for server in list(_LIVE):
        try:
            server.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class PostgresServer:
    """One PostgreSQL cluster (``initdb`` at the first :meth:`start`) and its server.

    ``dsn`` names database ``db``, created at the first start. ``pid`` is the postmaster's
    (None while stopped). ``settings`` are extra ``-c name=value`` server settings.
    """

    def __init__(self, log_dir: Path, *, db: str = DEFAULT_DB,
                 max_prepared_transactions: int = 20,
                 settings: dict[str, str] | None = None) -> None:
        self.binaries = find_binaries()
        self.user = _server_user()
        self.db = db
        self.port = _free_port()
        self.log_path = Path(log_dir) / "postgres.log"
        self.settings = {"listen_addresses": "127.0.0.1", "fsync": "on",
                         "max_prepared_transactions": str(max_prepared_transactions),
                         "max_connections": "40", "shared_buffers": "32MB", "jit": "off",
                         "huge_pages": "off", **(settings or {})}
        self.base = Path(tempfile.mkdtemp(prefix="txnstream-pg-"))
        self.data_dir = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.socket_dir.mkdir()
        if self.user is not None:
            for d in (self.base, self.socket_dir):
                os.chown(d, self.user.pw_uid, self.user.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None
        self._initialized = False
        self._db_created = False
        _LIVE.add(self)

    @property
    def dsn(self) -> str:
        """A libpq URL of :attr:`db` on 127.0.0.1, as the superuser (trust)."""
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{self.db}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, or None while stopped."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def connect(self, **kwargs: Any) -> Any:
        """A psycopg connection to ``dsn`` (``autocommit=True`` etc. as keywords)."""
        import psycopg

        kwargs.setdefault("connect_timeout", 5)
        return psycopg.connect(self.dsn, **kwargs)

    # ------------------------------------------------------------ processes

    def _popen(self, argv: list[str], log: Any) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(self.binaries.env, LC_ALL="C", LANG="C", HOME=str(self.base))
        as_user: dict[str, Any] = {}
        if self.user is not None:
            as_user = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        try:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.base, start_new_session=True, **as_user)
        except PermissionError as exc:
            raise RuntimeError(
                f"cannot run {argv[0]}{f' as {OS_USER}' if self.user else ''}: {exc} (as "
                "root, the binaries' folders must be open to other users: a checkout under "
                "a private home cannot serve .txnstream/tools; install PostgreSQL instead)"
            ) from exc

    def _initdb(self) -> None:
        with self.log_path.open("ab") as log:
            proc = self._popen([self.binaries.initdb, "-D", str(self.data_dir), "-U", DB_USER,
                                "--auth=trust", "--encoding=UTF8", "--no-locale",
                                "--no-sync", "--no-instructions"], log)
            if proc.wait(START_TIMEOUT_S * 2) != 0:
                raise RuntimeError(f"initdb failed (exit {proc.returncode}):\n{self.log_tail()}")
        self._initialized = True

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the server; return once it accepts connections.

        ``initdb`` runs first, the first time. On a failure or timeout: RuntimeError
        with the log's tail.
        """
        if self.pid is not None:
            return
        if not self._initialized:
            self._initdb()
        argv = [self.binaries.postgres, "-D", str(self.data_dir), "-p", str(self.port),
                "-k", str(self.socket_dir)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as log:
            self.proc = self._popen(argv, log)
        try:
            self._wait_ready(timeout_s, "postgres")
            if not self._db_created:
                with self.connect(dbname="postgres", autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{self.db}"')
                self._db_created = True
        except BaseException:
            self._kill_all()
            raise

    def _wait_ready(self, timeout_s: float, db: str) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                with self.connect(dbname=db, connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres not accepting connections after "
                                       f"{timeout_s:g} s ({exc}):\n{self.log_tail()}") from exc
                time.sleep(0.1)

    def _processes(self) -> list[Any]:
        """The postmaster and its children (backends, checkpointer...), as psutil sees them."""
        import psutil

        if self.pid is None:
            return []
        try:
            post = psutil.Process(self.pid)
            return [post, *post.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _kill_all(self) -> None:
        """SIGKILL the postmaster and every child at once; wait until all are gone."""
        import psutil

        procs = self._processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in procs[1:]:  # children belong to init now: a zombie has let go of the shm
            while time.monotonic() < deadline:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.05)

    def kill9(self) -> None:
        """Crash the server: SIGKILL to the postmaster and all its processes at once.

        No shutdown checkpoint: the next :meth:`start` runs crash recovery.
        """
        assert self.pid is not None, "kill9: the server is not running"
        self._kill_all()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Fast shutdown (SIGINT: backends end, a checkpoint), SIGKILL after ``timeout_s``."""
        if self.pid is None:
            return
        assert self.proc is not None
        children = self._processes()[1:]
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_all()
            return
        import psutil

        for p in children:  # any left after a clean exit (there should be none)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def close(self) -> None:
        """Stop the server and remove the cluster's folder (the log stays)."""
        try:
            self.stop()
        finally:
            _LIVE.discard(self)
            shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_postgres(log_dir: Path, **kwargs: Any) -> PostgresServer:
    """A started server (:class:`PostgresServer` keywords); the caller closes it.

    Or use it as a context manager: ``with start_postgres(tmp_path) as pg: ... pg.dsn``.
    """
    server = PostgresServer(log_dir, **kwargs)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server
