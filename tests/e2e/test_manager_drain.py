"""Draining a job manager (issue 35, ``MANAGER DRAIN`` on the monitor channel): with
real broker and job manager processes, the drained job manager finishes the job it
runs, gets none of the jobs sent after (they wait at the broker), and another job
manager of the queue takes them; resumed, it takes jobs again.

The tasks are in tests/e2e/flow_tasks.py (one line per start to EMQ_FLOW_LOG).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emq_django.monitor_client import query
from tests.e2e import flow_tasks as tasks
from tests.e2e.test_spine import job_manager, monitor, wait_jm_ready
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def ask(env: dict[str, str], request: str) -> bytes:
    return query(env["EMQ_MONITOR_URL"], request.encode(), 10.0)


def command(env: dict[str, str], request: str) -> dict[str, Any]:
    answer = ask(env, request)
    assert answer.startswith(b"{"), answer
    doc: dict[str, Any] = json.loads(answer)
    return doc


def manager(env: dict[str, str], name: str) -> dict[str, Any]:
    entry = job_manager(monitor(env), name)
    assert entry is not None, f"the broker does not list job manager {name}"
    return entry


def waiting(env: dict[str, str]) -> int:
    queue = next((q for q in monitor(env)["queues"] if q["name"] == "flow"), None)
    return int(queue["depth"]) if queue else 0


def keys() -> list[str]:
    return [str(r["key"]) for r in tasks.started()]


def test_a_drained_job_manager_finishes_its_job_and_another_takes_the_queue(
    env: dict[str, str], emq_processes: EmqProcesses, tmp_path: Path
) -> None:
    procs = emq_processes
    broker = start_broker(procs, env)
    a = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "2", "--name", "da")
    wait_jm_ready(env, "da", 2, [broker, a])
    gate = tmp_path / "gate"
    tasks.gate.delay("gate", str(gate))
    wait_until(lambda: "gate" in keys(), "the long job started at da", 60, [broker, a])

    doc = command(env, "MANAGER DRAIN da")
    assert doc["drained"] is True and doc["running"] == 1, doc
    assert manager(env, "da")["drained"] is True
    for i in range(5):
        tasks.mark.delay(f"after-{i}")
    # da has a free worker process, yet the jobs wait at the broker
    wait_until(lambda: waiting(env) == 5, "the 5 jobs wait at the broker", 60, [broker, a])
    gate.touch()  # its running job finishes and counts
    wait_until(lambda: manager(env, "da")["jobs_done"] == 1, "da finished its job", 60, [a])
    assert waiting(env) == 5 and keys() == ["gate"]  # (its credit took none of them)

    b = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "db")
    wait_until(lambda: len(keys()) == 6, "db ran the 5 jobs", 120, [broker, a, b])
    wait_until(lambda: manager(env, "db")["jobs_done"] == 5, "db counted them", 60, [b])
    assert manager(env, "da")["jobs_done"] == 1

    # resumed, da takes jobs again (db stopped: only da serves the queue)
    procs.stop(b)
    wait_until(lambda: job_manager(monitor(env), "db") is None, "db left", 60, [broker])
    assert command(env, "MANAGER RESUME da")["drained"] is False
    tasks.mark.delay("resumed")
    wait_until(lambda: manager(env, "da")["jobs_done"] == 2, "da ran a job again", 60, [a])


def test_an_unknown_job_manager_is_refused_with_the_reason(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    start_broker(emq_processes, env)
    assert ask(env, "MANAGER DRAIN nosuch") == b"ERROR no job manager named nosuch is connected"


def test_a_stopped_job_manager_finishes_its_job_and_exits(
    env: dict[str, str], emq_processes: EmqProcesses, tmp_path: Path
) -> None:
    procs = emq_processes
    broker = start_broker(procs, env)
    a = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "2", "--name", "da")
    wait_jm_ready(env, "da", 2, [broker, a])
    gate = tmp_path / "gate"
    tasks.gate.delay("gate", str(gate))
    wait_until(lambda: "gate" in keys(), "the long job started at da", 60, [broker, a])
    doc = command(env, "MANAGER STOP da")
    assert doc["stopping"] is True and doc["running"] == 1, doc
    tasks.mark.delay("after")
    wait_until(lambda: waiting(env) == 1, "the job sent after waits", 60, [broker, a])
    assert a.popen.poll() is None  # its running job holds it
    gate.touch()
    wait_until(lambda: a.popen.poll() is not None, "da exited", 120, [broker])
    assert a.popen.returncode == 0
    assert waiting(env) == 1 and keys() == ["gate"]  # no job lost: the other one waits
    b = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "db")
    wait_until(lambda: "after" in keys(), "db ran the waiting job", 120, [broker, b])


def test_a_resized_job_manager_grows_and_shrinks_its_pool_idle_processes_first(
    env: dict[str, str], emq_processes: EmqProcesses, tmp_path: Path
) -> None:
    """``MANAGER RESIZE`` (the admin's pool resize): 1 -> 3 runs three jobs at once;
    3 -> 1 with three running lets them finish (none lost, none run twice); 3 -> 1
    with one running stops the two idle processes and keeps the busy one."""
    procs = emq_processes
    broker = start_broker(procs, env)
    a = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "rs")
    wait_jm_ready(env, "rs", 1, [broker, a])
    first, second = tmp_path / "first", tmp_path / "second"
    for key in ("g0", "g1", "g2"):
        tasks.gate.delay(key, str(first))
    wait_until(lambda: keys() == ["g0"] and waiting(env) == 2, "one at a time", 60, [broker, a])

    doc = command(env, "MANAGER RESIZE rs 3")
    assert doc == {
        "job_manager": "rs",
        "concurrency": 3,
        "was": 1,
        "max_concurrency": 64,
        "processes": 1,
    }
    # three jobs at once: none can end before the gate opens
    wait_until(lambda: sorted(keys()) == ["g0", "g1", "g2"], "3 jobs at once", 60, [broker, a])
    entry = manager(env, "rs")
    assert (entry["slots"], entry["busy"], entry["concurrency"]) == (3, 3, 3), entry

    # 3 -> 1 while all three run: they finish their jobs first
    assert command(env, "MANAGER RESIZE rs 1")["was"] == 3
    assert manager(env, "rs")["jobs_done"] == 0
    first.touch()
    wait_until(
        lambda: manager(env, "rs")["jobs_done"] == 3 and manager(env, "rs")["slots"] == 1,
        "the three jobs done and one process left",
        60,
        [broker, a],
    )
    assert sorted(keys()) == ["g0", "g1", "g2"]  # none run twice

    # 3 -> 1 with one job running: the two idle processes go, the busy one stays
    command(env, "MANAGER RESIZE rs 3")
    wait_until(lambda: manager(env, "rs")["slots"] == 3, "three processes again", 60, [a])
    tasks.gate.delay("g3", str(second))
    wait_until(lambda: "g3" in keys(), "g3 started", 60, [broker, a])
    command(env, "MANAGER RESIZE rs 1")
    wait_until(lambda: manager(env, "rs")["slots"] == 1, "the idle two left", 60, [broker, a])
    entry = manager(env, "rs")
    assert (entry["busy"], entry["jobs_done"]) == (1, 3), entry  # g3 runs on
    second.touch()
    wait_until(lambda: manager(env, "rs")["jobs_done"] == 4, "g3 done", 60, [broker, a])
    tasks.mark.delay("after")
    wait_until(lambda: "after" in keys(), "the one process runs jobs", 60, [broker, a])


def test_a_resize_out_of_bounds_is_refused_with_the_reason(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    broker = start_broker(emq_processes, env)
    a = emq_processes.start(
        "emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "rs"
    )
    wait_jm_ready(env, "rs", 1, [broker, a])
    for request, reason in [
        ("MANAGER RESIZE rs 0", "the number of worker processes must be between 1 and 10000"),
        ("MANAGER RESIZE rs 65", "rs can run from 1 to 64 worker processes"),
        ("MANAGER RESIZE nosuch 2", "no job manager named nosuch is connected"),
        ("MANAGER RESIZE rs", "usage: MANAGER RESIZE <name> <worker processes>"),
    ]:
        answer = ask(env, request).decode()
        assert answer.startswith("ERROR " + reason), answer
    assert manager(env, "rs")["concurrency"] == 1
