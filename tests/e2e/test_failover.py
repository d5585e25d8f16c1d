"""Failover in our peers (issue 32, C): clients, job managers, the scheduler and
subscribers given a list of brokers move to the one that serves.

No PostgreSQL needed: broker 1 runs on an SQLite journal file J at its own ports;
it is killed (``kill -9``), then broker 2 starts on the same file J at other
ports - one after the other, never both at once, as an active broker and the
standby that took over would. Every peer of ours is given both addresses
(``EMQ_BROKER_URL=tcp://P1,tcp://P2``). The tasks are in
tests/e2e/failover_tasks.py.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from emq_django.client import get_client, reset_client
from emq_django.conf import reset_cached_settings
from emq_django.exceptions import JobLost
from emq_django.monitor_client import status
from emq_django.pubsub import subscribe
from tests.e2e import failover_tasks as tasks
from tests.e2e import scheduler_tasks
from tests.e2e.scheduler_support import (
    TICK,
    history,
    manage,
    shell,
    start_jobmanager,
    start_scheduler,
)
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, free_tcp_ports, port_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

IMPORTS = "tests.e2e.failover_tasks"
# the ports each broker binds; its peers are given both brokers' (a list)
BOUND = (
    "FRONTEND",
    "BACKEND",
    "MONITOR",
    "BUS_SNAPSHOT",
    "BUS_PUBLISH",
    "BUS_COLLECT",
)
LISTED = {  # the setting a peer reads -> the broker's setting it names
    "EMQ_BROKER_URL": "FRONTEND",
    "EMQ_WORKER_URL": "BACKEND",
    "EMQ_MONITOR_URL": "MONITOR",
    "EMQ_BUS_SNAPSHOT_URL": "BUS_SNAPSHOT",
    "EMQ_BUS_PUBLISH_URL": "BUS_PUBLISH",
    "EMQ_BUS_COLLECT_URL": "BUS_COLLECT",
}
SENT = re.compile(r"sent (\S+) for schedule (\S+) \(due ([^)]+)\)")  # the scheduler's log
ACK_TIMEOUT = 20.0  # long: a resend on its quarter (5 s) would show


@dataclass
class Brokers:
    """Two brokers' settings (``binds[0]``, ``binds[1]``), started one at a time."""

    procs: EmqProcesses
    env: dict[str, str]  # every peer's: both brokers listed
    binds: list[dict[str, str]]
    running: list[ManagedProcess] = field(default_factory=list)

    def start(self, which: int, journal: str | None = None) -> ManagedProcess:
        extra = dict(self.binds[which])
        if journal is not None:
            extra["EMQ_JOURNAL_PATH"] = journal
        broker = self.procs.start("emq_broker", name=f"broker-{which + 1}", env=extra)
        for key in ("EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND", "EMQ_MONITOR_BIND"):
            self.procs.wait_for_port(port_of(extra[key]), proc=broker)
        self.running.append(broker)
        return broker

    def kill(self, broker: ManagedProcess) -> None:
        """``kill -9``, and wait until it is gone (its ports free)."""
        os.kill(broker.pid, signal.SIGKILL)
        broker.popen.wait(timeout=10)

    def port(self, which: int, name: str) -> int:
        return port_of(self.binds[which][f"EMQ_{name}_BIND"])


@pytest.fixture
def brokers(
    emq_env: dict[str, str],
    emq_processes: EmqProcesses,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Brokers]:
    """Two brokers' ports; this test process, its job managers and schedulers are
    given both (the lists), and share one SQLite journal file."""
    first = {f"EMQ_{name}_BIND": emq_env[f"EMQ_{name}_BIND"] for name in BOUND}
    second = {
        f"EMQ_{name}_BIND": f"tcp://127.0.0.1:{port}"
        for name, port in zip(BOUND, free_tcp_ports(len(BOUND)), strict=True)
    }
    # Majordomo, PZQ and mc0 off: not the subject, and their ports would be shared
    off = {k: "" for k in emq_env if k.endswith("_BIND") and k[4:-5] not in BOUND}
    listed = {
        key: f"{first[f'EMQ_{b}_BIND']},{second[f'EMQ_{b}_BIND']}" for key, b in LISTED.items()
    }
    extra = {
        **off,
        **listed,
        "EMQ_IMPORTS": IMPORTS,
        "EMQ_FAILOVER_LOG": str(tmp_path / "runs.jsonl"),
        "EMQ_RECORDER": "",
        "EMQ_ACK_TIMEOUT": str(ACK_TIMEOUT),
        "EMQ_TRACE_DIR": str(tmp_path / "trace"),
    }
    emq_env.update(extra)
    emq_processes.env.update(extra)
    for key, value in emq_env.items():
        if key != "DATABASE_URL":
            monkeypatch.setenv(key, value)
    reset_cached_settings()
    reset_client()
    yield Brokers(emq_processes, emq_env, [first, second])
    reset_client()
    reset_cached_settings()


def start_jm(brokers: Brokers, name: str = "fo", concurrency: int = 2) -> ManagedProcess:
    jm = brokers.procs.start(
        "emq_jobmanager",
        "--queues",
        "failover:10",
        "--concurrency",
        str(concurrency),
        "--name",
        name,
        name=f"jm-{name}",
    )
    wait_jm_ready(brokers.env, name, concurrency, [jm, *brokers.running])
    return jm


class Sender(threading.Thread):
    """Sends guaranteed jobs one after the other (each waits for its ACK) until
    told to stop; keeps their handles, and any exception that reached it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.handles: list[tuple[int, Any, float, float]] = []  # (x, handle, start, end)
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        x = 0
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                handle = tasks.double.delay(x)
            except BaseException as exc:  # what must never reach application code
                self.errors.append(exc)
                return
            self.handles.append((x, handle, start, time.monotonic()))
            x += 1
            time.sleep(0.01)


def test_guaranteed_jobs_go_on_through_a_failover_and_a_running_one_answers(
    brokers: Brokers,
) -> None:
    journal = brokers.env["EMQ_JOURNAL_PATH"]
    first = brokers.start(0, journal)
    # one slot: broker 2 cannot run the restored job again before the job manager
    # has handed over the outcome of the attempt broker 1 gave it
    start_jm(brokers, concurrency=1)
    running = tasks.slow.delay("across", 3.0)  # guaranteed, with a reply
    wait_until(lambda: tasks.runs("across"), "the job running")
    sender = Sender()
    sender.start()
    wait_until(lambda: len(sender.handles) >= 20 or sender.errors, "jobs sent to broker 1")

    brokers.kill(first)
    killed = time.monotonic()
    brokers.start(1, journal)  # the same journal file, other ports
    up = time.monotonic()
    count = len(sender.handles)
    wait_until(lambda: len(sender.handles) >= count + 20 or sender.errors, "jobs sent to broker 2")
    sender.stop.set()
    sender.join(timeout=ACK_TIMEOUT)

    assert sender.errors == []
    # the send that straddled the failover went on as soon as broker 2 was connected,
    # not on the resend timer (a quarter of the ACK timeout)
    straddling = [end - up for _, _, start, end in sender.handles if start <= up and end >= killed]
    assert straddling and max(straddling) < ACK_TIMEOUT / 4, straddling
    for x, handle, _, _ in sender.handles:
        assert handle.get(timeout=15) == 2 * x
    # the guaranteed job that ran at the failover: its outcome, once, handed over by
    # the job manager (broker 2 took it for the job it restored; it ran once)
    assert running.get(timeout=20) == "done across"
    assert get_client().take_reply(running.id.encode()) is None
    counters = status(brokers.env["EMQ_MONITOR_URL"])["counters"]
    assert counters["restored_outcomes"] == 1
    assert tasks.runs("across") == 1


def test_a_plain_job_running_at_a_failover_is_lost(brokers: Brokers) -> None:
    """At most once, as for a broker crash: broker 2 never had the plain job, so
    its outcome is dropped, and ``get()`` raises ``JobLost``."""
    first = brokers.start(0)
    start_jm(brokers, concurrency=1)
    plain = tasks.slow_plain.delay("plain", 2.0)
    wait_until(lambda: tasks.runs("plain"), "the job running")
    brokers.kill(first)
    brokers.start(1)
    assert tasks.triple.delay(5).get(timeout=15) == 15  # broker 2 serves
    with pytest.raises(JobLost):
        plain.get(timeout=15)
    assert tasks.runs("plain") == 1


def test_a_paused_broker_is_left_for_the_live_one(brokers: Brokers) -> None:
    """SIGSTOP of broker 1 (its kernel still holds the TCP connections open): the
    ZMTP heartbeats drop its connections, so the client and the job manager send
    to broker 2 only. Plain jobs and no journal (two brokers run at once here)."""
    first = brokers.start(0, journal="")
    start_jm(brokers, concurrency=2)
    assert tasks.triple.delay(1).get(timeout=10) == 3
    os.kill(first.pid, signal.SIGSTOP)
    try:
        brokers.start(1, journal="")
        # the job manager left the paused broker and INFORMed broker 2
        wait_jm_ready(brokers.env, "fo", 2, brokers.running[1:])
        # every job now goes to broker 2: none is stuck with the paused one
        handles = [tasks.triple.delay(x) for x in range(20)]
        assert [h.get(timeout=10) for h in handles] == [3 * x for x in range(20)]
    finally:
        os.kill(first.pid, signal.SIGKILL)
        os.kill(first.pid, signal.SIGCONT)


def publish(brokers: Brokers, first: int, count: int) -> None:
    """Publish events ``first`` .. ``first + count - 1`` on ``fo.events`` from another
    process, which waits for the broker's confirmation of each before it exits."""
    code = (
        f"import emq_django as emq; emq.publish_many('fo.events', range({first}, {first + count}))"
    )
    manage(brokers.env, "shell", "-c", code)


def test_a_subscriber_gets_every_event_once_in_order_across_a_failover(
    brokers: Brokers,
) -> None:
    """The topic store is in the journal: broker 2 numbers on from broker 1's last
    event, and the subscriber re-synchronises from its snapshot after the last
    sequence it had."""
    journal = brokers.env["EMQ_JOURNAL_PATH"]
    first = brokers.start(0, journal)
    got: list[tuple[int, Any]] = []
    done = threading.Event()

    def read() -> None:
        with subscribe("fo.", since=0, idle_check=0.2) as sub:
            while len(got) < 100 and not done.is_set():
                event = sub.next(timeout=0.2)
                if event is not None:
                    got.append((event.seq, event.data))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        publish(brokers, 0, 50)
        wait_until(lambda: len(got) >= 50, "the events of broker 1")
        brokers.kill(first)
        brokers.start(1, journal)
        publish(brokers, 50, 50)
        wait_until(lambda: len(got) >= 100, "the events of broker 2", timeout=20)
    finally:
        done.set()
        reader.join(timeout=5)
    assert [data for _, data in got] == list(range(100))
    seqs = [seq for seq, _ in got]
    assert seqs == sorted(set(seqs)), "every event once, in order"


def test_the_scheduler_fires_every_tick_once_across_a_failover(
    brokers: Brokers, tmp_path: Path
) -> None:
    """A 1 s schedule across a failover, with the catch-up policy ``all``: the ticks
    due while no broker served are sent once broker 2 is connected, and every tick
    is sent once (the scheduler's own account, ``sent ... (due <time>)``)."""
    marker = tmp_path / "ticks.log"
    extra = {
        scheduler_tasks.MARKER_ENV: str(marker),
        "EMQ_SCHEDULER_CATCH_UP": "all",
        "EMQ_ACK_TIMEOUT": "5",
    }
    brokers.env.update(extra)
    brokers.procs.env.update(extra)
    manage(brokers.env, "migrate", "-v0")
    journal = brokers.env["EMQ_JOURNAL_PATH"]
    first = brokers.start(0, journal)
    start_jobmanager(brokers.procs)
    scheduler = start_scheduler(brokers.procs)
    code = "import emq_django as emq; emq.{}({!r}, {}args=['fo'])"
    shell(brokers.env, code.format("schedule", TICK, "every=1, queue='sched', guarantee=True, "))

    def sent() -> list[dt.datetime]:
        return sorted(dt.datetime.fromisoformat(m[2]) for m in SENT.findall(scheduler.stderr()))

    wait_until(lambda: len(sent()) >= 3, "three ticks through broker 1", timeout=20)
    brokers.kill(first)
    brokers.start(1, journal)
    count = len(sent())
    wait_until(lambda: len(sent()) >= count + 4, "ticks through broker 2", timeout=30)
    shell(brokers.env, code.format("unschedule", TICK, ""))

    every = sent()
    duplicated = [t for t, n in Counter(every).items() if n > 1]
    steps = {round((b - a).total_seconds(), 6) for a, b in zip(every, every[1:], strict=False)}
    assert duplicated == [], "a tick was sent twice"
    assert steps == {1.0}, f"a tick was skipped: steps {sorted(steps)}"
    # each tick's job ran (guaranteed: those broker 1 took are in the journal)
    wait_until(lambda: len(history(marker, "fo")) >= len(every), "every tick's run")


def test_map_of_guaranteed_jobs_keeps_its_promise_across_a_failover(brokers: Brokers) -> None:
    """``map()`` calls go on through the failover: each returns once the broker
    that serves has acknowledged every job (those sent to the one that died are
    sent again under their ids as soon as broker 2 is connected), with no
    exception, and every job's ``get()`` returns its value."""
    journal = brokers.env["EMQ_JOURNAL_PATH"]
    first = brokers.start(0, journal)
    start_jm(brokers, concurrency=2)
    batches: list[tuple[int, list[Any]]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def mapper() -> None:
        x = 0
        while not stop.is_set():
            try:
                batches.append((x, tasks.double.map([(i,) for i in range(x, x + 50)])))
            except BaseException as exc:  # what must never reach application code
                errors.append(exc)
                return
            x += 50

    thread = threading.Thread(target=mapper, daemon=True)
    thread.start()
    wait_until(lambda: len(batches) >= 3 or errors, "batches through broker 1")
    brokers.kill(first)
    brokers.start(1, journal)
    count = len(batches)
    wait_until(lambda: len(batches) >= count + 3 or errors, "batches through broker 2")
    stop.set()
    thread.join(timeout=ACK_TIMEOUT)
    assert errors == []
    for x, handles in batches:
        assert [h.get(timeout=20) for h in handles] == [2 * i for i in range(x, x + 50)]
