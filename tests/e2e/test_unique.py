"""Unique jobs at the broker (issue 33): while a job with a key waits or runs (and
``unique_for`` after), a send with the same key gets that job's handle, with
``duplicate`` True; a guaranteed job's key holds across a broker kill -9.

Real broker and job manager processes on their own loopback ports; the tasks are in
tests/e2e/flow_tasks.py and write one line per start to EMQ_FLOW_LOG.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e import flow_tasks as tasks
from tests.e2e.test_spine import monitor, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def start_jm(procs: EmqProcesses, env: dict[str, str], broker: ManagedProcess) -> None:
    jm = procs.start("emq_jobmanager", "--queues", "flow", "--concurrency", "1", "--name", "u")
    wait_jm_ready(env, "u", 1, [broker, jm])


def keys() -> list[str]:
    return [str(r["key"]) for r in tasks.started()]


def unique_keys(env: dict[str, str]) -> int:
    """The unique keys the broker holds for queue ``flow`` (MONITOR JSON)."""
    for queue in monitor(env)["queues"]:
        if queue["name"] == "flow":
            return int(queue.get("unique_keys", 0))
    return 0


def idle(env: dict[str, str]) -> bool:
    """Queue ``flow`` has no job waiting nor running."""
    queue = next(q for q in monitor(env)["queues"] if q["name"] == "flow")
    return int(queue["depth"]) + int(queue["in_flight"]) == 0


def test_one_job_per_key_while_it_waits_then_a_new_one(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    broker = start_broker(emq_processes, env)  # no job manager yet: the jobs wait
    first = tasks.mark.apply_async(("a",), unique_key="k1")
    again = tasks.mark.apply_async(("a-again",), unique_key="k1")
    other = tasks.mark.apply_async(("b",), unique_key="k2")
    assert (first.duplicate, again.duplicate, other.duplicate) == (False, True, False)
    assert again.id == first.id
    assert other.id != first.id
    # @emq.task(unique=True): keyed by the task and its arguments
    x1, x2, y = tasks.once.delay("x"), tasks.once.delay("x"), tasks.once.delay("y")
    assert x2.id == x1.id and x2.duplicate and not x1.duplicate
    assert y.id != x1.id and not y.duplicate
    assert unique_keys(env) == 4
    start_jm(emq_processes, env, broker)
    wait_until(lambda: len(keys()) == 4, "the four jobs ran", 60, [broker])
    assert sorted(keys()) == ["a", "b", "x", "y"]  # one job per key
    wait_until(lambda: unique_keys(env) == 0, "the keys are free once the jobs ended", 60)
    after = tasks.mark.apply_async(("a-after",), unique_key="k1")
    assert not after.duplicate and after.id != first.id
    wait_until(lambda: "a-after" in keys(), "a new job with the key ran", 60, [broker])


def test_unique_for_keeps_the_key_after_the_job_ended(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    broker = start_broker(emq_processes, env)
    start_jm(emq_processes, env, broker)
    first = tasks.mark.apply_async(("kept",), unique_key="k-for", unique_for=600)
    wait_until(lambda: "kept" in keys(), "the job ran", 60, [broker])
    wait_until(lambda: idle(env), "the job ended", 60)
    again = tasks.mark.apply_async(("kept-again",), unique_key="k-for", unique_for=600)
    assert again.duplicate and again.id == first.id
    assert unique_keys(env) == 1


def journal_env(journal: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The broker's journal: the SQLite file (EMQ_JOURNAL_PATH), or PostgreSQL."""
    return {"EMQ_JOURNAL_URL": request.getfixturevalue("pg_url")} if journal == "pg" else {}


@pytest.mark.parametrize("journal", ["sqlite", "pg"])
def test_a_guaranteed_jobs_key_holds_across_a_broker_kill(
    env: dict[str, str], emq_processes: EmqProcesses, journal: str, request: pytest.FixtureRequest
) -> None:
    extra = journal_env(journal, request)
    broker = start_broker(emq_processes, env, extra_env=extra)
    first = tasks.mark.apply_async(("g",), unique_key="k-g", guarantee=True)
    os.kill(broker.pid, signal.SIGKILL)
    broker.popen.wait(timeout=30)
    broker = start_broker(emq_processes, env, name="broker-2", extra_env=extra)
    again = tasks.mark.apply_async(("g-again",), unique_key="k-g", guarantee=True)
    assert again.duplicate and again.id == first.id
    start_jm(emq_processes, env, broker)
    wait_until(lambda: "g" in keys(), "the restored job ran", 60, [broker])
    wait_until(lambda: unique_keys(env) == 0, "its key is free once it ended", 60)
    assert keys() == ["g"]


@pytest.mark.parametrize("journal", ["sqlite", "pg"])
def test_unique_for_holds_across_a_broker_kill_for_a_guaranteed_job(
    env: dict[str, str], emq_processes: EmqProcesses, journal: str, request: pytest.FixtureRequest
) -> None:
    extra = journal_env(journal, request)
    broker = start_broker(emq_processes, env, extra_env=extra)
    start_jm(emq_processes, env, broker)
    first = tasks.mark.apply_async(("d",), unique_key="k-d", unique_for=600, guarantee=True)
    wait_until(lambda: "d" in keys(), "the job ran", 60, [broker])
    wait_until(lambda: idle(env), "the job ended", 60)
    os.kill(broker.pid, signal.SIGKILL)
    broker.popen.wait(timeout=30)
    broker = start_broker(emq_processes, env, name="broker-2", extra_env=extra)
    again = tasks.mark.apply_async(("d-again",), unique_key="k-d", guarantee=True)
    assert again.duplicate and again.id == first.id
    assert unique_keys(env) == 1


def test_bad_unique_options_fail_at_the_call_site() -> None:
    with pytest.raises(ValueError, match="empty"):
        tasks.mark.apply_async(("z",), unique_key="")
    with pytest.raises(TypeError, match="must be a str"):
        tasks.mark.apply_async(("z",), unique_key=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the most is 200"):
        tasks.mark.apply_async(("z",), unique_key="k" * 201)
    with pytest.raises(ValueError):
        tasks.mark.apply_async(("z",), unique_key="k", unique_for=-1)
    with pytest.raises(TypeError):
        tasks.mark.apply_async(("z",), unique_key="k", unique_for="10")  # type: ignore[arg-type]
