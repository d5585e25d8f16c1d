"""A broker and a job manager shared by a test module, and `manage.py shell` snippets
that drive them: for tests/e2e/test_django_tasks.py and test_on_commit.py.

The job manager imports tests/e2e/djangotasks_tasks.py and records to a migrated
SQLite database that the snippets read too.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_spine import run_manage, wait_jm_ready
from tests.support import EmqProcesses, free_tcp_ports, start_broker

IMPORTS = "tests.e2e.djangotasks_tasks"
PRELUDE = """
import json, time
from tests.e2e import djangotasks_tasks as t
def show(tag, value):
    print(tag + "=" + json.dumps(value, default=str))
def state(r):
    return {"id": r.id, "status": str(r.status), "finished": r.is_finished,
            "attempts": r.attempts, "workers": r.worker_ids,
            "enqueued_at": r.enqueued_at, "started_at": r.started_at,
            "finished_at": r.finished_at, "args": r.args, "kwargs": r.kwargs,
            "errors": [[e.exception_class_path, e.traceback] for e in r.errors],
            "value": r.return_value if str(r.status) == "SUCCESSFUL" else None}
def wait(r, timeout=20, seen=None):
    deadline = time.monotonic() + timeout
    while True:
        r.refresh()
        if seen is not None:
            seen.append(str(r.status))
        if r.is_finished or time.monotonic() > deadline:
            return r
        time.sleep(0.05)
"""


class Stack:
    def __init__(self, env: dict[str, str], procs: EmqProcesses, tmp: Path) -> None:
        self.env = env
        self.procs = procs
        self.tmp = tmp

    def shell(self, code: str, timeout: float = 60.0) -> str:
        out = run_manage(self.env, "shell", "-c", PRELUDE + textwrap.dedent(code), timeout=timeout)
        assert out.returncode == 0, f"shell failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def signals(self) -> list[list[str]]:
        path = Path(self.env["DJT_SIGNAL_LOG"])
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def run_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """For a module-scoped fixture: ``yield from run_stack(tmp_path_factory)``."""
    tmp = tmp_path_factory.mktemp("djtasks")
    frontend, backend, monitor, mdp, pzq_in, pzq_out, pzq_mon, mc0 = free_tcp_ports(8)
    env = {
        # a module-scoped stack starts before the per-test private addresses
        # (conftest): every port of its broker must be private here
        "EMQ_MDP_BIND": f"tcp://127.0.0.1:{mdp}",
        "EMQ_PZQ_RECEIVE_BIND": f"tcp://127.0.0.1:{pzq_in}",
        "EMQ_PZQ_SEND_BIND": f"tcp://127.0.0.1:{pzq_out}",
        "EMQ_PZQ_MONITOR_BIND": f"tcp://127.0.0.1:{pzq_mon}",
        "EMQ_MC0_BIND": f"tcp://127.0.0.1:{mc0}",
        "EMQ_BUS_SNAPSHOT_BIND": "",  # the Event BUS off
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        "EMQ_FRONTEND_BIND": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BROKER_URL": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BACKEND_BIND": f"tcp://127.0.0.1:{backend}",
        "EMQ_WORKER_URL": f"tcp://127.0.0.1:{backend}",
        "EMQ_MONITOR_BIND": f"tcp://127.0.0.1:{monitor}",
        "EMQ_MONITOR_URL": f"tcp://127.0.0.1:{monitor}",
        "EMQ_HEARTBEAT_INTERVAL": "0.5",
        "EMQ_JOURNAL_PATH": str(tmp / "journal.sqlite3"),
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_IMPORTS": IMPORTS,
        "DJT_SIGNAL_LOG": str(tmp / "signals.log"),
    }
    migrated = run_manage(env, "migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    with EmqProcesses(tmp / "logs", env) as procs:
        broker = start_broker(procs, env)
        jm = procs.start(
            "emq_jobmanager", "--queues", "djtasks:10", "--concurrency", "2", "--name", "djt"
        )
        wait_jm_ready(env, "djt", 2, procs=[broker, jm])
        yield Stack(env, procs, tmp)
