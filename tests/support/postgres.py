"""A PostgreSQL cluster of the tests' own: ``initdb`` in a directory, on a free port.

High-availability tests stop, kill and restart PostgreSQL under a running broker, so
they cannot use a shared server (the system one at 5432 may be someone else's).
``PgCluster`` makes one with ``initdb`` (trust authentication, local and host), starts
and stops it with ``pg_ctl``; ``url(db)`` is what ``EMQ_JOURNAL_URL`` takes.

initdb and pg_ctl refuse to run as root: as root they run as the ``postgres`` user
(``runuser -u postgres --``), in a directory that user owns. pytest's temporary
directories are private to root (mode 0700), so a cluster whose ``base_dir`` the
``postgres`` user cannot reach keeps its data in a directory of its own under the
system's temporary directory instead (removed by ``destroy()``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_tcp_port

PG_BIN = Path(os.environ.get("EMQ_TEST_PG_BIN", "/usr/local/bin"))
PG_USER = "postgres"


def pg_available() -> str | None:
    """Why a cluster of our own cannot be made here (None: it can)."""
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        return f"no initdb/pg_ctl in {PG_BIN} (set EMQ_TEST_PG_BIN)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser"
    return None


class PgCluster:
    """One PostgreSQL cluster (a postmaster and its data directory)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int | None = None,
        conf: dict[str, str] | None = None,
    ) -> None:
        """``host``: the address it listens on (one address, or ``*``); ``conf``:
        further postgresql.conf settings (``{"fsync": "off"}``)."""
        self.base_dir = Path(base_dir)
        self.host = host
        self.port = port or free_tcp_port()
        self.conf = dict(conf or {})
        self._as_root = os.geteuid() == 0
        self._own_dir: Path | None = None
        self.root = self._reachable_root()
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.sockets = self.root / "sockets"

    # ---- setting up ------------------------------------------------------------

    def _reachable_root(self) -> Path:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        root = self.base_dir / "pg"
        if not self._as_root:
            return root
        root.mkdir(exist_ok=True)
        shutil.chown(root, PG_USER, PG_USER)
        probe = subprocess.run(["runuser", "-u", PG_USER, "--", "test", "-w", str(root)])
        if probe.returncode == 0:
            return root
        self._own_dir = Path(tempfile.mkdtemp(prefix="emq-pgcluster-"))
        os.chmod(self._own_dir, 0o755)
        shutil.chown(self._own_dir, PG_USER, PG_USER)
        return self._own_dir

    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout + done.stderr

    def init(self) -> None:
        """``initdb`` with trust authentication, then this cluster's settings."""
        if (self.data / "PG_VERSION").exists():
            return
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(self.sockets, PG_USER, PG_USER)
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "--no-sync")
        settings = {
            "listen_addresses": f"'{self.host}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockets}'",
            "max_connections": "200",
            "logging_collector": "off",
            **self.conf,
        }
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n# tests/support/postgres.py\n")
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        with (self.data / "pg_hba.conf").open("w") as f:
            f.write(
                "local all all trust\nhost all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n"
                "local replication all trust\nhost replication all 0.0.0.0/0 trust\n"
            )

    # ---- running ---------------------------------------------------------------

    def start(self) -> None:
        """Start (initdb first if needed) and wait until it accepts connections."""
        self.init()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate|smart``; nothing if it is not running."""
        if self.postmaster_pid() is None:
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (a crash: a restart recovers)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        try:  # pg_ctl starts the postmaster in a session of its own: its group is its
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        (self.data / "postmaster.pid").unlink(missing_ok=True)

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (None: not running)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def alive(self) -> bool:
        """Whether it accepts a connection now."""
        import psycopg

        try:
            psycopg.connect(self.url("postgres"), connect_timeout=2).close()
        except psycopg.Error:
            return False
        return True

    def destroy(self) -> None:
        """Stop it and remove its files."""
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            self.kill()
        shutil.rmtree(self._own_dir or self.root, ignore_errors=True)

    # ---- connecting --------------------------------------------------------------

    @property
    def connect_host(self) -> str:
        return "127.0.0.1" if self.host in ("*", "0.0.0.0") else self.host

    def url(self, db: str = "emq", host: str | None = None) -> str:
        """``host``: the address to reach it by (default: the one it listens on, or
        127.0.0.1 when it listens on every address)."""
        host = host or self.connect_host
        if ":" in host:
            host = f"[{host}]"
        return f"postgresql://{PG_USER}@{host}:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def execute(self, sql: str, params: Any = None, db: str = "postgres") -> list[Any]:
        """One statement in autocommit; its rows, if any."""
        import psycopg

        with psycopg.connect(self.url(db), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


# ---- fixtures (registered in tests/conftest.py as a plugin) ----------------------


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    """A PostgreSQL cluster for the session (skips when none can be made here).
    A test that stops or kills it must start it again: ``pg_url`` checks."""
    why = pg_available()
    if why:
        pytest.skip(f"no PostgreSQL cluster of our own: {why}")
    cluster = PgCluster(tmp_path_factory.mktemp("pgcluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.destroy()


_databases = iter(range(1, 1 << 30))


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh database in ``pg_cluster`` for this test; dropped after it."""
    if not pg_cluster.alive():  # a previous test left it stopped
        pg_cluster.start()
    name = f"emq_test_{os.getpid()}_{next(_databases)}"
    url = pg_cluster.create_database(name)
    yield url
    if not pg_cluster.alive():
        pg_cluster.start()
    pg_cluster.drop_database(name)
