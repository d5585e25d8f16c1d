"""Issue 35: the monitor channel's live lists (``JOBS WAITING``, ``JOBS RUNNING``),
paged and bounded, and ``QUEUE PAUSE``/``RESUME`` (jobs wait, nothing refused;
resumed, they go at once), with the admin role for the controls and an ERROR with
its reason for bad input."""

from __future__ import annotations

import json
from typing import Any

from emq_django.broker import live
from emq_django.broker.effects import Deliver, Refuse
from emq_django.broker.ports.monitor import MonitorPort
from emq_django.security.roles import ADMIN, MONITOR
from tests.support.core_harness import CoreHarness, of_type


def ask(port: MonitorPort, request: bytes, now: float = 0.0) -> Any:
    answer = port.answer(request, now)
    assert not answer.startswith(b"ERROR"), answer
    return json.loads(answer)


def harness_with_waiting(n: int) -> tuple[CoreHarness, MonitorPort]:
    h = CoreHarness(wall_offset=1_000_000.0)
    for i in range(n):
        h.request(b"client", b"job-%d" % i, queue="parked", headers=b"task:pkg.tasks.noop", now=i)
    return h, MonitorPort(h.core)


def test_waiting_jobs_come_in_bounded_pages_oldest_first() -> None:
    h, port = harness_with_waiting(1200)
    first = ask(port, b"JOBS WAITING parked", now=1200.0)
    assert first["total"] == 1200 and first["offset"] == 0 and first["paused"] is False
    assert len(first["jobs"]) == 50  # the default page
    assert [j["id"] for j in first["jobs"][:2]] == ["job-0", "job-1"]
    job = first["jobs"][0]
    assert job["task"] == "pkg.tasks.noop" and job["queue"] == "parked"
    assert job["waited"] == 1200.0 and job["enqueued"] == 1_000_000.0
    assert "body" not in job  # a preview only when asked (BODIES)
    page = ask(port, b"JOBS WAITING parked 1000 100 BODIES", now=1200.0)
    assert [j["id"] for j in page["jobs"]] == [f"job-{i}" for i in range(1000, 1100)]
    assert '"args": [1]' in page["jobs"][0]["body"]
    # never more than MAX_PAGE, and past the end: an empty page
    assert live.MAX_PAGE < 1200
    assert port.answer(b"JOBS WAITING parked 0 100000", 0.0).startswith(b"ERROR the limit")
    assert ask(port, b"JOBS WAITING parked 5000 10")["jobs"] == []
    assert ask(port, b"JOBS WAITING nosuch")["exists"] is False


def test_delayed_jobs_with_their_countdown() -> None:
    h = CoreHarness(wall_offset=1_000_000.0)
    h.request(b"c", b"later", queue="q", headers=b"run-after:1000060", now=0.0)
    doc = ask(MonitorPort(h.core), b"JOBS WAITING q", now=10.0)
    assert doc["total"] == 0 and doc["delayed_total"] == 1
    assert doc["delayed"][0]["id"] == "later"
    assert doc["delayed"][0]["countdown"] == 50.0 and doc["delayed"][0]["due"] == 1_000_060.0


def test_running_jobs_name_their_job_manager_process_and_age() -> None:
    h = CoreHarness(wall_offset=1_000_000.0)
    meta = {"role": "slot", "manager": "jm-a", "pid": 4242}
    h.join(b"slot-1", queues=((10, "q"),), meta=meta, now=0.0)
    h.ready(b"slot-1", times=2, now=0.0)
    for i in range(3):
        h.request(b"c", b"r%d" % i, queue="q", now=5.0)
    port = MonitorPort(h.core)
    doc = ask(port, b"JOBS RUNNING q", now=65.0)
    assert doc["total"] == 2 and [j["id"] for j in doc["jobs"]] == ["r0", "r1"]
    first, second = doc["jobs"]
    assert first["job_manager"] == "jm-a" and first["pid"] == 4242
    assert first["running_for"] == 60.0 and first["started"] is True
    assert second["started"] is False  # taken, waiting its turn in the process
    assert ask(port, b"JOBS RUNNING * 1 1")["jobs"][0]["id"] == "r1"
    assert ask(port, b"JOBS RUNNING other")["total"] == 0
    assert ask(port, b"JOBS RUNNING @jm-a 0 5")["total"] == 2
    assert ask(port, b"JOBS RUNNING @jm-b")["jobs"] == []
    assert ask(port, b"JOBS WAITING q")["total"] == 1


def test_a_paused_queue_takes_jobs_that_wait_and_resumed_they_go() -> None:
    h = CoreHarness()
    h.join(b"w", queues=((10, "q"),), now=0.0)
    port = MonitorPort(h.core)
    assert ask(port, b"QUEUE PAUSE q")["paused"] is True
    h.ready(b"w", times=2, now=0.0)
    effects = h.request(b"c", b"a", queue="q", now=1.0) + h.request(b"c", b"b", queue="q", now=1.0)
    assert of_type(effects, Deliver) == [] and of_type(effects, Refuse) == []
    h.ready(b"w", now=1.0)  # credit given back while paused: still nothing goes
    assert of_type(h.take(), Deliver) == []
    status = ask(port, b"MONITOR JSON")
    assert [q["paused"] for q in status["queues"] if q["name"] == "q"] == [True]
    assert ask(port, b"JOBS WAITING q")["total"] == 2
    resumed = ask(port, b"QUEUE RESUME q", now=2.0)
    assert resumed == {"queue": "q", "paused": False, "was_paused": True, "dispatched": 2}
    assert [d.job.id for d in of_type(h.take(), Deliver)] == [b"a", b"b"]
    assert ask(port, b"JOBS WAITING q")["total"] == 0


def test_controls_need_the_admin_role_and_bad_input_gets_a_reason() -> None:
    port = MonitorPort(CoreHarness().core)
    reading = frozenset({MONITOR})
    assert port.authorize("monitor", reading, [b"JOBS WAITING q"]) is None
    assert port.authorize("monitor", reading, [b"JOBS RUNNING"]) is None
    refusal = port.authorize("monitor", reading, [b"QUEUE PAUSE q"])
    assert refusal is not None and "admin" in refusal
    assert port.authorize("monitor", frozenset({ADMIN}), [b"queue resume q"]) is None
    assert_refused(
        port,
        (b"JOBS WAITING", b"usage"),
        (b"JOBS WAITING q -1", b"whole number"),
        (b"JOBS WAITING q 0 0", b"between 1"),
        (b"JOBS WAITING q 1 2 3", b"too many"),
        (b"JOBS WAITING \xff\xfe", b"UTF-8"),
        (b"JOBS SOMETHING", b"usage"),
        (b"QUEUE STOP q", b"QUEUE PAUSE"),
        (b"QUEUE PAUSE", b"QUEUE PAUSE"),
    )
    assert port.core.counters["protocol_errors"] == 8


def assert_refused(port: MonitorPort, *cases: tuple[bytes, bytes]) -> None:
    """Each (request, reason): answered ERROR with the reason in it."""
    for request, reason in cases:
        answer = port.answer(request, 0.0)
        assert answer.startswith(b"ERROR") and reason in answer, (request, answer)


def test_a_queues_rate_limit_is_set_while_it_runs_and_lifted() -> None:
    h = CoreHarness()
    h.join(b"w", queues=((10, "q"),), now=0.0)
    h.ready(b"w", times=10, now=0.0)
    port = MonitorPort(h.core)
    assert ask(port, b"QUEUE RATE q 1/s") == {
        "queue": "q", "rate_limit": 1.0, "was": None, "waiting": 0, "dispatched": 0
    }  # fmt: skip
    effects: list[Any] = []
    for i in range(5):
        effects += h.request(b"c", b"j%d" % i, queue="q", now=0.0)
    assert [d.job.id for d in of_type(effects, Deliver)] == [b"j0"]  # the burst: one
    assert of_type(h.tick(0.5, keep_alive=[b"w"]), Deliver) == []
    assert [d.job.id for d in of_type(h.tick(1.0, keep_alive=[b"w"]), Deliver)] == [b"j1"]
    status = ask(port, b"MONITOR JSON", now=1.0)
    assert [q.get("rate_limit") for q in status["queues"] if q["name"] == "q"] == [1.0]
    waiting = ask(port, b"JOBS WAITING q", now=1.0)
    assert waiting["rate_limit"] == 1.0 and waiting["total"] == 3
    # faster: the bucket keeps what it earned (nothing: j1 took it) and fills at 10/s
    assert ask(port, b"QUEUE RATE q 10/s", now=1.0)["was"] == 1.0
    assert [d.job.id for d in of_type(h.tick(1.1, keep_alive=[b"w"]), Deliver)] == [b"j2"]
    lifted = ask(port, b"QUEUE RATE q off", now=1.15)
    assert lifted == {"queue": "q", "rate_limit": None, "was": 10.0, "waiting": 0, "dispatched": 2}
    assert [d.job.id for d in of_type(h.take(), Deliver)] == [b"j3", b"j4"]
    status = ask(port, b"MONITOR JSON", now=1.2)
    assert [q.get("rate_limit") for q in status["queues"] if q["name"] == "q"] == [None]


def test_a_rate_limit_change_needs_the_admin_role_and_a_rate() -> None:
    port = MonitorPort(CoreHarness().core)
    refusal = port.authorize("monitor", frozenset({MONITOR}), [b"QUEUE RATE q 1/s"])
    assert refusal is not None and "admin" in refusal
    assert_refused(
        port,
        (b"QUEUE RATE q", b"usage: QUEUE RATE"),
        (b"QUEUE RATE q 0/s", b"more than 0"),
        (b"QUEUE RATE q fast", b"<number>/<unit>"),
        (b"QUEUE RATE q 5/d", b"<number>/<unit>"),
        (b"QUEUE RATE q \xff/s", b"UTF-8"),
        (b"QUEUE RATE q 1/s extra", b"usage: QUEUE RATE"),
    )
    assert "q" not in port.core.flow.queue_rates
