"""emq_django.signals (issue 35): each fires in the process where its event happens,
in order, for a success with streamed partials, a failure retried until it succeeds,
and a job that ends in the dead letters; a receiver that raises breaks nothing.

Real broker and job manager processes on their own loopback ports; the receivers
are in tests/e2e/signal_tasks.py and append one line per signal to EMQ_SIGNAL_LOG.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.exceptions import TaskFailed
from tests.e2e import signal_tasks as tasks
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, start_broker, wait_until
from tests.support.environ import environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def env(
    emq_env: dict[str, str], emq_client_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, str]]:
    extra = {
        "EMQ_IMPORTS": "tests.e2e.signal_tasks",
        "EMQ_SIGNAL_LOG": str(tmp_path / "signals.jsonl"),
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_RETRY_CAP": "1",
        "EMQ_RECORDER": "",
    }
    with environment(emq_env, extra):
        yield emq_env


def lines(env: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    path = Path(env["EMQ_SIGNAL_LOG"])
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["job_id"] == job_id]


def story(env: dict[str, str], job_id: str) -> list[tuple[str, int]]:
    """The worker processes' signals of the job, in order (job_sent, in the client,
    may be written after the worker has started the job: it is checked apart)."""
    return [(r["signal"], r["attempt"]) for r in lines(env, job_id) if r["signal"] != "job_sent"]


def test_signals_fire_in_order_in_their_processes_and_a_raising_receiver_breaks_nothing(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    broker = start_broker(emq_processes, env)
    jm = emq_processes.start(
        "emq_jobmanager", "--queues", "signals", "--concurrency", "1", "--name", "sig"
    )
    wait_jm_ready(env, "sig", 1, [broker, jm])
    procs = [broker, jm]

    ok = tasks.streams.apply_async(("ok",), job_id="ok")
    assert ok.get(timeout=60) == "ok done"
    flaky = tasks.flaky.apply_async(("flaky",), job_id="flaky")
    assert flaky.get(timeout=60) == "flaky ok"
    doomed = tasks.doomed.apply_async(("doomed",), job_id="doomed")
    with pytest.raises(TaskFailed):
        doomed.get(timeout=60)
    wait_until(
        lambda: story(env, "doomed")[-1:] == [("job_dead_lettered", 3)],
        "the dead letter's signal",
        60,
        procs,
    )
    wait_until(lambda: story(env, "ok")[-1:] == [("job_succeeded", 1)], "ok's end", 60, procs)

    assert story(env, "ok") == [
        ("job_started", 1),
        ("partial_sent", 1),
        ("partial_sent", 1),
        ("job_succeeded", 1),
    ]
    assert story(env, "flaky") == [
        ("job_started", 1),
        ("job_failed", 1),
        ("job_retrying", 1),
        ("job_started", 2),
        ("job_failed", 2),
        ("job_retrying", 2),
        ("job_started", 3),
        ("job_succeeded", 3),
    ]
    assert story(env, "doomed") == [
        ("job_started", 1),
        ("job_failed", 1),
        ("job_retrying", 1),
        ("job_started", 2),
        ("job_failed", 2),
        ("job_retrying", 2),
        ("job_started", 3),
        ("job_failed", 3),
        ("job_dead_lettered", 3),
    ]

    # job_sent once, in this (the client) process; the others in a worker process
    for job_id in ("ok", "flaky", "doomed"):
        sent = [r for r in lines(env, job_id) if r["signal"] == "job_sent"]
        assert [(r["pid"], r["attempt"]) for r in sent] == [(os.getpid(), 0)]
        run = [r for r in lines(env, job_id) if r["signal"] != "job_sent"]
        assert not {r["pid"] for r in run} & {os.getpid(), jm.pid}
    # the arguments every signal carries, and each signal's own
    ok_lines = lines(env, "ok")
    for r in ok_lines:
        assert (r["sender"], r["task"]) == (tasks.streams.name, tasks.streams.name)
        assert (r["queue"], r["args"], r["kwargs"]) == ("signals", ["ok"], {})
    assert [r["value"] for r in ok_lines if r["signal"] == "partial_sent"] == [0, 1]
    assert [r["index"] for r in ok_lines if r["signal"] == "partial_sent"] == [1, 2]
    # (its last line may be job_sent: the client's, written when its send returned,
    # which on a busy machine can be after the worker ran the job)
    succeeded = [r for r in ok_lines if r["signal"] == "job_succeeded"]
    assert [r["result"] for r in succeeded] == ["ok done"]
    failed = [r for r in lines(env, "flaky") if r["signal"] == "job_failed"]
    assert [r["error"] for r in failed] == ["ValueError", "ValueError"]
    assert failed[0]["exception"] == "ValueError('flaky: failure 1')"
    (dead,) = [r for r in lines(env, "doomed") if r["signal"] == "job_dead_lettered"]
    assert (dead["error"], dead["exception"]) == ("KeyError", "KeyError('doomed')")

    # the receiver that raises on every job_started was logged, in the worker process
    assert "a receiver of emq_django.signals.job_started raised: RuntimeError" in jm.stderr()
