#!/usr/bin/env python3
"""`make demo`: one supervisor process for the whole demo.

It migrates the database, creates the admin login, then runs the broker, a job
manager, the scheduler, the web server and a sample producer until it is told to
stop (Ctrl-C, SIGTERM, SIGHUP) or one of them exits.

Nothing outlives it, whatever kills it: every child gets PR_SET_PDEATHSIG(SIGKILL),
so a SIGKILL of this process (or of the `make` above it, see `_own_the_terminal`)
kills the children, and the job manager's worker processes die with the job
manager in turn. Each child runs in its own process group, so a signal to the
terminal's group reaches this process only, which stops the children in order.
Their output goes to log files (`EMQ_DEMO_LOG_DIR`, default var/log/demo); the
terminal shows a few lines of progress and the banner, last.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL for each child


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class Stop(Exception):
    """A stop signal arrived."""


def _prctl_pdeathsig(sig: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child, between fork and exec
        os.setpgid(0, 0)
        _prctl_pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return setup


def _own_the_terminal() -> int | None:
    """Take the terminal's foreground for this process's own group; returns the old
    foreground group, or None when there is no terminal.

    `make` dies by any SIGINT it receives (exit 130, "make: *** Error 130"), however
    the recipe ends; once this process owns the terminal, Ctrl-C reaches it alone and
    `make demo` exits with its status (0). Out of make's group, it would miss a
    SIGKILL sent to that group, so it dies with make: make passes a SIGTERM on and
    waits for it, so make dies first only by SIGKILL, and that is passed on too.
    """
    try:
        if not os.isatty(0) or os.tcgetpgrp(0) != os.getpgrp():
            return None
        old = os.getpgrp()
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        return None
    parent = os.getppid()
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return old


def _give_back_terminal(old: int | None) -> None:
    if old is None:
        return
    try:
        os.tcsetpgrp(0, old)
    except OSError:
        pass


def _address(env_name: str, default: str) -> tuple[str, int] | None:
    """The host and port an ``EMQ_*_BIND`` names, or None when it is set empty (the
    port turned off: nothing of ours will listen there)."""
    url = (os.environ.get(env_name, default) if env_name else default).strip()
    if not url:
        return None
    host, _, port = url.rpartition("://")[2].rpartition(":")
    if not port.isdigit():
        raise RuntimeError(f"{env_name}={url!r} names no port (expected e.g. {default})")
    return (host.strip("[]") or "127.0.0.1").replace("*", "127.0.0.1"), int(port)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Demo:
    def __init__(self, python: str, log_dir: Path, out: IO[str]) -> None:
        self.python = python
        self.log_dir = log_dir
        self.out = out
        self.children: list[Child] = []
        self.stopping = False

    def say(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except OSError:  # the terminal is gone (closed window): stopping goes on
            pass

    # ---- children -------------------------------------------------------------

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Child:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as fh:
            popen = subprocess.Popen(
                [self.python, str(ROOT / "manage.py"), *args],
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(os.getpid()),
            )
        child = Child(name, popen, log)
        self.children.append(child)
        return child

    def run_step(self, what: str, *args: str, env: dict[str, str] | None = None) -> str:
        """Run a manage.py command to its end; returns its output, raises on failure."""
        child = self.spawn(what.split()[0], *args, env=env)
        child.popen.wait()
        self.children.remove(child)
        output = child.log.read_text(errors="replace")
        if child.popen.returncode != 0 and "already taken" not in output:
            raise RuntimeError(f"{what} failed (exit {child.popen.returncode}):\n{output}")
        return output

    def stop_all(self) -> None:
        """SIGTERM the children, newest first but all at once except the broker, which
        goes last (the others talk to it); SIGKILL each group after STOP_GRACE."""
        self.stopping = True
        broker = [c for c in self.children if c.name == "broker"]
        others = [c for c in self.children if c.name != "broker"]
        for group in (list(reversed(others)), broker):
            for child in group:
                _signal(child.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            for child in group:
                try:
                    child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say(f"  {child.name} (pid {child.popen.pid}) did not stop; killing it")
                _signal_group(child.popen.pid, signal.SIGKILL)
                child.popen.wait()
        self.children.clear()

    def exited(self) -> Child | None:
        return next((c for c in self.children if c.popen.poll() is not None), None)

    def wait_for_port(self, host: str, port: int, child: Child, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _accepts(host, port):
            if child.popen.poll() is not None:
                raise RuntimeError(self.tail(child, f"{child.name} exited before listening"))
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:g} s")
            time.sleep(0.1)

    @staticmethod
    def tail(child: Child, headline: str, lines: int = 20) -> str:
        text = child.log.read_text(errors="replace").splitlines()[-lines:]
        body = "\n".join(f"    {line}" for line in text)
        return f"{headline} (exit {child.popen.returncode}); last lines of {child.log}:\n{body}"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Deaf from the first one on: a SIGTERM to `make demo`'s process group reaches this
    # process twice (directly, then passed on by make), and the second must not cut
    # the stop short with a traceback.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise Stop(signal.Signals(signum).name)


def main() -> int:
    python = os.environ.get("PYTHON") or sys.executable
    web_addr = os.environ.get("WEB_ADDR", "").strip() or "127.0.0.1:8000"
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # The broker's trace log, for `manage.py emq_analyze` (the admin's metrics page),
    # and its journal, both under var/ (git-ignored) rather than the current directory.
    os.environ.setdefault("EMQ_TRACE_DIR", str(ROOT / "var" / "trace"))
    os.environ.setdefault("EMQ_JOURNAL_PATH", str(ROOT / "var" / "emq-journal.sqlite3"))
    # the demo shows jobs' arguments in the admin (masked by default elsewhere)
    os.environ.setdefault("EMQ_RESULTS_SHOW_ARGS", "true")
    log_dir = Path(os.environ.get("EMQ_DEMO_LOG_DIR", ROOT / "var" / "log" / "demo"))
    log_dir.mkdir(parents=True, exist_ok=True)

    old_foreground = _own_the_terminal()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    demo = Demo(python, log_dir, sys.stdout)
    status = 0
    try:
        status = run(demo, web_addr)
    except Stop as stop:
        demo.say(f"\n{stop.args[0]}: stopping the demo processes...")
    except RuntimeError as exc:
        demo.say(f"make demo: {exc}")
        status = 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a second signal must not cut this short
        demo.stop_all()
        _give_back_terminal(old_foreground)
    if status == 0:
        demo.say("demo stopped.")
    return status


def run(demo: Demo, web_addr: str) -> int:
    ports = {
        "broker (clients)": _address("EMQ_FRONTEND_BIND", "tcp://127.0.0.1:47291"),
        "broker (job managers)": _address("EMQ_BACKEND_BIND", "tcp://127.0.0.1:47290"),
        "broker (monitor)": _address("EMQ_MONITOR_BIND", "tcp://127.0.0.1:47293"),
        "broker (Majordomo)": _address("EMQ_MDP_BIND", "tcp://127.0.0.1:5555"),
        "broker (PZQ receive)": _address("EMQ_PZQ_RECEIVE_BIND", "tcp://127.0.0.1:11131"),
        "broker (PZQ send)": _address("EMQ_PZQ_SEND_BIND", "tcp://127.0.0.1:11132"),
        "broker (PZQ monitor)": _address("EMQ_PZQ_MONITOR_BIND", "tcp://127.0.0.1:11133"),
        "broker (Event BUS snapshot)": _address("EMQ_BUS_SNAPSHOT_BIND", "tcp://127.0.0.1:5556"),
        "broker (Event BUS publisher)": _address("EMQ_BUS_PUBLISH_BIND", "tcp://127.0.0.1:5557"),
        "broker (Event BUS collector)": _address("EMQ_BUS_COLLECT_BIND", "tcp://127.0.0.1:5558"),
        "broker (mc0)": _address("EMQ_MC0_BIND", "tcp://127.0.0.1:61616"),
        "web server": _address("", "tcp://" + web_addr),
    }
    busy = [
        f"{a[0]}:{a[1]} ({what})"
        for what, a in ports.items()
        if a is not None and not _port_free(*a)
    ]
    if busy:
        raise RuntimeError(
            "already in use: "
            + ", ".join(busy)
            + ". Another demo or broker runs there: stop it, or move this demo with the "
            "EMQ_* addresses and WEB_ADDR (docs/reference/settings.md). `ss -ltnp` shows the owner."
        )
    demo.say("make demo: migrating the database...")
    demo.run_step("migrate", "migrate", "--noinput", "-v", "0")
    demo.run_step(
        "createsuperuser",
        "createsuperuser",
        "--noinput",
        env={
            "DJANGO_SUPERUSER_USERNAME": "admin",
            "DJANGO_SUPERUSER_PASSWORD": "admin",
            "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
        },
    )
    demo.say("make demo: starting the broker, job manager, scheduler, web server, producer...")
    broker = demo.spawn("broker", "emq_broker")
    frontend = ports["broker (clients)"]
    if frontend is None:
        raise RuntimeError("EMQ_FRONTEND_BIND is empty: the demo's producer needs the client port")
    demo.wait_for_port(*frontend, broker)
    demo.spawn(
        "jobmanager", "emq_jobmanager", "--queues", "default:10,email:40", "--concurrency", "2"
    )
    demo.spawn("scheduler", "emq_scheduler")
    web = demo.spawn("web", "runserver", "--noreload", web_addr)
    demo.spawn("producer", "emq_demo")
    web_port = ports["web server"]
    assert web_port is not None  # WEB_ADDR always names one
    demo.wait_for_port(*web_port, web)
    time.sleep(1.0)  # let the others finish starting (or fail) before the banner
    if (gone := demo.exited()) is not None:
        raise RuntimeError(demo.tail(gone, f"{gone.name} exited while starting"))
    demo.say(banner(demo, web_addr))
    while (gone := demo.exited()) is None:
        time.sleep(0.2)
    raise RuntimeError(demo.tail(gone, f"{gone.name} exited; stopping the demo"))


def banner(demo: Demo, web_addr: str) -> str:
    py = os.path.relpath(demo.python, ROOT) if demo.python.startswith(str(ROOT)) else demo.python
    running = "\n".join(
        f"      {c.name:<11} pid {c.popen.pid:<8} log {os.path.relpath(c.log, ROOT)}"
        for c in demo.children
    )
    return f"""
  emq-django demo is running:
{running}
    Admin:   http://{web_addr}/admin/   (login: admin / admin)
    Status:  {py} manage.py emq_status
    Charts:  {py} manage.py emq_analyze   (needs Java 17+; trace in {os.environ["EMQ_TRACE_DIR"]}),
             then http://{web_addr}/admin/emq_analytics/metricsdashboard/
  Press Ctrl-C to stop.
"""


if __name__ == "__main__":
    sys.exit(main())
