"""EventMQ 0.3.13's client schedules through our broker and ``emq_scheduler``.

``eventmq.client.messages.schedule`` (9 frames: interval or cron) creates the
schedule, which fires on our job manager; ``schedule(..., unschedule=True)`` (the
way EventMQ users unschedule: ``jobs.unschedule`` always raises) removes it. The
document's 7-frame SCHEDULE, sent by our own client, works too."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.client import Client
from emq_django.scheduler.keys import task_key
from tests.e2e import scheduler_tasks
from tests.e2e.scheduler_support import (
    TICK,
    gaps,
    history,
    manage,
    sends_after_a_sentinel,
    sent_ticks,
    shell,
    start_jobmanager,
    start_scheduler,
)
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.interop, pytest.mark.timeout(90)]

eventmq = pytest.importorskip("eventmq", reason="make test installs eventmq==0.3.13")

PROTOCOL = b"eMQP/1.0"


@pytest.fixture
def marker(tmp_path: Path, emq_env: dict[str, str], emq_processes: EmqProcesses) -> Iterator[Path]:
    path = tmp_path / "ticks.log"
    emq_env[scheduler_tasks.MARKER_ENV] = str(path)
    emq_processes.env[scheduler_tasks.MARKER_ENV] = str(path)
    manage(emq_env, "migrate", "-v0")
    yield path


def rows(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    out = shell(
        env,
        "import json\n"
        "from emq_django.scheduler.models import ScheduledJob\n"
        "print('ROWS=' + json.dumps({j.name: {'task': j.task, 'args': j.args, 'queue': j.queue,"
        " 'interval': j.interval_seconds, 'cron': j.cron, 'nohaste': j.nohaste,"
        " 'guarantee': j.guarantee, 'source': j.source} for j in ScheduledJob.objects.all()}))\n",
    )
    return json.loads(out.split("ROWS=")[-1])  # type: ignore[no-any-return]


def test_eventmq_schedule_and_unschedule(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    from eventmq.client.messages import schedule
    from eventmq.sender import Sender

    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    sched = start_scheduler(emq_processes)
    sender = Sender()
    sender.connect(emq_env["EMQ_BROKER_URL"])
    try:
        t0 = time.time()
        assert schedule(sender, TICK, interval_secs=1, args=["emq"], queue="sched")
        assert schedule(sender, TICK, cron="*/5 * * * *", args=["cron"], headers=("nohaste",))
        runs = wait_until(lambda: history(marker, "emq")[2:], "3 runs of the EventMQ schedule", 10)
        print(f"\nEventMQ schedule: first run {history(marker, 'emq')[0] - t0:.2f} s after sending")
        stored = rows(emq_env)
        key = task_key(TICK, ["emq"])
        assert stored[key] == {
            "task": TICK,
            "args": ["emq"],
            "queue": "sched",
            "interval": 1.0,
            "cron": "",
            "nohaste": False,
            "guarantee": True,
            "source": "wire",
        }
        cron_row = stored[task_key(TICK, ["cron"])]
        assert (cron_row["cron"], cron_row["nohaste"], cron_row["interval"]) == (
            "*/5 * * * *",
            True,
            None,
        )
        print(f"gaps between runs: {gaps(runs)}")
        # each tick sent once, a second apart on the grid of the first
        ticks = sent_ticks(emq_env, key)
        offsets = [(t - ticks[0]) / dt.timedelta(seconds=1) for t in ticks]
        assert all(o == int(o) for o in offsets) and offsets == sorted(set(offsets)), offsets

        assert schedule(sender, TICK, args=["emq"], unschedule=True)
        assert schedule(sender, TICK, args=["cron"], unschedule=True)
        wait_until(lambda: rows(emq_env) == {}, "both schedules removed", 10)
        assert sends_after_a_sentinel(emq_env, sched, (key,)) == [], "no ticks after UNSCHEDULE"
    finally:
        sender.zsocket.close(linger=0)


def test_an_eventmq_cron_schedule_waits_for_its_next_match(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    """Issue 29 item 8: a cron SCHEDULE from EventMQ's client (no ``nohaste``) runs
    first when its expression next matches, not when it is stored."""
    from eventmq.client.messages import schedule
    from eventmq.sender import Sender

    start_broker(emq_processes, emq_env)
    start_scheduler(emq_processes)
    sender = Sender()
    sender.connect(emq_env["EMQ_BROKER_URL"])
    try:
        assert schedule(sender, TICK, cron="0 0 1 1 *", args=["new-year"], queue="sched")
        key = task_key(TICK, ["new-year"])
        wait_until(lambda: key in rows(emq_env), "the schedule stored", 10)
        out = shell(
            emq_env,
            "from emq_django.scheduler.models import ScheduledJob\n"
            f"j = ScheduledJob.objects.get(name={key!r})\n"
            "print('ROW', j.run_count, j.last_run_at, "
            "j.next_run_at == j.timing.next_after(j.created_at))\n",
        )
        assert out.split("ROW ")[-1].split() == ["0", "None", "True"], out
    finally:
        sender.zsocket.close(linger=0)


def test_seven_frame_schedule_from_our_client(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    client = Client(emq_env["EMQ_BROKER_URL"])
    try:
        path, name = TICK.rsplit(".", 1)
        body = json.dumps(
            ["run", {"path": path, "callable": name, "args": ["seven"], "kwargs": {}}]
        )
        # sent before any scheduler runs: the broker holds it for the first one
        client.send_frames(
            [b"", PROTOCOL, b"SCHEDULE", b"s1", b"sched", b"interval:1", body.encode()], b"s1"
        )
        start_scheduler(emq_processes)
        wait_until(lambda: history(marker, "seven")[1:], "2 runs of the 7-frame schedule", 10)
        client.send_frames(
            [b"", PROTOCOL, b"UNSCHEDULE", b"u1", b"sched", b"", body.encode()], b"u1"
        )
        wait_until(lambda: rows(emq_env) == {}, "the schedule removed", 10)
    finally:
        client.close()
