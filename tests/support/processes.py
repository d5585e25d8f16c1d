"""`manage.py` commands run as subprocesses, always stopped by PID in teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import port_accepts, port_of

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


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


def live_processes() -> list[EmqProcesses]:
    """Every EmqProcesses that still owns processes (a failed test shows their logs)."""
    return list(_live)


def start_broker(
    procs: EmqProcesses,
    env: Mapping[str, str],
    name: str = "broker",
    extra_env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """Start ``emq_broker`` and wait until its eMQP and monitor ports accept."""
    broker = procs.start("emq_broker", name=name, env=extra_env)
    for key in ("EMQ_MONITOR_BIND", "EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND"):
        procs.wait_for_port(port_of(env[key]), proc=broker)
    return broker
