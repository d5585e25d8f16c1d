"""Workflows end to end (issue 34): a real broker and job manager, this process as
the client. The broker starts each step when the ones before it end: a chord's
callback runs once after every member, failures included; a chain goes on after
a step's own retry; a cancel stops it; MONITOR JSON counts workflows."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import emq_django as emq
from tests.e2e import workflow_tasks as tasks
from tests.e2e.test_spine import monitor, run_manage, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until
from tests.support.environ import environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

IMPORTS = "tests.e2e.workflow_tasks"


@pytest.fixture
def env(emq_env: dict[str, str], emq_client_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The broker, the job manager and this test process share these settings."""
    extra = {"EMQ_IMPORTS": IMPORTS, "EMQ_RETRY_BASE": "0.2", "EMQ_RETRY_CAP": "1"}
    with environment(emq_env, extra):
        assert run_manage(emq_env, "migrate", "--noinput").returncode == 0
        yield emq_env


def start(
    procs: EmqProcesses, env: dict[str, str], extra: dict[str, str] | None = None
) -> list[ManagedProcess]:
    broker = start_broker(procs, env, extra_env=extra)
    return [broker, start_jm(procs, env, "wf", [broker])]


def start_jm(
    procs: EmqProcesses, env: dict[str, str], name: str, watch: Sequence[ManagedProcess] = ()
) -> ManagedProcess:
    jm = procs.start(
        "emq_jobmanager", "--queues", "wf:10", "--concurrency", "2", "--name", name,
        name=f"jm-{name}",
    )  # fmt: skip
    wait_jm_ready(env, name, 2, [*watch, jm], timeout=60)
    return jm


def runs(runs_dir: Path) -> Counter[str]:
    log = runs_dir / "runs.log"
    return Counter(log.read_text().splitlines()) if log.exists() else Counter()


def test_a_chord_with_failing_members_runs_its_callback_once_after_every_member(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    start(emq_processes, env)
    rd = str(tmp_path)
    members = [tasks.member.s(i, rd) for i in range(200)]
    flow = emq.chord(members, tasks.collect.s(rd), on_error=tasks.on_failure.s(rd))

    result = flow.delay()

    failing = [i for i in range(200) if i % 7 == 3]
    assert result.get(timeout=120) == {
        "members": 200,
        "errors": len(failing),
        "sum": sum(i for i in range(200) if i % 7 != 3),
    }
    seen = runs(tmp_path)
    assert all(seen[f"member {i}"] == 1 for i in range(200))  # each ran, once
    assert (seen["callback"], seen["on_error"]) == (1, 1)
    wait_until(
        lambda: monitor(env)["workflows"] == {
            "running": 0, "finished": 1, "failed": 0, "cancelled": 0
        },
        "MONITOR JSON to count the finished workflow",
    )  # fmt: skip


def test_a_chain_goes_on_after_a_steps_own_retry_and_each_step_gets_the_last_result(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    start(emq_processes, env)
    rd = str(tmp_path)

    result = emq.chain(tasks.plus.s(1, 2, rd), tasks.flaky_step.s(rd), tasks.plus.s(10, rd)).delay()

    assert result.get(timeout=60) == 14  # 1 + 2, then 3 + 1 on its retry, then 4 + 10
    assert runs(tmp_path) == Counter({"plus 1 2": 1, "flaky 3": 2, "plus 4 10": 1})
    assert [step.get(timeout=10) for step in result.steps] == [3, 4, 14]


def test_a_chains_stream_gives_the_streaming_middle_steps_partials_between_its_start_and_end(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    start(emq_processes, env)
    rd = str(tmp_path)

    result = emq.chain(tasks.plus.s(1, 2, rd), tasks.counting.s(rd), tasks.plus.s(10, rd)).delay()
    events = list(result.stream(timeout=60))

    assert events[-1] == 16  # 1 + 2, doubled, + 10
    assert [(e.kind, e.step, e.value) for e in events[:-1]] == [
        ("start", "root.0", None),
        ("end", "root.0", 3),
        ("start", "root.1", None),
        *[("partial", "root.1", {"counted": i}) for i in range(3)],
        ("end", "root.1", 6),
        ("start", "root.2", None),
        ("end", "root.2", 16),
    ]
    assert {e.task for e in events[2:-3]} == {tasks.counting.name}
    assert runs(tmp_path) == Counter({"plus 1 2": 1, "counting 3": 1, "plus 6 10": 1})


def test_a_chord_of_10000_streams_every_members_end_then_its_callbacks_progress(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    start(emq_processes, env)
    count = 10_000

    result = emq.chord([tasks.square.s(i) for i in range(count)], tasks.summing.s()).delay()
    events = list(result.stream(timeout=120))

    assert events[-1] == sum(i * i for i in range(count))
    ends = {e.step: e.value for e in events[:-1] if e.kind == "end"}
    assert {f"root.{i}": i * i for i in range(count)}.items() <= ends.items()
    callback = [(e.kind, e.value) for e in events[:-1] if e.step == "root.body"]
    assert callback == [
        ("start", None),
        *[("partial", {"summed": n}) for n in range(2000, count + 1, 2000)],
        ("end", events[-1]),
    ]
    kinds = [(e.kind, e.step == "root.body") for e in events[:-1]]
    assert kinds.index(("start", True)) > max(  # every member ended before it started
        n for n, kind in enumerate(kinds) if kind == ("end", False)
    )


def test_a_chain_whose_step_fails_for_good_names_that_step_and_runs_no_later_one(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    start(emq_processes, env)
    rd = str(tmp_path)

    result = emq.chain(tasks.member.s(3, rd), tasks.plus.si(1, 1, rd)).delay()

    with pytest.raises(emq.TaskFailed, match=r"step root\.0 .*member.* failed: member 3"):
        result.get(timeout=60)
    assert runs(tmp_path) == Counter({"member 3": 1})
    counts = wait_until(
        lambda: (c := monitor(env)["workflows"])["failed"] == 1 and c,
        "MONITOR JSON to count the failed workflow",
    )
    assert counts["running"] == 0


def test_a_cancelled_workflow_stops_its_running_step_and_starts_no_further_one(
    emq_processes: EmqProcesses, env: dict[str, str], tmp_path: Path
) -> None:
    procs = start(emq_processes, env)
    rd = str(tmp_path)
    result = emq.chain(tasks.slow.s(1, rd), tasks.plus.s(1, rd)).delay()
    wait_until(lambda: runs(tmp_path)["slow started"] == 1, "the slow step to start", 30, procs)

    assert result.cancel()

    with pytest.raises(emq.Cancelled):
        result.get(timeout=60)
    with pytest.raises(emq.Cancelled):
        result.steps[0].get(timeout=10)
    assert runs(tmp_path) == Counter({"slow started": 1})  # the workflow is over: no more
    assert monitor(env)["workflows"]["cancelled"] == 1


@pytest.mark.parametrize(
    ("journal", "victim"),
    [("sqlite", "broker"), ("postgresql", "broker"), ("sqlite", "jobmanager")],
)
def test_a_guaranteed_chord_goes_on_after_kill_9_and_its_callback_runs_once(
    emq_processes: EmqProcesses,
    env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    journal: str,
    victim: str,
) -> None:
    """200 guaranteed members, every seventh failing, and kill -9 of the broker
    (restarted on the same journal) or of the job manager (another one takes over)
    after about 60 have run: the callback runs once, every member ran, and only
    members in flight at the kill ran twice."""
    extra = {"EMQ_JOURNAL_URL": request.getfixturevalue("pg_url")} if journal != "sqlite" else {}
    broker, jm = start(emq_processes, env, extra)
    rd = str(tmp_path / "runs")
    os.mkdir(rd)
    flow = emq.chord([tasks.kept_member.s(i, rd) for i in range(200)], tasks.kept_collect.s(rd))
    result = flow.delay()  # returns once the broker has journaled it
    wait_until(lambda: len(runs(Path(rd))) >= 60, "60 members to run", 60, [broker, jm])

    killed = broker if victim == "broker" else jm
    emq_processes.send_signal(killed, signal.SIGKILL)
    emq_processes.wait_for_exit(killed)
    assert len(runs(Path(rd))) < 200  # killed midway
    if victim == "broker":
        again = start_broker(emq_processes, env, name="broker-2", extra_env=extra)
        emq_processes.wait_for_output(again, "guaranteed jobs reloaded")
        # sent again under its id: the broker knows it, and this client gets its REPLY
        result = flow.apply_async(job_id=result.id)
    else:
        start_jm(emq_processes, env, "wf-2")

    assert result.get(timeout=150) == {"members": 200, "errors": len(range(3, 200, 7))}
    seen = runs(Path(rd))
    assert seen["kept callback"] == 1
    assert all(seen[f"kept {i}"] >= 1 for i in range(200))  # every member ran
    twice = [i for i in range(200) if seen[f"kept {i}"] > 1]
    assert len(twice) <= 4, twice  # 2 slots and a prefetch each: in flight at the kill
