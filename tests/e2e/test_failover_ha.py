"""Failover in our peers with the real active/standby brokers (issue 32: A's
PostgreSQL journal and lease, B's broker process, C's peers): a client and a job
manager given both brokers' addresses go on after ``kill -9`` of the active one,
and ``get()`` of a guaranteed job that ran across it returns its value. The
PostgreSQL cluster is the tests' own (tests/support/postgres.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from emq_django.client import get_client, reset_client
from emq_django.conf import reset_cached_settings
from tests.e2e import failover_tasks as tasks
from tests.e2e.test_failover import Sender
from tests.e2e.test_ha_broker import Pair, pair_procs, wait_role  # noqa: F401 (a fixture)
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LISTED = ("EMQ_BROKER_URL", "EMQ_WORKER_URL", "EMQ_MONITOR_URL")


def test_a_client_and_a_job_manager_with_both_brokers_go_on_after_kill_9(
    pair_procs: EmqProcesses,  # noqa: F811
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = Pair(pair_procs, pg_url, ttl=1.0)
    env = {key: f"{pair.env1[key]},{pair.env2[key]}" for key in LISTED}
    env |= {
        "EMQ_IMPORTS": "tests.e2e.failover_tasks",
        "EMQ_FAILOVER_LOG": str(tmp_path / "runs.jsonl"),
        "EMQ_RECORDER": "",
        "EMQ_ACK_TIMEOUT": "10",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_cached_settings()
    reset_client()
    try:
        jm = pair_procs.start(
            "emq_jobmanager", "--queues", "failover:10", "--concurrency", "1",
            "--name", "fo", env=env, name="jm",
        )  # fmt: skip
        wait_jm_ready(env, "fo", 1, [jm, pair.b1])
        running = tasks.slow.delay("ha", 2.0)  # guaranteed, with a reply
        wait_until(lambda: tasks.runs("ha"), "the job running")
        sender = Sender()
        sender.start()
        wait_until(lambda: len(sender.handles) >= 20 or sender.errors, "jobs sent to b1")

        pair_procs.send_signal(pair.b1, signal.SIGKILL)
        killed = time.monotonic()
        # the client notes the new broker at its first answer (an ACK, for this sender)
        client = get_client()
        wait_until(
            lambda: client.broker_changes or sender.errors, "b2's first answer", 20, (), 0.005
        )
        first_ack = time.monotonic() - killed
        count = len(sender.handles)
        wait_until(lambda: len(sender.handles) >= count + 20 or sender.errors, "jobs to b2")
        sender.stop.set()
        sender.join(timeout=10)
        assert sender.errors == []
        assert wait_role(pair.env2, "active", [pair.b2])["epoch"] == 2
        for x, handle, _, _ in sender.handles:
            assert handle.get(timeout=20) == 2 * x
        assert running.get(timeout=20) == "done ha"
        assert tasks.runs("ha") in (1, 2)  # (2: broker 2 ran it again meanwhile)
        print(f"\nkill -9 of the active -> first answer from the new one: {first_ack:.3f} s")
    finally:
        reset_client()
        reset_cached_settings()
