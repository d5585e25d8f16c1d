"""Flow control at the broker (issue 33): a task's rate limit holds over every job
manager, and ``max_concurrency`` per key runs one job of a key at a time while other
keys run beside it. The broker holds jobs back; none fails or retries.

Real broker and job manager processes on their own loopback ports; the tasks are in
tests/e2e/flow_tasks.py and write a line per start (and end) to EMQ_FLOW_LOG, in the
order things happened (small O_APPEND writes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emq_django.broker.flow import BURST
from tests.e2e import flow_tasks as tasks
from tests.e2e.test_spine import monitor, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def start(
    procs: EmqProcesses, env: dict[str, str], managers: int, slots: int
) -> list[ManagedProcess]:
    """A broker and ``managers`` job managers of ``slots`` worker processes each."""
    running = [start_broker(procs, env)]
    for i in range(managers):
        running.append(
            procs.start(
                "emq_jobmanager",
                "--queues",
                "flow",
                "--concurrency",
                str(slots),
                "--name",
                f"fc{i}",
                name=f"jm{i}",
            )
        )
        wait_jm_ready(env, f"fc{i}", slots, running)
    return running


def flow_queue(env: dict[str, str]) -> dict[str, object]:
    return next((q for q in monitor(env)["queues"] if q["name"] == "flow"), {})


def test_a_rate_limit_holds_over_two_job_managers(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    procs = start(emq_processes, env, managers=2, slots=2)
    tasks.paced.map([(f"p{i}",) for i in range(200)])
    # the broker holds them back (MONITOR JSON says so) ...
    wait_until(lambda: int(flow_queue(env).get("throttled", 0)) > 0, "jobs throttled", 30, procs)
    wait_until(lambda: len(tasks.started()) == 200, "the 200 jobs ran", 120, procs)
    starts = sorted(float(r["t"]) for r in tasks.started())  # type: ignore[arg-type]
    # ... at 20 a second: 200 jobs with a burst of 1 start over at least 199/20 s
    assert starts[-1] - starts[0] >= 9.0
    most = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert most <= BURST + tasks.PACE, f"{most} jobs started within one second"
    assert flow_queue(env).get("throttled") == 0  # none failed, none left waiting
    assert monitor(env)["counters"].get("failed", 0) == 0


def test_one_job_per_key_at_a_time_and_keys_side_by_side(
    env: dict[str, str], emq_processes: EmqProcesses, tmp_path: Path
) -> None:
    procs = start(emq_processes, env, managers=3, slots=1)
    gate = tmp_path / "gate"
    for i in range(4):  # a0 b0 a1 b1 ...: each a job blocked by its key is ahead of b's
        tasks.per_customer.delay(f"a{i}", "a", str(gate))
        tasks.per_customer.delay(f"b{i}", "b", str(gate))

    def running() -> set[str]:
        records = tasks.started()
        ended = {r["key"] for r in records if r["phase"] == "end"}
        return {str(r["key"]) for r in records if r["phase"] == "start"} - ended

    # a0 and b0 run side by side (on two job managers); the third has a free slot,
    # and the six others wait at the broker, blocked by their key
    wait_until(lambda: running() == {"a0", "b0"}, "a0 and b0 run at once", 30, procs)
    wait_until(lambda: flow_queue(env).get("blocked") == 6, "six jobs blocked", 30, procs)
    assert running() == {"a0", "b0"}
    gate.touch()
    wait_until(lambda: len(tasks.started()) == 16, "the 8 jobs ran", 60, procs)
    for customer in "ab":  # in the order things happened: start, end, start, end ...
        phases = [r["phase"] for r in tasks.started() if r["customer"] == customer]
        assert phases == ["start", "end"] * 4, f"two jobs of key {customer} ran at once"
    assert flow_queue(env).get("blocked") == 0
    assert monitor(env)["counters"].get("failed", 0) == 0
