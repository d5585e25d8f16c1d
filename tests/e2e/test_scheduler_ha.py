"""High availability on PostgreSQL: two ``emq_scheduler`` processes for 60 s with a
1 s schedule; every tick fires exactly once.

The job history is checked three ways: each scheduler logs the due time of every
tick it sent (``sent ... (due <time>)``), the broker's trace log has one
``enqueued`` line per job with the task's name, and the task appends one line per
run to a marker file. Skipped when PostgreSQL is unreachable at ``EMQ_TEST_PG``
(default ``postgres://postgres@127.0.0.1:5432/test``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import scheduler_tasks
from tests.e2e.scheduler_support import (
    TICK,
    history,
    manage,
    shell,
    start_jobmanager,
    start_scheduler,
)
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

PG_URL = os.environ.get("EMQ_TEST_PG", "postgres://postgres@127.0.0.1:5432/test")
RUN_SECONDS = 60
SENT = re.compile(r"sent (\S+) for schedule (\S+) \(due ([^)]+)\)")


def _connect(url: str):  # type: ignore[no-untyped-def]
    psycopg = pytest.importorskip("psycopg", reason="pip install 'psycopg[binary]' (dev extra)")
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is unreachable at {url}: {exc}")


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test, dropped afterwards."""
    admin = _connect(PG_URL)
    name = f"emq_sched_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_two_schedulers_on_postgres_fire_every_tick_once(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    pg_database: str,
    tmp_path: Path,
) -> None:
    marker, trace = tmp_path / "ticks.log", tmp_path / "trace"
    extra = {
        "DATABASE_URL": pg_database,
        "EMQ_TRACE_DIR": str(trace),
        scheduler_tasks.MARKER_ENV: str(marker),
    }
    emq_env.update(extra)
    emq_processes.env.update(extra)
    manage(emq_env, "migrate", "-v0")
    start_broker(emq_processes, emq_env)
    start_jobmanager(emq_processes, concurrency=2)
    a = start_scheduler(emq_processes, "scheduler-a")
    b = start_scheduler(emq_processes, "scheduler-b")

    code = "import time, emq_django as emq; emq.{}({!r}, {}args=['ha']); print('T', time.time())"
    out = shell(emq_env, code.format("schedule", TICK, "every=1, queue='sched', "))
    started = float(out.split("T ")[-1])
    time.sleep(RUN_SECONDS)
    out = shell(emq_env, code.format("unschedule", TICK, ""))
    window = float(out.split("T ")[-1]) - started
    time.sleep(1.0)
    emq_processes.stop(a)
    emq_processes.stop(b)

    # 1. the schedulers' own account: which due times each one sent
    dues = {
        p.name: [dt.datetime.fromisoformat(m[2]) for m in SENT.findall(p.stderr())] for p in (a, b)
    }
    every = sorted(dues["scheduler-a"] + dues["scheduler-b"])
    duplicated = [t for t, n in Counter(every).items() if n > 1]
    steps = {round((y - x).total_seconds(), 6) for x, y in zip(every, every[1:], strict=False)}
    print(
        f"\n{len(every)} ticks in {window:.1f} s: scheduler-a fired {len(dues['scheduler-a'])}, "
        f"scheduler-b fired {len(dues['scheduler-b'])}; steps between ticks {sorted(steps)}"
    )
    assert duplicated == [], "a tick fired twice"
    assert steps == {1.0}, "a tick was skipped (or the phase moved)"
    assert window - 1 <= len(every) <= window + 1, f"{len(every)} ticks in {window:.1f} s"

    # 2. the broker's trace: one enqueued job per tick, each with the task's name
    def enqueued() -> list[dict[str, object]]:
        lines = [
            json.loads(x) for f in sorted(trace.glob("*.jsonl")) for x in f.read_text().splitlines()
        ]
        return [e for e in lines if e["event"] == "enqueued" and e["task"] == TICK]

    jobs = wait_until(
        lambda: len(enqueued()) >= len(every) and enqueued(), "the trace of every job"
    )
    assert len(jobs) == len(every)
    assert len({j["job"] for j in jobs}) == len(jobs), "job ids are unique across schedulers"

    # 3. the runs themselves
    runs = wait_until(
        lambda: (r := history(marker, "ha"))[len(every) - 1 :] and r, "every run recorded"
    )
    assert len(runs) == len(every)
