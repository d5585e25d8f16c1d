"""The scheduler end to end: broker, job manager and ``emq_scheduler`` as processes,
schedules made with ``emq.schedule`` in a ``manage.py shell``; the job history is
the marker file that ``scheduler_tasks.tick`` appends to. Run with -s for figures."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from emq_django.monitor_client import status
from emq_django.scheduler.keys import task_key
from tests.e2e import scheduler_tasks
from tests.e2e.scheduler_support import (
    TICK,
    gaps,
    history,
    manage,
    planned_run,
    sends_after_a_sentinel,
    sent_ticks,
    shell,
    start_jobmanager,
    start_scheduler,
)
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture
def marker(tmp_path: Path, emq_env: dict[str, str], emq_processes: EmqProcesses) -> Iterator[Path]:
    path = tmp_path / "ticks.log"
    emq_env[scheduler_tasks.MARKER_ENV] = str(path)
    emq_processes.env[scheduler_tasks.MARKER_ENV] = str(path)
    manage(emq_env, "migrate", "-v0")
    yield path


def test_every_second_with_and_without_nohaste_then_unschedule(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    sched = start_scheduler(emq_processes)

    out = shell(
        emq_env,
        "import time, emq_django as emq\n"
        "t0 = time.time()\n"
        f"a = emq.schedule({TICK!r}, every=1, args=['nohaste'], nohaste=True, queue='sched')\n"
        f"b = emq.schedule({TICK!r}, every=1, args=['haste'], queue='sched')\n"
        "print('PLAN', t0, time.time(), a.name, a.next_run_at.timestamp(), b.name,"
        " b.next_run_at.timestamp())\n",
    )
    t0, t1, late, late_first, soon, soon_first = out.split("PLAN ")[-1].split()
    before, after = float(t0), float(t1)
    # planned when schedule() ran: at once, or one interval later with nohaste
    assert before <= float(soon_first) <= after
    assert before + 1 <= float(late_first) <= after + 1
    # each tick sent once, on the grid of the first: the interval keeps its phase (a
    # tick may be absorbed by a catch-up when the machine stalls: not asserted away)
    for name, first in ((late, late_first), (soon, soon_first)):
        ticks = wait_until(
            lambda n=name: sent_ticks(emq_env, n)[3:] and sent_ticks(emq_env, n),
            f"4 ticks of {name}",
            15,
        )
        start = dt.datetime.fromtimestamp(float(first), dt.UTC)
        offsets = [(t - start) / dt.timedelta(seconds=1) for t in ticks]
        assert offsets[0] == 0 and all(o == int(o) for o in offsets), offsets
        assert offsets == sorted(set(offsets)), offsets
    wait_until(
        lambda: history(marker, "nohaste")[3:] and history(marker, "haste")[3:],
        "the ticks' jobs ran",
    )
    runs = history(marker, "nohaste")
    print(f"\nnohaste: first run {runs[0] - before:.3f} s after schedule(), gaps {gaps(runs)}")

    out = shell(
        emq_env,
        "import emq_django as emq\n"
        f"a = emq.unschedule({TICK!r}, args=['nohaste'])\n"
        f"b = emq.unschedule({TICK!r}, args=['haste'])\n"
        "print(a, b)\n",
    )
    assert "True True" in out
    assert sends_after_a_sentinel(emq_env, sched, (late, soon)) == [], "no ticks after unschedule"


def test_orm_changes_take_effect_within_two_seconds(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    sched = start_scheduler(emq_processes)
    out = shell(
        emq_env,
        "import time\n"
        "from emq_django.scheduler.models import ScheduledJob\n"
        "t = time.time()\n"
        f"ScheduledJob.objects.create(name='orm', task={TICK!r}, args=['orm'], queue='sched', "
        "interval_seconds=3600, nohaste=True)\n"
        "print('T', t)\n",
    )
    t0 = float(out.split("T ")[-1])
    assert planned_run(emq_env, "orm") >= t0 + 3600, "nohaste, every hour: in an hour"
    # an update() that bypasses save(): the scheduler plans it on its own
    out = shell(
        emq_env,
        "import time\n"
        "from emq_django.scheduler.models import ScheduledJob\n"
        "ScheduledJob.objects.filter(name='orm').update(interval_seconds=0.5)\n"
        "print('T', time.time())\n",
    )
    t1 = float(out.split("T ")[-1])
    first = wait_until(lambda: history(marker, "orm"), "a run after the change", timeout=5)[0]
    print(f"\nORM update() -> first run after {first - t1:.2f} s (created {t1 - t0:.1f} s before)")
    assert first - t1 <= 2.0
    out = shell(
        emq_env,
        "import time\n"
        "from emq_django.scheduler.models import ScheduledJob\n"
        "j = ScheduledJob.objects.get(name='orm'); j.enabled = False; j.save()\n"
        "print('T', time.time())\n",
    )
    assert sends_after_a_sentinel(emq_env, sched, ("orm",)) == [], "disabled: no more ticks"


def test_one_catch_up_run_after_ten_seconds_down(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    sched = start_scheduler(emq_processes, "scheduler-1")
    shell(
        emq_env,
        f"import emq_django as emq; emq.schedule({TICK!r}, every=1, args=['c'], queue='sched')",
    )
    key = task_key(TICK, ["c"])
    wait_until(lambda: sent_ticks(emq_env, key)[2:], "3 ticks sent")
    emq_processes.stop(sched)
    before = sent_ticks(emq_env, key)
    time.sleep(10)  # the downtime itself: ten ticks pass with no scheduler
    restarted = dt.datetime.now(dt.UTC)
    start_scheduler(emq_processes, "scheduler-2")
    ticks = wait_until(
        lambda: sent_ticks(emq_env, key)[len(before) + 2 :] and sent_ticks(emq_env, key),
        "3 ticks sent after the restart",
    )[len(before) :]
    print(f"\ndown 10 s; ticks sent after the restart: {[t.isoformat() for t in ticks]}")
    # one run stands for all the missed ticks (due at the first of them); the next
    # ticks sent are the ones after the restart, on the same grid
    missed = [t for t in ticks if t < restarted]
    assert missed == [before[-1] + dt.timedelta(seconds=1)], ticks
    offsets = [(t - before[0]) / dt.timedelta(seconds=1) for t in ticks]
    assert all(o == int(o) for o in offsets), offsets
    log = emq_processes.processes[-1].stderr()
    assert "while no scheduler ran; 1 run(s) (catch-up policy 'once')" in log


def test_first_tick_runs_once_when_the_scheduler_starts_before_the_broker(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    """Issue 29 item 6: the first REQUEST waited in the socket and reached the broker
    as it came up, its ACK did not come in time, and the resend went under a new job
    id: the tick ran twice. A tick's job id is fixed by the tick now."""
    shell(
        emq_env,
        f"import emq_django as emq; emq.schedule({TICK!r}, every=3600, args=['early'], "
        "queue='sched')",
    )
    sched = start_scheduler(emq_processes)
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes)
    wait_until(lambda: "sent " in sched.stderr(), "the scheduler's tick acknowledged", 30)
    # every REQUEST the scheduler sent reached the broker before the ACK it waited
    # for; once nothing waits or runs, every job the broker took has run
    url = emq_env["EMQ_MONITOR_URL"]

    def settled() -> dict[str, object] | None:
        doc = status(url, timeout=5.0)
        busy = doc["in_flight"] or any(q["depth"] for q in doc["queues"])
        return None if busy or not doc["counters"]["succeeded"] else doc

    doc = wait_until(settled, "the broker idle after the tick's job", 30)
    assert doc["counters"]["succeeded"] == 1, doc["counters"]
    assert len(history(marker, "early")) == 1


def test_a_resent_tick_is_the_same_job(
    emq_processes: EmqProcesses, emq_env: dict[str, str], marker: Path
) -> None:
    """A broker that takes the REQUEST but whose ACK never comes: the scheduler sends
    the tick again, under the same job id, so that a broker de-duplicates it."""
    shell(
        emq_env,
        f"import emq_django as emq; emq.schedule({TICK!r}, every=3600, args=['r'], queue='sched')",
    )
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # a broker that never acknowledges
    silent.bind(emq_env["EMQ_FRONTEND_BIND"])
    try:
        emq_processes.env["EMQ_ACK_TIMEOUT"] = "1"
        start_scheduler(emq_processes)
        ids: list[bytes] = []

        def two_requests() -> bool:
            while silent.poll(0):
                frames = silent.recv_multipart()
                if frames[3] == b"REQUEST":
                    ids.append(frames[4])
            return len(ids) >= 2

        wait_until(two_requests, "the tick sent twice", 30)
        assert ids[0] == ids[1], ids
    finally:
        silent.close(linger=0)
        context.destroy(linger=0)
