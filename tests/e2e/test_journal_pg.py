"""The broker with its journal in PostgreSQL (EMQ_JOURNAL_URL), as real processes on
a PostgreSQL cluster of the tests' own: guaranteed jobs kept across kill -9, a clear
stop at start on a wrong URL, and PostgreSQL stopped under a running broker:
guaranteed jobs refused with the reason at once, plain jobs flowing, and guaranteed
ones accepted again once it is back, without restarting the broker. (Single active
broker here: active/standby is tests/faults/test_ha.py's.)"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from emq_django.exceptions import JobRefused
from tests.e2e import spine_tasks as tasks
from tests.e2e.test_spine import start_jm, wait_jm_ready
from tests.support import EmqProcesses, start_broker, wait_until
from tests.support.postgres import PgCluster

pytestmark = pytest.mark.e2e

ANSWER_WITHIN = 1.0  # seconds: the done-when line for a refusal


def jobs(pg_cluster: PgCluster, url: str) -> dict[str, int]:
    """The journal's jobs by state, read from PostgreSQL."""
    db = url.rsplit("/", 1)[1]
    rows = pg_cluster.execute("SELECT state, COUNT(*) FROM emq_jobs GROUP BY state", db=db)
    return {state: int(n) for state, n in rows}


def test_guaranteed_jobs_survive_kill_9_and_run_after_the_restart(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    emq_client_env: dict[str, str],
    pg_cluster: PgCluster,
    pg_url: str,
) -> None:
    journal = {"EMQ_JOURNAL_URL": pg_url}
    broker = start_broker(emq_processes, emq_env, extra_env=journal)
    for n in range(3):  # nobody serves the queue yet: they wait in the broker
        tasks.add.apply_async((n, 1), guarantee=True)  # returns once acknowledged
    assert jobs(pg_cluster, pg_url) == {"ready": 3}
    emq_processes.send_signal(broker, signal.SIGKILL)
    emq_processes.wait_for_exit(broker)

    again = start_broker(emq_processes, emq_env, name="broker-2", extra_env=journal)
    emq_processes.wait_for_output(again, "3 guaranteed jobs reloaded")
    assert "postgresql://" in again.stderr()
    jm = start_jm(emq_processes, "A")
    wait_until(
        lambda: jobs(pg_cluster, pg_url) == {"done": 3},
        "the reloaded jobs run to their end",
        timeout=30,
        procs=[again, jm],
    )


def test_a_wrong_journal_url_stops_the_broker_at_start(
    emq_processes: EmqProcesses, pg_cluster: PgCluster
) -> None:
    broker = emq_processes.start(
        "emq_broker", env={"EMQ_JOURNAL_URL": pg_cluster.url("no_such_database")}
    )
    assert emq_processes.wait_for_exit(broker, timeout=30) != 0
    err = broker.stderr()
    assert 'database "no_such_database" does not exist' in err
    assert f"PostgreSQL at postgresql://postgres@127.0.0.1:{pg_cluster.port}" in err
    assert "broker up" not in err


def test_postgresql_down_refuses_guaranteed_jobs_at_once_and_the_broker_recovers(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    emq_client_env: dict[str, str],
    pg_cluster: PgCluster,
    pg_url: str,
) -> None:
    broker = start_broker(emq_processes, emq_env, extra_env={"EMQ_JOURNAL_URL": pg_url})
    jm = start_jm(emq_processes, "A")
    wait_jm_ready(emq_env, "A", 1, procs=[broker, jm])
    assert tasks.add.apply_async((1, 2), guarantee=True).get(timeout=10) == 3

    pg_cluster.stop("immediate")
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(JobRefused, match="PostgreSQL at .* unreachable"):
            tasks.add.apply_async((2, 2), guarantee=True)
        assert time.monotonic() - started < ANSWER_WITHIN
        assert tasks.add.delay(2, 3).get(timeout=10) == 5  # plain jobs flow meanwhile
    assert broker.alive()

    pg_cluster.start()

    def accepted() -> Any:
        try:
            return tasks.add.apply_async((3, 4), guarantee=True)
        except JobRefused:
            return None

    result = wait_until(accepted, "a guaranteed job accepted again", timeout=15, procs=[broker])
    assert result.get(timeout=10) == 7
    assert jobs(pg_cluster, pg_url)["done"] >= 2
