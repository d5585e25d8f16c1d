"""Issue 35's job manager page, its figures: with a real broker and job manager,
one job that succeeds and one that fails give ``jobs_done == 2`` (every finished
attempt counts, failed ones too) and ``jobs_failed == 1`` in MONITOR JSON, and the
job manager's memory report (a sixth HEARTBEAT frame) gives ``memory_bytes``: its
own resident set plus each worker process's.

The tasks are in tests/e2e/flow_tasks.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.e2e import flow_tasks as tasks
from tests.e2e.test_manager_drain import manager
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_jobs_failed_and_memory_of_a_job_manager(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    procs = emq_processes
    broker = start_broker(procs, env)
    jm = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "2", "--name", "fig")
    wait_jm_ready(env, "fig", 2, [broker, jm])
    tasks.mark.delay("fine")
    tasks.fails.delay("broken")
    wait_until(lambda: manager(env, "fig")["jobs_done"] == 2, "both jobs ended", 60, [broker, jm])
    entry: dict[str, Any] = manager(env, "fig")
    assert entry["jobs_failed"] == 1, entry
    # the first heartbeat reports (EMQ_HEARTBEAT_INTERVAL 0.5 s here)
    wait_until(lambda: (manager(env, "fig")["memory_bytes"] or 0) > 0, "a memory report", 30, [jm])
    entry = manager(env, "fig")
    memory = entry["memory"]
    assert memory["job_manager"] > 1_000_000, memory  # a Python process: megabytes
    assert entry["pid"] != os.getpid()
    # its worker processes, each with its own figure, in the total
    assert len(memory["processes"]) == 2 and all(n > 0 for n in memory["processes"].values())
    assert entry["memory_bytes"] == memory["job_manager"] + sum(memory["processes"].values())
