"""Helpers for tests/e2e/test_scheduler*.py: start the processes, read the history."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from tests.e2e import scheduler_tasks
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, wait_until

IMPORTS = scheduler_tasks.__name__
TICK = f"{IMPORTS}.tick"


def manage(env: Mapping[str, str], *args: str, timeout: float = 60.0) -> str:
    """Run ``manage.py *args`` to completion; returns stdout, fails with stderr."""
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"manage.py {' '.join(args)} failed:\n{out.stderr}"
    return out.stdout


def shell(env: Mapping[str, str], code: str) -> str:
    return manage(env, "shell", "-c", code)


def start_jobmanager(procs: EmqProcesses, concurrency: int = 2) -> ManagedProcess:
    jm = procs.start(
        "emq_jobmanager",
        "--queues",
        "sched:10",
        "--concurrency",
        str(concurrency),
        name="jobmanager",
        env={"EMQ_IMPORTS": IMPORTS},
    )
    procs.wait_for_output(jm, "worker processes on queues")
    return jm


def start_scheduler(procs: EmqProcesses, name: str = "scheduler", *args: str) -> ManagedProcess:
    sched = procs.start("emq_scheduler", *args, name=name, env={"EMQ_IMPORTS": IMPORTS})
    procs.wait_for_output(sched, "catch-up policy")
    return sched


def history(marker: Path, tag: str | None = None) -> list[float]:
    """Run times (unix) from the marker file, for ``tag`` or all."""
    if not marker.exists():
        return []
    times = []
    for line in marker.read_text().splitlines():
        t, at, _ = line.split()
        if tag is None or t == tag:
            times.append(float(at))
    return sorted(times)


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]


def _query(env: Mapping[str, str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the test's SQLite database (the one the processes share)."""
    path = env["DATABASE_URL"].removeprefix("sqlite:///")
    with closing(sqlite3.connect(path, timeout=10)) as db:
        return db.execute(sql, params).fetchall()


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def sent_ticks(env: Mapping[str, str], name: str) -> list[dt.datetime]:
    """The ticks the scheduler sent for schedule ``name`` (its ScheduleRun rows), in order."""
    rows = _query(
        env,
        "SELECT r.due_at FROM emq_scheduler_schedulerun r JOIN emq_scheduler_scheduledjob s"
        " ON s.id = r.schedule_id WHERE s.name = ? AND NOT r.manual ORDER BY r.due_at",
        name,
    )
    return [_utc(r[0]) for r in rows]


def planned_run(env: Mapping[str, str], name: str) -> float:
    """Schedule ``name``'s next run as a unix time."""
    [(text,)] = _query(
        env, "SELECT next_run_at FROM emq_scheduler_scheduledjob WHERE name = ?", name
    )
    return _utc(text).timestamp()


def sends_after_a_sentinel(
    env: Mapping[str, str], sched: ManagedProcess, names: Sequence[str]
) -> list[str]:
    """Store a fast schedule now and wait until the scheduler has sent it twice; returns
    its log lines after the sentinel's first send that name any of ``names``. What the
    scheduler sends after that line it decided after the sentinel was stored, so after
    whatever changed before it (an unschedule, a disabled schedule): no fixed sleep."""
    shell(
        env,
        f"import emq_django as emq; emq.schedule({TICK!r}, every=0.2, args=['sentinel'], "
        "queue='sched', name='sentinel')",
    )
    wait_until(lambda: sched.stderr().count("schedule sentinel ") >= 2, "the sentinel sent twice")
    log = sched.stderr()
    after = log[log.index("schedule sentinel ") :].splitlines()
    return [line for line in after if any(f"schedule {n} " in line for n in names)]
