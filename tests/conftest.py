"""Fixtures wiring: free loopback ports and `manage.py` commands run as subprocesses.

The helpers live in tests/support/. End-to-end tests start the real commands
(`emq_broker`, `emq_jobmanager`, ...) with `emq_processes.start(...)`; every process
is stopped by its PID in teardown, and when a test fails the tail of each process's
log is added to its report.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support import EmqProcesses, free_tcp_ports, live_processes

# the emq_broker fixture, as an installed emq-django gives it (its pytest11 entry point)
pytest_plugins = ["emq_django.testing.pytest_plugin", "tests.support.postgres"]


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
        for processes in live_processes():
            if processes.processes:
                report.sections.append(("emq process logs", processes.log_tails()))
    return report
