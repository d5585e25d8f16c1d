"""The admin's jobs, schedules and dead letters (issue 17): the status filters for
every status, the list's units, the job page (times, durations, attempts from the
trace log, links, Retry and Cancel), the dead letters over a monitor socket, and
the one "emq" section on the admin index."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from emq_django.results import actions
from emq_django.results.display import human_duration, human_span, round_number
from emq_django.results.models import JobResult, RetryLink
from emq_django.scheduler.models import ScheduledJob, ScheduleRun
from tests.support import free_tcp_port

pytestmark = pytest.mark.django_db(transaction=True)
LIST = "/admin/emq_results/jobresult/"


@pytest.fixture
def staff() -> Client:
    user = User.objects.create_superuser("admin", "a@example.com", "admin")
    c = Client()
    c.force_login(user)
    return c


def row(job_id: str, status: str = "succeeded", attempts: int = 1, **kw: Any) -> JobResult:
    finished = kw.pop("finished_at", timezone.now())
    return JobResult.objects.create(
        id=job_id,
        task=kw.pop("task", "project.demo.tasks.add"),
        queue=kw.pop("queue", "default"),
        status=status,
        attempts=attempts,
        started_at=finished - dt.timedelta(microseconds=712),
        finished_at=finished,
        runtime=0.000712,
        job_manager="vm:1",
        **kw,
    )


class FakeMonitor(threading.Thread):
    """A REP socket on a free port answering the monitor commands as the broker does."""

    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.port = free_tcp_port()
        self.answers = answers
        self.requests: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.REP)
        sock.linger = 0
        sock.bind(f"tcp://127.0.0.1:{self.port}")
        try:
            while not self.stopped.is_set():
                if not sock.poll(50):
                    continue
                request = sock.recv().decode()
                self.requests.append(request)
                key = " ".join(request.split()[:2])
                sock.send(json.dumps(self.answers.get(key, {})).encode())
        finally:
            sock.close()


@pytest.fixture
def monitor(settings: Any) -> Iterator[FakeMonitor]:
    fake = FakeMonitor({})
    fake.start()
    settings.EMQ_MONITOR_URL = f"tcp://127.0.0.1:{fake.port}"
    yield fake
    fake.stopped.set()
    fake.join(2)


def test_human_units() -> None:
    assert human_duration(0.000712) == "712 µs"
    assert human_duration(1.6) == "1.6 s"
    assert human_duration(0.0421) == "42.1 ms"
    assert human_duration(185) == "3 min 5 s"
    assert human_duration(None) == "—"
    assert round_number(1.6166666666666667) == "1.62"
    assert round_number(1560.2) == "1,560"
    assert human_span(0.0) == "< 1 ms"  # a wait: dispatched in the batch that brought it
    assert human_span(0.0004) == "< 1 ms"
    assert human_span(0.0015) == "1.5 ms"
    assert human_span(None) == "—"


def test_every_status_filter_matches(staff: Client) -> None:
    expected = {
        "succeeded": "j-ok",
        "failed": "j-failed",
        "timed_out": "j-timeout",
        "lost": "j-lost",
        "retrying": "j-retrying",
        "cancelled": "j-cancelled",
        "retried": "j-ok2",
        "dead_lettered": "j-dead",
    }
    row("j-ok")
    row("j-ok2", attempts=2)
    row("j-failed", "failed")
    row("j-timeout", "timed_out")
    row("j-lost", "lost")
    row("j-retrying", "retrying", attempts=1)
    row("j-cancelled", "cancelled")
    row("j-dead", "failed", attempts=3)
    page = staff.get(LIST).content.decode()
    for value in expected:
        assert f"?status={value}" in page, f"no filter for {value}"
    for value, job_id in expected.items():
        page = staff.get(f"{LIST}?status={value}").content.decode()
        assert f">{job_id}<" in page, f"status={value} does not match {job_id}"
    dead = staff.get(f"{LIST}?status=dead_lettered").content.decode()
    assert ">j-failed<" not in dead and ">j-dead<" in dead


def test_list_is_titled_jobs(staff: Client) -> None:
    row("t1")
    row("t2")
    page = staff.get(LIST).content.decode()
    assert "<title>Jobs |" in page and "<h1>Jobs</h1>" in page
    assert "Select job result" not in page and "Job results" not in page  # Django's defaults
    assert "2 jobs" in page


def test_list_shows_seconds_and_human_run_time(staff: Client) -> None:
    row("j1", finished_at=timezone.now().replace(microsecond=0))
    page = staff.get(LIST).content.decode()
    assert "712 µs" in page and "0.000712" not in page
    assert timezone.localtime(JobResult.objects.get().finished_at).strftime("%H:%M:%S") in page


def write_trace(directory: Path, job_id: str, enqueued: dt.datetime) -> None:
    us = int(enqueued.timestamp() * 1_000_000)
    lines = [
        {"ts": us, "event": "enqueued", "job": job_id, "attempt": 0, "queue": "default"},
        {
            "ts": us + 1500,
            "event": "dispatched",
            "job": job_id,
            "attempt": 1,
            "jm": "jm-a",
            "wait_us": 1500,
        },
        {
            "ts": us + 9000,
            "event": "failed",
            "job": job_id,
            "attempt": 1,
            "jm": "jm-a",
            "run_us": 7000,
            "error": "ValueError",
        },
        {"ts": us + 9001, "event": "retried", "job": job_id, "attempt": 1, "error": "ValueError"},
        {
            "ts": us + 1_600_000,
            "event": "dispatched",
            "job": job_id,
            "attempt": 2,
            "jm": "jm-b",
            "wait_us": 1_600_000,
        },
        {
            "ts": us + 1_600_712,
            "event": "failed",
            "job": job_id,
            "attempt": 2,
            "jm": "jm-b",
            "run_us": 712,
            "error": "ValueError",
        },
    ]
    name = f"trace-{enqueued.astimezone(dt.UTC):%Y%m%d-%H}.jsonl"
    (directory / name).write_text(
        "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
    )


def test_job_page_has_times_durations_attempts_and_links(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    settings.EMQ_RESULTS_SHOW_ARGS = True
    enqueued = timezone.now().replace(microsecond=250_000)
    write_trace(tmp_path, "jp1", enqueued)
    finished = enqueued + dt.timedelta(microseconds=1_600_712)
    row(
        "jp1",
        "failed",
        attempts=2,
        finished_at=finished,
        error_type="ValueError",
        error="bad",
        traceback="Traceback: boom",
        args='["secret-arg"]',
    )
    schedule = ScheduledJob.objects.create(
        name="every-minute", task="project.demo.tasks.add", interval_seconds=60
    )
    ScheduleRun.note(schedule.pk, "jp1")
    RetryLink.objects.create(job_id="jp2", original_id="jp1", created_at=timezone.now())
    page = staff.get(f"{LIST}jp1/change/").content.decode()
    assert timezone.localtime(enqueued).strftime("%H:%M:%S.250") in page  # enqueued, to the ms
    assert "1.6 s" in page and "712 µs" in page  # end to end, run
    assert "jm-a" in page and "jm-b" in page  # each attempt's job manager
    assert "Traceback: boom" in page and "secret-arg" in page
    assert f"/admin/emq_scheduler/scheduledjob/{schedule.pk}/change/" in page
    assert f"{LIST}jp2/change/" in page  # its retry
    assert 'id="emq-retry"' in page
    retry_page = staff.get(f"{LIST}jp2/change/").content.decode()
    assert f"{LIST}jp1/change/" in retry_page  # the original
    assert 'id="emq-cancel"' in retry_page  # not finished yet: it may still be waiting


def test_job_page_wait_under_a_millisecond_is_not_zero(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    enqueued = timezone.now().replace(microsecond=250_000)
    us = int(enqueued.timestamp() * 1_000_000)
    lines = [
        {"ts": us, "event": "enqueued", "job": "w1", "attempt": 0, "queue": "default"},
        {"ts": us, "event": "dispatched", "job": "w1", "attempt": 1, "jm": "jm-a", "wait_us": 0},
        {
            "ts": us + 712,
            "event": "succeeded",
            "job": "w1",
            "attempt": 1,
            "jm": "jm-a",
            "run_us": 712,
            "total_us": 712,
        },
    ]
    name = f"trace-{enqueued.astimezone(dt.UTC):%Y%m%d-%H}.jsonl"
    (tmp_path / name).write_text(
        "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
    )
    row("w1", finished_at=enqueued + dt.timedelta(microseconds=712))
    page = staff.get(f"{LIST}w1/change/").content.decode()
    assert '<div class="emq-value" id="emq-wait">&lt; 1 ms</div>' in page, page
    assert '<div class="emq-value" id="emq-e2e">&lt; 1 ms</div>' in page
    assert ">0 s<" not in page


def test_waiting_job_page_names_task_and_queue_and_a_cancelled_one_has_no_cancel(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    now = timezone.now()
    us = int(now.timestamp() * 1_000_000)
    enqueued = {"ts": us, "event": "enqueued", "job": "q1", "attempt": 0}
    enqueued.update(task="project.demo.tasks.add", queue="parked")
    path = tmp_path / f"trace-{now.astimezone(dt.UTC):%Y%m%d-%H}.jsonl"
    path.write_text(json.dumps(enqueued, separators=(",", ":")) + "\n")
    waiting = staff.get(f"{LIST}q1/change/").content.decode()
    assert "project.demo.tasks.add" in waiting and "<td>parked</td>" in waiting
    assert 'id="emq-cancel"' in waiting and 'id="emq-not-finished"' in waiting
    cancelled = {"ts": us + 5, "event": "cancelled", "job": "q1", "attempt": 0, "queue": "parked"}
    with path.open("a") as f:
        f.write(json.dumps(cancelled, separators=(",", ":")) + "\n")
    page = staff.get(f"{LIST}q1/change/").content.decode()
    assert 'id="emq-cancel"' not in page and 'id="emq-not-finished"' not in page
    assert 'id="emq-cancelled-waiting"' in page and "will not run" in page


def test_job_finished_in_the_trace_before_its_row_shows_its_attempt_to_the_ms(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    enqueued = timezone.now().replace(microsecond=250_000)
    write_trace(tmp_path, "f1", enqueued)  # two attempts, both failed; no history row yet
    page = staff.get(f"{LIST}f1/change/").content.decode()
    finished = timezone.localtime(enqueued + dt.timedelta(microseconds=1_600_712))
    assert f"{finished:%Y-%m-%d %H:%M:%S}.850" in page  # the last attempt's end, to the ms
    assert "712 µs" in page and "7 ms" in page  # each attempt's run, in human units
    assert "a.m." not in page and "p.m." not in page  # not Django's default format
    assert 'id="emq-row-pending"' in page and 'id="emq-cancel"' not in page


def test_retry_button_sends_and_links(staff: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration.test_results import FakeClient

    fake = FakeClient()
    monkeypatch.setattr(actions, "get_client", lambda: fake)
    row("rb1", "failed", task="other.mod.fn")
    response = staff.post(f"{LIST}rb1/retry/", follow=True)
    assert response.redirect_chain[-1][0].endswith(f"{LIST}new1/change/")
    page = response.content.decode()
    assert f'<a href="{LIST}new1/change/">new1</a>' in page
    assert RetryLink.objects.get(job_id="new1").original_id == "rb1"
    listed = staff.post(LIST, {"action": "retry_jobs", "_selected_action": ["rb1"]}, follow=True)
    assert f'<a href="{LIST}rb1/change/">rb1</a>' in listed.content.decode()


def test_cancel_button_goes_over_the_monitor(staff: Client, monitor: FakeMonitor) -> None:
    monitor.answers["CANCEL w1"] = {"cancelled": ["w1"], "running": [], "unknown": []}
    row("w1", "retrying")
    page = staff.post(f"{LIST}w1/cancel/", follow=True).content.decode()
    assert monitor.requests == ["CANCEL w1"]
    assert "Cancelled:" in page and f"{LIST}w1/change/" in page


def test_dead_letters_page_lists_requeues_and_purges(staff: Client, monitor: FakeMonitor) -> None:
    letter = {
        "id": "d1",
        "queue": "default",
        "task": "pkg.fn",
        "attempts": 3,
        "error": "ValueError",
        "died_at": 1795223942.5,
        "guaranteed": False,
    }
    monitor.answers["DEADLETTERS LIST"] = {"dead_letters": [letter], "count": 1}
    monitor.answers["DEADLETTERS REQUEUE"] = {"requeued": 1}
    monitor.answers["DEADLETTERS PURGE"] = {"purged": 1}
    url = "/admin/emq_results/dashboard/deadletters/"
    page = staff.get(url).content.decode()
    assert "d1" in page and "pkg.fn" in page and "ValueError" in page
    done = staff.post(url + "do/", {"action": "requeue", "job_id": ["d1"]}, follow=True)
    assert "Requeued 1 dead letters" in done.content.decode()
    done = staff.post(url + "do/", {"action": "purge", "all": "1", "confirmed": "yes"}, follow=True)
    assert "Purged 1 dead letters" in done.content.decode()
    commands = [r for r in monitor.requests if r != "DEADLETTERS LIST"]
    assert commands == ["DEADLETTERS REQUEUE d1", "DEADLETTERS PURGE ALL"]


def test_admin_index_has_one_emq_section(staff: Client) -> None:
    page = staff.get("/admin/").content.decode()
    assert page.count('class="app-emq_results') == 1
    for gone in (
        "app-emq_analytics",
        "app-emq_scheduler",
        "app-emq_security",
        "Metrics dashboard",
        "Emq results",
    ):
        assert gone not in page, gone
    section = page[page.index('class="app-emq_results') :]
    section = section[: section.index("</table>")]
    names = [
        "Dashboard",
        "Jobs",
        "Schedules",
        "Metrics",
        "Dead letters",
        "Topics",
        "Authorized keys",
    ]
    at = [section.index(f">{name}</a>") for name in names]
    assert at == sorted(at), section


def test_schedule_page_lists_its_runs_with_outcome(staff: Client) -> None:
    schedule = ScheduledJob.objects.create(
        name="tick", task="project.demo.tasks.add", interval_seconds=60
    )
    for n in range(25):
        ScheduleRun.note(schedule.pk, f"s-{n:02d}")
    row("s-24", "failed")
    row("s-23")
    page = staff.get(f"/admin/emq_scheduler/scheduledjob/{schedule.pk}/change/").content.decode()
    runs = page.split('id="emq-schedule-runs"', 1)[1].split("</table>", 1)[0]
    shown = re.findall(r'<a href="[^"]*">(s-\d\d)</a>', runs)
    assert shown == [f"s-{n:02d}" for n in range(24, 4, -1)]  # the last 20, newest first
    assert "emq-failed" in page and "emq-succeeded" in page
    assert 'id="emq-run-now"' in page
    assert "%H:%M:%S" not in page


def test_schedule_pages_are_named_schedules_with_times_to_the_second(staff: Client) -> None:
    now = timezone.now().replace(microsecond=0)
    schedule = ScheduledJob.objects.create(
        name="tick",
        task="project.demo.tasks.add",
        interval_seconds=60,
    )
    # save() plans the next run itself: set both times behind its back
    ScheduledJob.objects.filter(pk=schedule.pk).update(
        next_run_at=now, last_run_at=now - dt.timedelta(days=3)
    )
    listed = staff.get("/admin/emq_scheduler/scheduledjob/").content.decode()
    assert "<title>Schedules |" in listed and "<h1>Schedules</h1>" in listed
    assert "Select scheduled job" not in listed and "1 schedule\n" in listed
    assert f">{timezone.localtime(now):%H:%M:%S}<" in listed  # today: the time alone
    old = timezone.localtime(now - dt.timedelta(days=3))
    assert f">{old:%b %d %H:%M:%S}<" in listed  # another day: with its date
    assert 'id="nav-sidebar"' not in listed  # the list has the page's width
    page = staff.get(f"/admin/emq_scheduler/scheduledjob/{schedule.pk}/change/").content.decode()
    assert "<h1>Schedule</h1>" in page and "Change scheduled job" not in page
    assert ">Schedules</a>" in page  # the breadcrumbs
    created = timezone.localtime(ScheduledJob.objects.get().created_at)
    assert f"{created:%Y-%m-%d %H:%M:%S}" in page  # created at, to the second


def test_dashboard_gives_the_last_figures_seen_when_unreachable(
    monitor: FakeMonitor, settings: Any
) -> None:
    from emq_django.results import dashboard

    monitor.answers["MONITOR JSON"] = {"counters": {"succeeded": 41}, "dead_letters": 2}
    seen = dashboard.data(now=1000.0)
    assert seen["ok"] and "last" not in seen
    settings.EMQ_MONITOR_URL = f"tcp://127.0.0.1:{free_tcp_port()}"  # nobody there
    settings.EMQ_DASHBOARD_TIMEOUT = 0.2
    down = dashboard.data(now=1010.0)
    assert not down["ok"]
    assert down["last"]["monitor"]["counters"]["succeeded"] == 41
    assert down["last"]["time"] == 1000.0 and down["last"]["dead_letters"] == 2


def test_run_now_button_sends_and_records(staff: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration.test_results import FakeClient

    fake = FakeClient()
    monkeypatch.setattr("emq_django.client.get_client", lambda: fake)
    schedule = ScheduledJob.objects.create(
        name="tick", task="project.demo.tasks.add", interval_seconds=60
    )
    url = f"/admin/emq_scheduler/scheduledjob/{schedule.pk}/run-now/"
    page = staff.post(url, follow=True).content.decode()
    assert "Sent job" in page and "new1" in page
    assert ScheduleRun.objects.get(job_id="new1").manual


def test_job_page_shows_the_partial_results_count(staff: Client) -> None:
    row("st1", partials=7)
    page = staff.get(f"{LIST}st1/change/").content.decode()
    card = page.split("partial results", 1)[1][:120]
    assert ">7<" in card


# ---- issue 29 item 21: one name for one thing --------------------------------------


def _labels(page: str) -> list[str]:
    """The text of every column header and card label on a job's page."""
    page = page.split('id="emq-job"', 1)[1]
    found = re.findall(r'<th[^>]*>([^<]*)</th>|<div class="emq-label"[^>]*>([^<]*)</div>', page)
    return [a or b for a, b in found]


def test_job_page_names_the_worker_run_and_the_broker_run_apart(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    enqueued = timezone.now().replace(microsecond=250_000)
    write_trace(tmp_path, "rn1", enqueued)
    row("rn1", "failed", attempts=2, finished_at=enqueued + dt.timedelta(microseconds=1_600_712))
    labels = _labels(staff.get(f"{LIST}rn1/change/").content.decode())
    assert "run in the worker" in labels and "dispatch to answer (broker)" in labels
    assert "run" not in labels, labels  # no figure labelled just "run"


def test_job_page_says_timed_out_as_the_list_does(staff: Client) -> None:
    row("to1", "timed_out")
    page = staff.get(f"{LIST}to1/change/").content.decode()
    assert '<span id="emq-job-state" class="emq-status emq-timed_out">timed out</span>' in page
    assert "<tr><th>state</th><td>timed out</td></tr>" in page
    listed = staff.get(LIST).content.decode()
    assert '<span class="emq-status emq-timed_out">timed out</span>' in listed


def test_a_running_job_is_running_in_its_badge_and_its_attempt(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    now = timezone.now()
    us = int(now.timestamp() * 1_000_000)
    lines = [
        {"ts": us, "event": "enqueued", "job": "run1", "attempt": 0, "queue": "default"},
        {"ts": us + 5, "event": "dispatched", "job": "run1", "attempt": 1, "jm": "jm-a"},
    ]
    (tmp_path / f"trace-{now.astimezone(dt.UTC):%Y%m%d-%H}.jsonl").write_text(
        "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
    )
    page = staff.get(f"{LIST}run1/change/").content.decode()
    assert '<span id="emq-job-state" class="emq-status emq-running">running</span>' in page
    assert "<tr><th>state</th><td>running</td></tr>" in page
    assert "<td>running</td><td>—</td>" in page  # the attempt: outcome running, no run yet


def test_dashboard_journal_counts_waiting_jobs_not_the_ones_kept_for_deduplication() -> None:
    from emq_django.results.dashboard import _journal

    journal = _journal({"size_bytes": 112 * 1024, "jobs": {"done": 1}})
    assert journal == {"size_bytes": 112 * 1024, "jobs": 1, "waiting": 0, "dead": 0, "done": 1}
    busy = _journal({"size_bytes": 1, "jobs": {"ready": 2, "delayed": 1, "spilled": 3, "dead": 4}})
    assert busy is not None and (busy["waiting"], busy["dead"], busy["done"]) == (6, 4, 0)


def test_job_page_links_to_the_job_s_opentelemetry_trace_with_emq_trace_url(
    staff: Client, settings: Any, tmp_path: Path
) -> None:
    settings.EMQ_TRACE_DIR = str(tmp_path)
    enqueued = timezone.now().replace(microsecond=250_000)
    write_trace(tmp_path, "jt1", enqueued)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    path = tmp_path / f"trace-{enqueued.astimezone(dt.UTC):%Y%m%d-%H}.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["otel"] = trace_id  # the broker's enqueued line of a job sent with a traceparent
    path.write_text("\n".join([json.dumps(first, separators=(",", ":")), *lines[1:]]) + "\n")
    row("jt1", "failed", attempts=2, finished_at=enqueued + dt.timedelta(seconds=2))

    page = staff.get(f"{LIST}jt1/change/").content.decode()
    assert f'<code id="emq-trace-id">{trace_id}</code>' in page  # no EMQ_TRACE_URL: no link
    settings.EMQ_TRACE_URL = "https://tempo.example.com/trace/{trace_id}?from=emq"
    page = staff.get(f"{LIST}jt1/change/").content.decode()
    assert f'href="https://tempo.example.com/trace/{trace_id}?from=emq"' in page
    # a job without a trace id shows neither
    write_trace(tmp_path, "jt2", enqueued)
    row("jt2", "failed", attempts=2, finished_at=enqueued + dt.timedelta(seconds=2))
    page = staff.get(f"{LIST}jt2/change/").content.decode()
    assert "emq-trace-link" not in page and "emq-trace-id" not in page
