"""`make demo`'s supervisor (scripts/demo.py): nothing outlives it, Ctrl-C exits 0.

Run on private ports and a private database, so it does not meet a real demo.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, free_tcp_ports, port_accepts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _start_demo(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    frontend, backend, monitor, web = free_tcp_ports(4)
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "EMQ_FRONTEND_BIND": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BROKER_URL": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BACKEND_BIND": f"tcp://127.0.0.1:{backend}",
        "EMQ_WORKER_URL": f"tcp://127.0.0.1:{backend}",
        "EMQ_MONITOR_BIND": f"tcp://127.0.0.1:{monitor}",
        "EMQ_MONITOR_URL": f"tcp://127.0.0.1:{monitor}",
        "EMQ_JOURNAL_PATH": str(tmp_path / "journal.sqlite3"),
        "EMQ_TRACE_DIR": str(tmp_path / "trace"),
        "EMQ_DEMO_LOG_DIR": str(tmp_path / "logs"),
        "WEB_ADDR": f"127.0.0.1:{web}",
    }
    out = tmp_path / "demo.out"
    with out.open("wb") as fh:
        demo = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "scripts" / "demo.py")],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 90
    while "Press Ctrl-C" not in out.read_text():
        if demo.poll() is not None or time.monotonic() > deadline:
            os.killpg(demo.pid, signal.SIGKILL)
            pytest.fail(f"the demo did not start:\n{out.read_text()}")
        time.sleep(0.2)
    return demo, [frontend, backend, monitor, web], out


def _wait_until_gone(sid: int, ports: list[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _session_members(sid) or any(port_accepts(p) for p in ports):
        if time.monotonic() > deadline:
            left = _session_members(sid)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"left behind: pids {left}, ports {[p for p in ports if port_accepts(p)]}")
        time.sleep(0.1)


def test_demo_sigterm_then_sigkill_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    demo, ports, _ = _start_demo(tmp_path)
    assert len(_session_members(demo.pid)) >= 6  # supervisor, 5 children, workers
    os.killpg(demo.pid, signal.SIGTERM)
    time.sleep(2)
    os.killpg(demo.pid, signal.SIGKILL)
    demo.wait()
    _wait_until_gone(demo.pid, ports)


def test_demo_sigkill_of_the_supervisor_alone_takes_its_children(tmp_path: Path) -> None:
    demo, ports, _ = _start_demo(tmp_path)
    demo.kill()
    demo.wait()
    _wait_until_gone(demo.pid, ports)


def test_demo_interrupt_stops_everything_and_exits_0(tmp_path: Path) -> None:
    demo, ports, out = _start_demo(tmp_path)
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=20) == 0, out.read_text()
    assert "demo stopped." in out.read_text()
    _wait_until_gone(demo.pid, ports)


def test_demo_second_sigterm_while_stopping_exits_0_without_traceback(tmp_path: Path) -> None:
    # `kill -TERM -<pgid>` of `make demo`: make passes its copy on, so two arrive
    demo, ports, out = _start_demo(tmp_path)
    demo.send_signal(signal.SIGTERM)
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(timeout=20) == 0, out.read_text()
    text = out.read_text()
    assert "Traceback" not in text and "demo stopped." in text, text
    _wait_until_gone(demo.pid, ports)
