"""The job history end to end: a job manager's recorder process writes it for all
its worker processes (emq_django/worker/recorder_process.py).

Real broker and job manager processes, real SQLite; the history is read with
sqlite3 from the database the job manager writes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import spine_tasks as tasks
from tests.e2e.test_spine import run_manage, start_jm, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = pytest.mark.e2e

RECORDER = {"EMQ_RECORDER": "emq_django.results.recorder.DatabaseRecorder"}


@pytest.fixture
def client(emq_client_env: dict[str, str]) -> dict[str, str]:
    assert run_manage(emq_client_env, "migrate", "--noinput").returncode == 0
    return emq_client_env


def db_path(env: dict[str, str]) -> str:
    return env["DATABASE_URL"][len("sqlite:///") :]


def history(env: dict[str, str], task: str = "tests.e2e.spine_tasks.add") -> dict[str, str]:
    """job id -> status, for ``task``'s rows in the job manager's database."""
    with sqlite3.connect(db_path(env), timeout=10) as db:
        rows = db.execute(
            "SELECT id, status FROM emq_results_jobresult WHERE task = ?", (task,)
        ).fetchall()
    return dict(rows)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def idle_policy(pid: int) -> bool:
    try:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE
    except ProcessLookupError:
        return False


def recorder_pid(jm: ManagedProcess) -> int | None:
    """The job manager's child under the SCHED_IDLE policy: its recorder process."""
    idle = [p for p in children(jm.pid) if idle_policy(p)]
    assert len(idle) <= 1, f"more than one recorder process: {idle}"
    return idle[0] if idle else None


def opens_database(pid: int, path: str) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(path):
                return True
        except OSError:
            continue
    return False


def start_recording(emq_processes: EmqProcesses, client: dict[str, str]) -> tuple[Any, Any]:
    """A broker and a job manager "rec-jm" (2 slots) that records, both ready."""
    broker = start_broker(emq_processes, client)
    jm = start_jm(emq_processes, "rec-jm", concurrency=2, extra_env=RECORDER)
    wait_jm_ready(client, "rec-jm", 2, [broker, jm])
    return broker, jm


def send_adds(n: int, start: int = 0) -> list[str]:
    handles = [tasks.add.delay(i, 1) for i in range(start, start + n)]
    assert [h.get(timeout=30) for h in handles] == [i + 1 for i in range(start, start + n)]
    return [h.id for h in handles]


def test_one_lower_priority_process_writes_the_history(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    broker, jm = start_recording(emq_processes, client)
    ids = send_adds(300)
    got = wait_until(
        lambda: (h := history(client)) and len(h) >= 300 and h, "300 rows", 15, [broker, jm]
    )
    assert set(got) == set(ids)
    assert set(got.values()) == {"succeeded"}

    rec = recorder_pid(jm)  # EMQ_RECORDER_PRIORITY = "idle", the default
    assert rec is not None, "no recorder process below the job manager"
    slots = [p for p in children(jm.pid) if p != rec]
    assert len(slots) == 2
    assert not any(idle_policy(p) for p in slots)
    # only the recorder process has the database open; the worker processes do not
    assert opens_database(rec, db_path(client))
    assert not any(opens_database(p, db_path(client)) for p in slots)


def test_a_killed_recorder_process_is_replaced(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    broker, jm = start_recording(emq_processes, client)
    first = wait_until(lambda: recorder_pid(jm), "the recorder process", 10, [jm])
    os.kill(first, signal.SIGKILL)
    second = wait_until(
        lambda: (p := recorder_pid(jm)) and p != first and p, "a new recorder process", 10, [jm]
    )
    assert second != first
    ids = send_adds(100)  # the jobs never noticed
    wait_until(lambda: set(ids) <= set(history(client)), "the new jobs' rows", 15, [jm])
    assert "recorder process died" in jm.stderr() + jm.stdout()


def test_stopping_the_job_manager_writes_what_its_processes_still_held(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    """With a 60 s record interval nothing is written while the jobs run: the rows
    can only come from the worker processes' last flush on their way out."""
    broker = start_broker(emq_processes, client)
    jm = start_jm(
        emq_processes,
        "rec-jm",
        concurrency=2,
        extra_env={**RECORDER, "EMQ_RECORD_INTERVAL": "60"},
    )
    wait_jm_ready(client, "rec-jm", 2, [broker, jm])
    ids = send_adds(200)
    time.sleep(0.5)
    assert history(client) == {}, "written before the interval was over"
    t0 = time.monotonic()
    assert emq_processes.stop(jm) == 0
    print(f"job manager stopped in {time.monotonic() - t0:.2f} s")
    got: Any = history(client)
    assert set(got) == set(ids)
