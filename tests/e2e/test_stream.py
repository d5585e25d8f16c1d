"""Streamed results end to end: a real broker and job manager, this process as
the client. A generator task's values, and ``emq.partial()`` calls, reach
``Result.stream()`` as they are produced; the trace and the history count them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.client import get_client
from emq_django.exceptions import TaskFailed
from tests.e2e import stream_tasks as tasks
from tests.e2e.test_spine import run_manage, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until
from tests.support.environ import environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

IMPORTS = "tests.e2e.stream_tasks"
RECORDER = "emq_django.results.recorder.DatabaseRecorder"


@pytest.fixture
def env(
    emq_env: dict[str, str], emq_client_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, str]]:
    """The broker, the job manager and this test process share these settings."""
    extra = {
        "EMQ_IMPORTS": IMPORTS,
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_RETRY_CAP": "1",
        "EMQ_TRACE_DIR": str(tmp_path / "trace"),
        "EMQ_RECORDER": RECORDER,
    }
    with environment(emq_env, extra):
        assert run_manage(emq_env, "migrate", "--noinput").returncode == 0
        yield emq_env


def start(procs: EmqProcesses, env: dict[str, str]) -> list[ManagedProcess]:
    broker = start_broker(procs, env)
    jm = procs.start(
        "emq_jobmanager", "--queues", "stream:10", "--concurrency", "2", "--name", "st",
        name="jm-st",
    )  # fmt: skip
    wait_jm_ready(env, "st", 2, [broker, jm])
    return [broker, jm]


def trace_lines(env: dict[str, str], job: str) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(Path(env["EMQ_TRACE_DIR"]).glob("trace-*.jsonl")):
        lines += [e for e in map(json.loads, path.read_text().splitlines()) if e["job"] == job]
    return lines


def history_partials(env: dict[str, str], job_id: str) -> int | None:
    path = env["DATABASE_URL"][len("sqlite:///") :]
    with sqlite3.connect(path, timeout=10) as db:
        row = db.execute(
            "SELECT partials FROM emq_results_jobresult WHERE id = ?", (job_id,)
        ).fetchone()
    return None if row is None else int(row[0])


def test_generator_partials_arrive_before_the_next_is_produced(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    procs = start(emq_processes, env)
    gates = tmp_path / "gates"
    gates.mkdir()
    result = tasks.gated.delay(3, str(gates))
    seen = []
    for value in result.stream(timeout=20):
        seen.append(value)
        if value.startswith("part-"):
            i = int(value.split("-")[1])
            # the task is blocked on go-<i>: the next partial does not exist yet
            assert not (gates / f"produced-{i + 1}").exists()
            (gates / f"go-{i}").touch()
    assert seen == ["part-0", "part-1", "part-2", "done-3"]
    assert result.get() == "done-3" and result.attempt == 1
    # the trace's line that ends the attempt and the history row count the partials
    done = wait_until(
        lambda: [e for e in trace_lines(env, result.id) if e["event"] == "succeeded"],
        "the succeeded trace line",
        procs=procs,
    )
    assert done[0]["partials"] == 3
    assert wait_until(lambda: history_partials(env, result.id), "the history row") == 3


def test_partial_calls_get_alone_failures_and_astream(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    procs = start(emq_processes, env)
    assert list(tasks.calls_partial.delay(4).stream(timeout=20)) == [
        {"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}, 4,
    ]  # fmt: skip
    # get() alone: the final value; the partials it never streamed are dropped
    streamed_not = tasks.calls_partial.delay(50)
    assert streamed_not.get(timeout=20) == 50
    assert streamed_not.id.encode() not in get_client()._partials
    assert tasks.plain_add.delay(2, 3).get(timeout=20) == 5
    assert list(tasks.plain_add.delay(2, 3).stream(timeout=20)) == [5]
    # a failing generator: its partials, then the failure; get() raises it too
    failing = tasks.fails_after.delay(2)
    parts: list[Any] = []
    with pytest.raises(TaskFailed, match="failed after 2 partials"):
        for value in failing.stream(timeout=20):
            parts.append(value)
    assert parts == [0, 1]
    with pytest.raises(TaskFailed):
        failing.get()

    async def collect() -> list[Any]:
        return [v async for v in tasks.calls_partial.delay(3).astream(timeout=20)]

    assert asyncio.run(collect()) == [{"i": 0}, {"i": 1}, {"i": 2}, 3]
    failed_line = wait_until(
        lambda: [e for e in trace_lines(env, failing.id) if e["event"] == "failed"],
        "the failed trace line",
        procs=procs,
    )
    assert failed_line[0]["partials"] == 2
    assert wait_until(lambda: history_partials(env, failing.id), "the history row") == 2


def test_a_retried_stream_restarts_with_the_new_attempt(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    start(emq_processes, env)
    result = tasks.flaky_stream.delay(str(tmp_path / "marker"))
    attempts = []
    values = []
    for value in result.stream(timeout=20):
        values.append(value)
        attempts.append(result.attempt)
    assert values == ["first-try", "second-a", "second-b", "ok"]
    assert attempts == [1, 2, 2, 2]


def test_eager_mode_streams(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from emq_django.conf import reset_cached_settings

    monkeypatch.setenv("EMQ_EAGER", "true")
    reset_cached_settings()
    try:
        assert list(tasks.calls_partial.delay(2).stream()) == [{"i": 0}, {"i": 1}, 2]
        failing = tasks.fails_after.delay(1)
        parts: list[Any] = []
        with pytest.raises(TaskFailed):
            for value in failing.stream():
                parts.append(value)
        assert parts == [0]
        assert tasks.calls_partial.delay(2).get() == 2
    finally:
        monkeypatch.delenv("EMQ_EAGER")
        reset_cached_settings()


def test_stream_latency_smoke(emq_processes: EmqProcesses, env: dict[str, str]) -> None:
    """Each partial reaches the caller while the task still runs (no figure asserted)."""
    start(emq_processes, env)
    received = []
    for value in tasks.stamps.delay(20, 0.01).stream(timeout=20):
        received.append((value, time.monotonic_ns()))
    lags = [got - sent for sent, got in received[:-1]]
    assert len(lags) == 20 and all(lag > 0 for lag in lags)
