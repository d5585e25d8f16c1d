"""Worker processes are replaced after --max-jobs-per-worker jobs, or once they grow
past --max-memory-per-worker, and no job is lost on the way."""

from __future__ import annotations

import pytest

from emq_django.monitor_client import status
from tests.support import EmqProcesses, port_of

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(emq_client_env: dict[str, str]) -> dict[str, str]:
    """This process as a client of the test's broker (see conftest)."""
    return emq_client_env


def worker_pids(procs: EmqProcesses, env: dict[str, str], *options: str, jobs: int) -> list[int]:
    from tests.e2e.spine_tasks import whoami

    broker = procs.start("emq_broker", name="broker")
    for key in ("EMQ_MONITOR_BIND", "EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND"):
        procs.wait_for_port(port_of(env[key]), proc=broker)
    procs.start(
        "emq_jobmanager",
        "--queues",
        "spine:10",
        "--concurrency",
        "1",
        *options,
        env={"EMQ_IMPORTS": "tests.e2e.spine_tasks", "SPINE_JM_NAME": "R"},
        name="jm",
    )
    pids = []
    for n in range(jobs):  # one at a time: each result says which process ran it
        pids.append(whoami.delay(str(n)).get(timeout=20)["pid"])
    assert status(env["EMQ_MONITOR_URL"])["counters"]["succeeded"] == jobs
    return pids


def test_worker_process_is_replaced_after_max_jobs(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    pids = worker_pids(emq_processes, client, "--max-jobs-per-worker", "3", jobs=9)
    # one process at a time, three jobs each
    assert [len(set(pids[i : i + 3])) for i in (0, 3, 6)] == [1, 1, 1]
    assert len(set(pids)) == 3, pids


def test_worker_process_is_replaced_above_max_memory(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    # any Python process is past 1 MB: every job is the last of its process
    pids = worker_pids(emq_processes, client, "--max-memory-per-worker", "1", jobs=4)
    assert len(set(pids)) == 4, pids
