"""EMQ_LOG_FORMAT=json (issue 35): the broker and the job manager (its worker
processes too) write one JSON object per line, the project's LOGGING handlers
included, and the lines about a job carry its job_id, attempt, task and queue."""

from __future__ import annotations

import json
from typing import Any

import pytest

from emq_django.exceptions import TaskFailed
from tests.e2e import signal_tasks as tasks
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def records(proc: ManagedProcess) -> list[dict[str, Any]]:
    """Every line of the process's stderr, parsed (a line that is not one JSON
    object fails the test)."""
    found = []
    for line in proc.stderr().splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict), line
        assert {"time", "level", "logger", "pid", "message"} <= doc.keys(), line
        found.append(doc)
    return found


def test_the_commands_log_json_lines_carrying_the_job_fields(
    emq_processes: EmqProcesses, emq_client_env: dict[str, str]
) -> None:
    env = {
        **emq_client_env,
        "EMQ_IMPORTS": "tests.e2e.signal_tasks",
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_RETRY_CAP": "1",
        "EMQ_RECORDER": "",
        "EMQ_LOG_FORMAT": "json",
    }
    broker = start_broker(emq_processes, env, extra_env=env)
    jm = emq_processes.start(
        "emq_jobmanager", "--queues", "signals", "--concurrency", "1", "--name", "json", env=env
    )
    wait_jm_ready(env, "json", 1, [broker, jm])
    doomed = tasks.doomed.apply_async(("in-json",), job_id="in-json")  # retries=2
    with pytest.raises(TaskFailed):
        doomed.get(timeout=60)

    def failures() -> list[dict[str, Any]]:
        return [r for r in records(jm) if r.get("job_id") == "in-json" and "failed" in r["message"]]

    wait_until(lambda: len(failures()) == 3, "three failures logged", 60, [broker, jm])
    for attempt, record in enumerate(failures(), 1):
        assert record["logger"] == "emq_django.worker.execution"
        assert record["attempt"] == attempt
        assert record["task"] == "tests.e2e.signal_tasks.doomed"
        assert record["pid"] != jm.pid  # a worker process's line
    # the job manager's own lines, and a traceback kept in its object
    assert any(r["message"].startswith("registered tasks:") for r in records(jm))
    raised = [r for r in records(jm) if "a receiver of emq_django.signals" in r["message"]]
    assert raised and all("RuntimeError" in r["exception"] for r in raised)
    assert all(r["job_id"] == "in-json" for r in raised if r["job_id"])
    # the broker's: its dead letter, with the job's fields
    (buried,) = [r for r in records(broker) if "moved to the dead letters" in r["message"]]
    assert buried["level"] == "WARNING"
    assert (buried["job_id"], buried["attempt"]) == ("in-json", 3)
    assert (buried["queue"], buried["task"]) == ("signals", "tests.e2e.signal_tasks.doomed")
