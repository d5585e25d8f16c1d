"""Attempts are the unit (issue 12): worker deaths, time-outs and cancels end an
attempt as failed and count against ``retries``, and ``get()`` answers the final
outcome only.

Real broker and job manager processes on their own loopback ports; the tasks are
in tests/e2e/attempt_tasks.py and write one line per run to EMQ_ATTEMPT_LOG.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.exceptions import Cancelled, TaskFailed
from emq_django.monitor_client import query
from tests.e2e import attempt_tasks as tasks
from tests.e2e.test_spine import job_manager, monitor, run_manage, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until
from tests.support.environ import environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

IMPORTS = "tests.e2e.attempt_tasks"
RECORDER = "emq_django.results.recorder.DatabaseRecorder"
KILL_GRACE = 2.0


@pytest.fixture
def env(
    emq_env: dict[str, str], emq_client_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, str]]:
    """The broker, job managers and this test process share these settings."""
    extra = {
        "EMQ_IMPORTS": IMPORTS,
        "EMQ_ATTEMPT_LOG": str(tmp_path / "attempts.jsonl"),
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_RETRY_CAP": "1",
        "EMQ_KILL_GRACE": str(KILL_GRACE),
        "EMQ_TRACE_DIR": str(tmp_path / "trace"),
        "EMQ_RECORDER": "",
    }
    with environment(emq_env, extra):
        yield emq_env


def start(
    procs: EmqProcesses, env: dict[str, str], concurrency: int = 2, recorder: bool = False
) -> list[ManagedProcess]:
    broker = start_broker(procs, env)
    jm = procs.start(
        "emq_jobmanager",
        "--queues",
        "attempts:10",
        "--concurrency",
        str(concurrency),
        "--name",
        "att",
        env={"EMQ_RECORDER": RECORDER if recorder else ""},
        name="jm-att",
    )
    wait_jm_ready(env, "att", concurrency, [broker, jm])
    return [broker, jm]


def runs(env: dict[str, str], key: str) -> list[dict[str, Any]]:
    path = Path(env["EMQ_ATTEMPT_LOG"])
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["key"] == key]


def dead_letters(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    doc = json.loads(query(env["EMQ_MONITOR_URL"], b"DEADLETTERS LIST"))
    return {d["id"]: d for d in doc["dead_letters"]}


def trace_events(env: dict[str, str], job: str) -> list[str]:
    events = []
    for path in sorted(Path(env["EMQ_TRACE_DIR"]).glob("trace-*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["job"] == job:
                events.append(event["event"])
    return events


def history_row(env: dict[str, str], job_id: str) -> dict[str, Any] | None:
    path = env["DATABASE_URL"][len("sqlite:///") :]
    with sqlite3.connect(path, timeout=10) as db:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM emq_results_jobresult WHERE id = ?", (job_id,)).fetchone()
    return dict(row) if row is not None else None


def migrate(env: dict[str, str]) -> None:
    done = run_manage(env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr


# ---- worker deaths ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "reason"),
    [("exit", "WorkerLost: exit code 1"), ("abort", "WorkerLost: killed by signal 6")],
)
def test_poison_job_runs_three_times_then_dead_letter_while_others_flow(
    emq_processes: EmqProcesses, env: dict[str, str], how: str, reason: str
) -> None:
    procs = start(emq_processes, env)
    key = f"poison-{how}"
    poisoned = tasks.poison.apply_async((key, how), job_id=key)  # retries=2
    others = [tasks.add.delay(n, 1) for n in range(40)]
    assert [h.get(timeout=60) for h in others] == [n + 1 for n in range(40)]
    with pytest.raises(TaskFailed) as failed:
        poisoned.get(timeout=60)
    assert failed.value.type == "emq_django.exceptions.WorkerLost"
    letter = wait_until(lambda: dead_letters(env).get(key), "the dead letter", 15, procs)
    assert letter["error"] == reason
    assert letter["attempts"] == 3
    time.sleep(2.0)  # and it is not run again
    assert len(runs(env, key)) == 3
    assert len({r["pid"] for r in runs(env, key)}) == 3  # each run killed its process
    # the job manager is still whole: both slots serve
    assert job_manager(monitor(env), "att")["slots"] == 2  # type: ignore[index]
    assert [h.get(timeout=30) for h in [tasks.add.delay(1, 1), tasks.add.delay(2, 2)]] == [2, 4]


def test_poison_deep_body_runs_three_times_then_dead_letter(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    """A body nested 985 lists deep (sent past our client's checks) used to kill the
    worker's decoder with RecursionError; now each attempt fails with the reason,
    the worker lives on, and with retries=2 the job is tried 3 times."""
    import zmq

    from emq_django.protocol import frames as F

    procs = start(emq_processes, env)
    args = "[" * 985 + "1" + "]" * 985
    body = (
        '["run", {"callable": "add", "path": "tests.e2e.attempt_tasks", "args": ['
        + args
        + ', 1], "kwargs": {}}]'
    ).encode()
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(env["EMQ_FRONTEND_BIND"])
        headers = b"reply-requested,retry-count:2,task:tests.e2e.attempt_tasks.add"
        sock.send_multipart(F.encode_request(b"deep-poison", b"attempts", headers, body))
        reply = None
        deadline = time.monotonic() + 30
        while reply is None and time.monotonic() < deadline:
            if sock.poll(500):
                cmd = F.decode(sock.recv_multipart())
                if isinstance(cmd, F.Reply) and cmd.request_msgid == b"deep-poison":
                    reply = cmd
    finally:
        sock.close()
        ctx.destroy(linger=0)
    assert reply is not None and reply.failed
    assert "too deep" in json.loads(reply.body)["error"]["message"] or "deep" in reply.body.decode()
    letter = wait_until(lambda: dead_letters(env).get("deep-poison"), "the dead letter", 15, procs)
    assert letter["attempts"] == 3 and "ProtocolError" in letter["error"]
    assert all(p.alive() for p in procs)
    assert "RecursionError" not in procs[1].stderr()
    assert tasks.add.delay(2, 2).get(timeout=30) == 4


def test_retries_zero_worker_death_runs_once(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    procs = start(emq_processes, env)
    handle = tasks.dies_once.apply_async(("once",), job_id="once")
    with pytest.raises(TaskFailed) as failed:
        handle.get(timeout=30)
    assert failed.value.type == "emq_django.exceptions.WorkerLost"
    assert "exit code 1" in failed.value.message
    time.sleep(3.0)  # more than a retry delay and the heartbeat expiry
    assert len(runs(env, "once")) == 1
    assert all(p.alive() for p in procs)


def test_worker_deaths_inside_coalesced_and_batched_bursts_lose_nothing(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    """Pipelined delay() calls leave as REQUESTS messages and reach the worker
    processes several per REQUEST (docs/eventmq-wire.md §7); jobs that os._exit
    their process sit among them. Every other job's answer arrives once (the
    answers a dying process held go out through its job manager), every
    at-most-once job ran exactly once and failed with WorkerLost, and the job
    manager goes on serving."""
    procs = start(emq_processes, env)
    assert tasks.add.delay(0, 0).get(timeout=30) == 0  # add is known fast here
    handles: list[Any] = []
    deaths: list[Any] = []
    for round_ in range(3):
        for n in range(300):
            if n in (50, 150, 250):
                key = f"burst-{round_}-{n}"
                deaths.append((key, tasks.dies_once.apply_async((key,), job_id=key)))
            else:
                handles.append((n, tasks.add.delay(n, round_)))
    assert [h.get(timeout=60) for _, h in handles] == [
        n + r for r in range(3) for n in range(300) if n not in (50, 150, 250)
    ]
    for _key, handle in deaths:
        with pytest.raises(TaskFailed) as failed:
            handle.get(timeout=60)
        assert failed.value.type == "emq_django.exceptions.WorkerLost"
    time.sleep(3.0)  # more than a retry delay and the heartbeat expiry
    assert {key: len(runs(env, key)) for key, _ in deaths} == {key: 1 for key, _ in deaths}
    assert all(p.alive() for p in procs)
    counters = monitor(env)["counters"]
    assert counters["succeeded"] >= len(handles) + 1
    assert tasks.add.delay(2, 2).get(timeout=30) == 4


# ---- time limits and cancel ---------------------------------------------------------


def test_return_during_the_grace_is_a_timeout(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    start(emq_processes, env, concurrency=1)
    handle = tasks.late.apply_async(("late",), job_id="late")  # timeout=1, returns at 1.6 s
    with pytest.raises(TaskFailed) as failed:
        handle.get(timeout=30)
    assert failed.value.type == "TimeoutError"
    (run,) = runs(env, "late")
    wait_until(lambda: not Path(f"/proc/{run['pid']}").exists(), "the process to end", 15)
    # a fresh process takes the slot
    assert tasks.add.delay(2, 3).get(timeout=30) == 5


def test_cancel_of_a_running_job_kills_it_and_get_raises_cancelled(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    from emq_django.client import get_client

    migrate(env)
    start(emq_processes, env, concurrency=1, recorder=True)
    handle = tasks.sleeper.apply_async(("cancel-me",), job_id="cancel-me")
    (run,) = wait_until(lambda: runs(env, "cancel-me"), "the job to start", 30)
    asked = time.monotonic()
    assert get_client().cancel("cancel-me") is True
    with pytest.raises(Cancelled):
        handle.get(timeout=KILL_GRACE + 10)
    took = time.monotonic() - asked
    print(f"\ncancel of a running job: get() raised Cancelled after {took:.2f} s")
    assert took <= KILL_GRACE + 1.0
    assert not Path(f"/proc/{run['pid']}").exists() or _zombie(run["pid"])
    assert tasks.add.delay(1, 2).get(timeout=30) == 3  # its slot was replaced
    assert "cancelled" in trace_events(env, "cancel-me")
    row = wait_until(lambda: history_row(env, "cancel-me"), "the history row", 15)
    assert row["status"] == "cancelled" and row["task"] == "tests.e2e.attempt_tasks.sleeper"
    time.sleep(1.0)
    assert len(runs(env, "cancel-me")) == 1  # not retried


def test_jobs_sent_ahead_to_a_process_busy_past_the_heartbeat_limit_still_run(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    """A process that runs one job for longer than the heartbeat limit reads no
    heartbeats meanwhile; the jobs the broker sent ahead to it wait in its socket.
    Finding them there after the job, it must not take the broker for gone and
    connect again (which dropped them: held, then failed as WorkerLost)."""
    migrate(env)
    start(emq_processes, env, concurrency=1)
    assert [tasks.add.delay(n, 1).get(timeout=30) for n in range(30)] == [n + 1 for n in range(30)]
    from emq_django.conf import cached_settings

    settings = cached_settings()
    limit = settings.HEARTBEAT_INTERVAL * settings.HEARTBEAT_LIVENESS
    busy = tasks.sleeper.apply_async(("long", limit + 1.5), job_id="long")
    wait_until(lambda: runs(env, "long"), "the long job to start", 30)
    behind = [tasks.add.delay(n, 100) for n in range(5)]
    assert busy.get(timeout=30) == 1
    assert [h.get(timeout=30) for h in behind] == [n + 100 for n in range(5)]
    counters = monitor(env)["counters"]
    assert counters.get("worker_lost", 0) == 0 and counters["succeeded"] >= 36, counters


def test_cancel_of_a_prefetched_job_that_has_not_started_means_it_never_runs(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    """A job the broker has handed to a worker process that is busy with another
    (it waits in that process's prefetch) is "stopping" when cancelled: it must
    never start, its get() raises Cancelled, and the job that runs is not killed."""
    migrate(env)
    start(emq_processes, env, concurrency=1)
    # short jobs first: the process's credit grows past 1 (worker/credit.py)
    assert [tasks.add.delay(n, 1).get(timeout=30) for n in range(30)] == [n + 1 for n in range(30)]
    busy = tasks.sleeper.apply_async(("busy", 3.0), job_id="busy")
    wait_until(lambda: runs(env, "busy"), "the busy job to start", 30)
    behind = tasks.sleeper.apply_async(("behind", 0.1), job_id="behind")
    # in flight at the broker (dispatched to the busy process), so "stopping"
    states = wait_until(
        lambda: (
            (doc := json.loads(query(env["EMQ_MONITOR_URL"], b"CANCEL behind")))
            and (doc["stopping"] or doc["cancelled"])
            and doc
        ),
        "the broker to know the job",
        15,
    )
    assert states["stopping"] == ["behind"], states  # it waited in the process's prefetch
    with pytest.raises(Cancelled):
        behind.get(timeout=30)
    assert busy.get(timeout=30) == 1  # the running job was not killed for it
    (run,) = runs(env, "busy")
    assert tasks.add.delay(2, 2).get(timeout=30) == 4
    time.sleep(1.0)
    assert runs(env, "behind") == []  # it never started
    assert trace_events(env, "behind")[-1] == "cancelled"
    assert len(runs(env, "busy")) == 1
    assert Path(f"/proc/{run['pid']}").exists()  # the same process goes on


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ---- honest history and counts ------------------------------------------------------


@pytest.mark.django_db  # Retry notes the new job's original (RetryLink) in this process's db
def test_timed_out_job_history_has_task_and_queue_and_retry_works(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    from emq_django.results import actions
    from emq_django.results.models import JobResult

    migrate(env)
    start(emq_processes, env, concurrency=2, recorder=True)
    done = [tasks.add.delay(n, n) for n in range(10)]
    assert [h.get(timeout=30) for h in done] == [2 * n for n in range(10)]
    with pytest.raises(TaskFailed) as failed:
        tasks.overrun.apply_async(("over",), job_id="over").get(timeout=30)
    assert failed.value.type == "TimeoutError"
    row = wait_until(
        lambda: (r := history_row(env, "over")) and r["status"] == "timed_out" and r,
        "the timed-out job's history row",
        15,
    )
    assert row["task"] == "tests.e2e.attempt_tasks.overrun" and row["queue"] == "attempts"
    assert json.loads(row["args"]) == ["over"]
    # the admin's Retry sends it again as a new job
    fields = {f.attname for f in JobResult._meta.concrete_fields}
    new_id = actions.retry(JobResult(**{k: v for k, v in row.items() if k in fields}))
    wait_until(lambda: len(runs(env, "over")) == 2, "the retried job to run", 30)
    wait_until(
        lambda: (r := history_row(env, new_id)) and r["status"] == "timed_out",
        "the retried job's row",
        30,
    )
    # workers were replaced twice: jobs done still equals succeeded + failed
    doc = monitor(env)
    counters = doc["counters"]
    assert counters["succeeded"] == 10 and counters["failed"] == 2
    assert job_manager(doc, "att")["jobs_done"] == 12  # type: ignore[index]


# ---- a result is final only when the job is -----------------------------------------

FLAKY_CLIENT = """
import json
from tests.e2e import attempt_tasks as t
from emq_django.handles import history_installed
handle = t.flaky.apply_async((KEY,), job_id=KEY)
print("HISTORY=" + json.dumps(history_installed()))
print("VALUE=" + json.dumps(handle.get(timeout=60)))
"""


@pytest.mark.parametrize("with_history", [True, False], ids=["history", "no-history"])
def test_task_failing_twice_then_succeeding_get_returns_its_value(
    emq_processes: EmqProcesses,
    env: dict[str, str],
    with_history: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrate(env)
    # retries 1 s then 2 s later: get() first looks at the history after 1 s, when
    # attempt 1 has failed and attempt 2 has not run yet
    monkeypatch.setenv("EMQ_RETRY_BASE", "1.0")
    monkeypatch.setenv("EMQ_RETRY_CAP", "2")
    start(emq_processes, env, recorder=True)
    key = f"flaky-{with_history}"
    extra: dict[str, str] = {}
    if not with_history:
        extra["DJANGO_SETTINGS_MODULE"] = "tests.e2e.nohistory_settings"
    script = FLAKY_CLIENT.replace("KEY", repr(key))
    out = run_manage(env, "shell", "-c", script, extra_env=extra, timeout=90)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert json.loads(lines["HISTORY"]) is with_history
    assert json.loads(lines["VALUE"]) == f"{key} ok"
    assert len(runs(env, key)) == 3
