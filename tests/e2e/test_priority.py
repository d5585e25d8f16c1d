"""Priority at the broker (issue 33): higher first, FIFO within a priority, prefetch
cannot defeat it, and aging bounds how long a job is overtaken.

Real broker and job manager processes on their own loopback ports; the tasks are in
tests/e2e/flow_tasks.py and write one line per start to EMQ_FLOW_LOG.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import flow_tasks as tasks
from tests.e2e.test_spine import monitor, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until
from tests.support.environ import environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGING = 0.1  # seconds of waiting per priority level, for the aging test


@pytest.fixture
def env(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The flow tasks' environment (tests/e2e/conftest.py), with this aging."""
    with environment(env, {"EMQ_PRIORITY_AGING": str(AGING)}):
        yield env


def start(procs: EmqProcesses, env: dict[str, str]) -> list[ManagedProcess]:
    """A broker and one job manager with one worker process (prefetch as default)."""
    broker = start_broker(procs, env)
    jm = procs.start(
        "emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "fl", name="jm"
    )
    wait_jm_ready(env, "fl", 1, [broker, jm])
    return [broker, jm]


def queued(env: dict[str, str]) -> int:
    """Jobs of queue ``flow`` at the broker: waiting, or held by the worker process."""
    queue = next(q for q in monitor(env)["queues"] if q["name"] == "flow")
    return int(queue["depth"]) + int(queue["in_flight"])


def keys() -> list[str]:
    return [str(r["key"]) for r in tasks.started()]


def test_priority_under_prefetch(
    env: dict[str, str], emq_processes: EmqProcesses, tmp_path: Path
) -> None:
    procs = start(emq_processes, env)
    # short jobs first: the worker process's credit grows (it prefetches up to 64)
    for i in range(300):
        tasks.mark.delay(f"warm-{i}")
    wait_until(lambda: len(keys()) == 300, "the warm-up jobs ran", 60, procs)
    gate = tmp_path / "gate"
    tasks.gate.delay("gate", str(gate))
    wait_until(lambda: "gate" in keys(), "the long job started", 30, procs)
    for i in range(100):
        tasks.mark.apply_async((f"low-{i}",), priority=-10)
    for i in range(5):
        tasks.mark.apply_async((f"high-{i}",), priority=10)
    wait_until(lambda: queued(env) == 106, "the broker has the 105 jobs", 30, procs)
    gate.touch()
    wait_until(lambda: len(keys()) == 300 + 1 + 105, "every job ran", 60, procs)
    after_gate = keys()[301:]
    assert after_gate[:5] == [f"high-{i}" for i in range(5)]
    assert after_gate[5:] == [f"low-{i}" for i in range(100)]  # FIFO within a priority


def test_aging_lets_a_low_job_start_within_its_bound(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    procs = start(emq_processes, env)
    bound = 50 * AGING  # a priority-0 job is overtaken by priority-50 ones sent this soon
    low_sent = 0.0
    began = time.time()
    sent = 0
    # a steady stream of priority-50 jobs, faster than the one worker runs them
    # (each takes 20 ms), for three times the bound; the priority-0 job goes in early
    while time.time() - began < 3 * bound + 3:
        now = time.time()
        if not low_sent and now - began > 1.0:
            low_sent = now
            tasks.mark.apply_async(("low",), {"sent": now}, priority=0)
        for _ in range(2):
            tasks.mark.apply_async((f"hi-{sent}",), {"sent": now, "seconds": 0.02}, priority=50)
            sent += 1
        time.sleep(0.02)  # the pace of the stream
    wait_until(lambda: "low" in keys(), "the priority-0 job started", 120, procs)
    runs = tasks.started()
    before = runs[: keys().index("low")]
    still_queued = [r for r in runs if str(r["key"]).startswith("hi-") and r not in before]
    # it waited behind the stream (priority works) ...
    overtook = [r for r in before if float(r["sent"]) > low_sent]  # type: ignore[arg-type]
    assert overtook, "no priority-50 job sent after the priority-0 one ran before it"
    # ... but only behind jobs sent within its bound (2 s of slack for the trip to
    # the broker), while jobs sent later were still waiting when it started
    assert max(float(r["sent"]) for r in overtook) < low_sent + bound + 2.0  # type: ignore[arg-type]
    assert still_queued, "the stream ended before the priority-0 job started"
