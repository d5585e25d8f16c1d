"""Shared fixtures: free loopback ports and `manage.py` commands run as subprocesses.

End-to-end tests start the real commands (`emq_broker`, `emq_jobmanager`, ...) with
`emq_processes.start(...)`; every process is stopped by its PID in teardown, and
when a test fails the tail of each process's log is added to its report.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# the emq_broker fixture, as an installed emq-django gives it (its pytest11 entry point)
pytest_plugins = ["emq_django.testing.pytest_plugin"]

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


# Test ports come from below the kernel's ephemeral range (32768-60999 here): a port
# the kernel hands out for bind(port 0) is also one it may give any outgoing
# connection as its source port, between our check and the broker's bind (seen:
# "cannot bind ...: Address already in use" with other sessions' tests running).
# Left out: the product's defaults and the benchmark peers' ports in this range.
TEST_PORTS = range(20000, 32000)
TAKEN_PORTS = frozenset({25672})  # RabbitMQ's inter-node port
_handed_out: set[int] = set()  # this run's, never handed out twice
_port_rng = random.Random(int.from_bytes(os.urandom(8), "big"))  # runs side by side differ


def free_tcp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct loopback ports free now, outside the ephemeral range, none handed
    out before in this run: each is checked with a bind (all held at once)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(100 * count):
            if len(sockets) == count:
                break
            if len(_handed_out) > len(TEST_PORTS) // 2:
                _handed_out.clear()  # a very long run: start over
            port = _port_rng.choice(TEST_PORTS)
            if port in _handed_out or port in TAKEN_PORTS:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            _handed_out.add(port)
        assert len(sockets) == count, f"found {len(sockets)} of {count} free test ports"
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_tcp_port(host: str = "127.0.0.1") -> int:
    return free_tcp_ports(1, host)[0]


def private_broker_settings(tmp_path: Path, *, mdp: bool = False) -> Any:
    """``EmqSettings`` for a BrokerServer run in a test: eMQP, monitor and Event BUS
    on free loopback ports, the journal in ``tmp_path``; Majordomo only with ``mdp``,
    PZQ and mc0 off (their default ports may be another broker's on this machine).
    Its addresses are the settings' ``*_BIND`` fields."""
    from emq_django.conf import EmqSettings

    front, back, mon, mdp_bind, snap, pub, coll = (
        f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(7)
    )
    return EmqSettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        MDP_BIND=mdp_bind if mdp else "",
        PZQ_RECEIVE_BIND="",
        MC0_BIND="",
        BUS_SNAPSHOT_BIND=snap,
        BUS_PUBLISH_BIND=pub,
        BUS_COLLECT_BIND=coll,
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
    )


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for label, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            text = path.read_text(errors="replace") if path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {self.name} {label} (last {lines} lines) ---\n{tail}")
        state = "running" if self.alive() else f"exited with {self.popen.returncode}"
        return f"=== {self.name} pid {self.pid}: {state}: {' '.join(self.argv)}\n" + "\n".join(
            parts
        )


# Every EmqProcesses that still owns processes, so a failed test can show their logs.
_live: weakref.WeakSet[EmqProcesses] = weakref.WeakSet()


class EmqProcesses:
    """Starts `manage.py <command> ...` subprocesses and always stops them.

    Usable as a context manager; the `emq_processes` fixture wraps one per test.
    """

    def __init__(self, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.processes: list[ManagedProcess] = []

    def __enter__(self) -> EmqProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        command: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> ManagedProcess:
        """Start `manage.py command *args` with os.environ + the base env + `env`."""
        name = name or f"{command}-{len(self.processes)}"
        argv = [sys.executable, str(REPO_ROOT / "manage.py"), command, *args]
        return self.start_program(argv, env=env, name=name)

    def start_program(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> ManagedProcess:
        """Start any program (e.g. EventMQ's `emq-jobmanager`) the way `start` does:
        os.environ + the base env + `env`, cwd the repo root, its own session, logs
        in `log_dir`, stopped by PID (and its process group) in teardown."""
        name = name or f"{Path(argv[0]).name}-{len(self.processes)}"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **(env or {})}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stdout_path = self.log_dir / f"{name}.stdout.log"
        stderr_path = self.log_dir / f"{name}.stderr.log"
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            popen = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        proc = ManagedProcess(name, argv, popen, stdout_path, stderr_path)
        self.processes.append(proc)
        _live.add(self)
        return proc

    def stop(self, proc: ManagedProcess, grace: float = STOP_GRACE) -> int:
        """SIGTERM the process, wait `grace` s, then SIGKILL its process group.

        The group is killed even after a clean exit, so that no worker it
        started outlives the test. Returns the exit code.
        """
        if proc.alive():
            _signal_pid(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.popen.wait()

    def stop_all(self) -> None:
        # Newest first: clients and job managers go before the broker they talk to.
        for proc in reversed(self.processes):
            self.stop(proc)
        _live.discard(self)

    def send_signal(self, proc: ManagedProcess, signum: int) -> None:
        _signal_pid(proc.pid, signum)

    def wait_for_port(
        self,
        port: int,
        host: str = "127.0.0.1",
        timeout: float = 15.0,
        proc: ManagedProcess | None = None,
    ) -> None:
        """Wait until `host:port` accepts TCP connections.

        Raises AssertionError if `proc` exits or time runs out (the failed test's
        report then carries every process's log tail).
        """
        self._wait(lambda: port_accepts(port, host), f"{host}:{port} to accept", timeout, proc)

    def wait_for_output(
        self, proc: ManagedProcess, text: str, timeout: float = 15.0, stream: str = "stderr"
    ) -> None:
        """Wait until `text` appears in the process's stderr (or stdout)."""
        read = proc.stderr if stream == "stderr" else proc.stdout
        self._wait(lambda: text in read(), f"{text!r} in {proc.name} {stream}", timeout, proc)

    def wait_for_exit(self, proc: ManagedProcess, timeout: float = 15.0) -> int:
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{proc.name} still running after {timeout} s") from None

    def log_tails(self, lines: int = 40) -> str:
        return "\n\n".join(p.log_tail(lines) for p in self.processes)

    def _wait(
        self, ready: Callable[[], bool], what: str, timeout: float, proc: ManagedProcess | None
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if proc is not None and not proc.alive():
                code = proc.popen.returncode
                raise AssertionError(f"{proc.name} exited with {code} while waiting for {what}")
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(autouse=True)
def _private_emq_addresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets addresses of its own: free loopback ports nothing listens on,
    and a journal in its tmp_path. So a test that does not set them (an admin action,
    the dashboard, a client call expected to fail) never reaches a broker that
    `make demo` runs on the default ports, and `make test` passes beside it.
    Subprocesses inherit them; `emq_env` and settings overrides still win.
    """
    from emq_django.client import reset_client
    from emq_django.conf import reset_cached_settings

    # one call: ports held at once are distinct (two calls may hand one out twice)
    ports = free_tcp_ports(11)
    frontend, backend, monitor, mdp, pzq_in, pzq_out, pzq_mon, mc0 = ports[:8]
    for name, port in (
        ("FRONTEND", frontend),
        ("BACKEND", backend),
        ("MONITOR", monitor),
        ("MDP", mdp),
        ("PZQ_RECEIVE", pzq_in),
        ("PZQ_SEND", pzq_out),
        ("PZQ_MONITOR", pzq_mon),
        ("MC0", mc0),
    ):
        monkeypatch.setenv(f"EMQ_{name}_BIND", f"tcp://127.0.0.1:{port}")
    for name, port in zip(("SNAPSHOT", "PUBLISH", "COLLECT"), ports[8:], strict=True):
        monkeypatch.setenv(f"EMQ_BUS_{name}_BIND", f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv("EMQ_BROKER_URL", f"tcp://127.0.0.1:{frontend}")
    monkeypatch.setenv("EMQ_WORKER_URL", f"tcp://127.0.0.1:{backend}")
    monkeypatch.setenv("EMQ_MONITOR_URL", f"tcp://127.0.0.1:{monitor}")
    monkeypatch.setenv("EMQ_JOURNAL_PATH", str(tmp_path / "emq-journal.sqlite3"))
    for name in ("SECRET", "SERVER", "PUBLIC"):  # plain text unless a test sets keys
        monkeypatch.delenv(f"EMQ_CURVE_{name}_KEY", raising=False)
    reset_cached_settings()
    reset_client()
    yield
    reset_client()
    reset_cached_settings()


@pytest.fixture
def emq_env(tmp_path: Path) -> dict[str, str]:
    """Environment for one isolated broker: fresh loopback ports, a private database."""
    # one call: ports held at once are distinct (two calls may hand one out twice)
    ports = free_tcp_ports(11)
    frontend, backend, monitor, mdp, pzq_in, pzq_out, pzq_mon, mc0 = ports[:8]
    snapshot, publish, collect = ports[8:]
    return {
        "EMQ_BUS_SNAPSHOT_BIND": f"tcp://127.0.0.1:{snapshot}",
        "EMQ_BUS_PUBLISH_BIND": f"tcp://127.0.0.1:{publish}",
        "EMQ_BUS_COLLECT_BIND": f"tcp://127.0.0.1:{collect}",
        "EMQ_MDP_BIND": f"tcp://127.0.0.1:{mdp}",
        "EMQ_PZQ_RECEIVE_BIND": f"tcp://127.0.0.1:{pzq_in}",
        "EMQ_PZQ_SEND_BIND": f"tcp://127.0.0.1:{pzq_out}",
        "EMQ_PZQ_MONITOR_BIND": f"tcp://127.0.0.1:{pzq_mon}",
        "EMQ_MC0_BIND": f"tcp://127.0.0.1:{mc0}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "EMQ_FRONTEND_BIND": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BROKER_URL": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BACKEND_BIND": f"tcp://127.0.0.1:{backend}",
        "EMQ_WORKER_URL": f"tcp://127.0.0.1:{backend}",
        "EMQ_MONITOR_BIND": f"tcp://127.0.0.1:{monitor}",
        "EMQ_MONITOR_URL": f"tcp://127.0.0.1:{monitor}",
        "EMQ_HEARTBEAT_INTERVAL": "0.5",
        "EMQ_JOURNAL_PATH": str(tmp_path / "journal.sqlite3"),
    }


@pytest.fixture
def emq_client_env(
    emq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """`emq_env` applied to this test process too, so the client here finds the broker:
    the settings and the client's socket are read afresh, before and after.

    DATABASE_URL is left out: the test process keeps pytest-django's test database.
    """
    from emq_django.client import reset_client
    from emq_django.conf import reset_cached_settings

    for key, value in emq_env.items():
        if key != "DATABASE_URL":
            monkeypatch.setenv(key, value)
    reset_cached_settings()
    reset_client()
    yield emq_env
    reset_client()
    reset_cached_settings()


@pytest.fixture
def emq_processes(tmp_path: Path, emq_env: dict[str, str]) -> Iterator[EmqProcesses]:
    """An EmqProcesses with `emq_env` as base env; logs in tmp_path/logs."""
    with EmqProcesses(tmp_path / "logs", emq_env) as processes:
        yield processes


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for processes in list(_live):
            if processes.processes:
                report.sections.append(("emq process logs", processes.log_tails()))
    return report
