"""The scheduler's database side on the test database (SQLite unless DATABASE_URL
says otherwise): storing, planning, claiming each tick once, the API, the admin."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

import emq_django as emq
from emq_django.exceptions import BrokerUnavailable
from emq_django.scheduler import api, store
from emq_django.scheduler.keys import task_key, tick_id
from emq_django.scheduler.models import SOURCE_CODE, ScheduledJob
from emq_django.scheduler.timing import CATCH_UP_ALL, Timing

pytestmark = pytest.mark.django_db(transaction=True)

S = dt.timedelta(seconds=1)
TASK = "project.demo.tasks.add"


class Sent:
    """A stand-in for the peer's send: records (schedule name, due)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, dt.datetime]] = []
        self.fail = fail

    def __call__(self, job: ScheduledJob, due: dt.datetime) -> None:
        if self.fail:
            raise BrokerUnavailable("no broker")
        self.calls.append((job.name, due))


def test_schedule_names_the_call_as_eventmq_does_and_updates_in_place() -> None:
    a = emq.schedule(TASK, every=5, args=[1, 2])
    b = emq.schedule(TASK, every=dt.timedelta(seconds=10), args=[1, 2], queue="other")
    assert a.pk == b.pk and a.name == task_key(TASK, [1, 2])
    assert ScheduledJob.objects.count() == 1
    job = ScheduledJob.objects.get()
    assert (job.interval_seconds, job.queue) == (10.0, "other")
    emq.schedule(TASK, every=5, args=[3, 4])
    assert ScheduledJob.objects.count() == 2


def test_same_schedule_again_keeps_its_next_run() -> None:
    first = emq.schedule(TASK, every=60, args=[1, 2], nohaste=True)
    again = emq.schedule(TASK, every=60, args=[1, 2], nohaste=True)
    assert again.next_run_at == first.next_run_at


def test_schedule_takes_the_task_defaults() -> None:
    from project.demo import tasks

    job = emq.schedule(tasks.add, cron="0 3 * * *", args=[1, 2], timezone="Europe/Berlin")
    assert job.task == tasks.add.name
    assert job.queue == tasks.add.queue
    assert job.timezone == "Europe/Berlin"


def test_nohaste_and_haste_first_runs() -> None:
    before = timezone.now()
    now_job = emq.schedule(TASK, every=30, args=[1])
    later = emq.schedule(TASK, every=30, args=[2], nohaste=True)
    assert now_job.next_run_at is not None and later.next_run_at is not None
    assert before <= now_job.next_run_at <= timezone.now()
    assert later.next_run_at - now_job.next_run_at == pytest.approx(30 * S, abs=S)


def test_a_new_cron_schedule_waits_for_its_next_match() -> None:
    """Issue 29 item 8: not at once, as django-celery-beat."""
    before = timezone.now()
    job = emq.schedule(TASK, cron="0 0 1 1 *", args=[1, 2])
    expected = Timing(cron="0 0 1 1 *").next_after(before)
    assert job.next_run_at == expected
    row = ScheduledJob.objects.create(name="orm", task=TASK, cron="0 0 1 1 *")
    assert row.next_run_at == expected
    assert store.fire_due(timezone.now(), Sent()) == []


def test_unschedule_by_call_or_name() -> None:
    emq.schedule(TASK, every=5, args=[1, 2])
    emq.schedule(TASK, every=5, args=[1], name="mine")
    assert emq.unschedule(TASK, args=[1, 2]) is True
    assert emq.unschedule(TASK, args=[1, 2]) is False
    assert emq.unschedule(name="mine") is True
    assert not ScheduledJob.objects.exists()


def test_schedule_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not both or neither"):
        emq.schedule(TASK, every=5, cron="* * * * *")
    with pytest.raises(ValueError, match="out of range"):
        emq.schedule(TASK, cron="* 25 * * *")
    with pytest.raises(TypeError, match="JSON"):
        emq.schedule(TASK, every=5, args=[object()])
    with pytest.raises(ValueError, match="module path"):
        emq.schedule("nodots", every=5)


# ---- firing ---------------------------------------------------------------------


def test_fire_due_fires_each_tick_once_across_schedulers() -> None:
    job = emq.schedule(TASK, every=1, args=[1, 2])
    now = timezone.now()
    a, b = Sent(), Sent()
    assert len(store.fire_due(now, a)) == 1
    assert store.fire_due(now, b) == []  # the second scheduler: already claimed
    job.refresh_from_db()
    assert job.run_count == 1 and job.last_run_at == now
    assert job.next_run_at is not None and job.next_run_at > now
    assert a.calls and not b.calls


def test_a_claim_from_a_stale_read_loses() -> None:
    """Scheduler B read the row before A moved it on: B's compare-and-set misses."""
    emq.schedule(TASK, every=1, args=[1, 2])
    stale = ScheduledJob.objects.get()
    now = timezone.now()
    store.fire_due(now, Sent())
    sent = Sent()
    assert store._fire_one(stale, now, sent, "once", S) is None
    assert not sent.calls


def test_a_tick_the_broker_did_not_take_stays_due() -> None:
    job = emq.schedule(TASK, every=1, args=[1, 2])
    now = timezone.now()
    assert store.fire_due(now, Sent(fail=True)) == []
    after = ScheduledJob.objects.get()
    assert after.next_run_at == job.next_run_at and after.run_count == 0


def test_catch_up_once_after_downtime() -> None:
    job = emq.schedule(TASK, every=1, args=[1, 2])
    assert job.next_run_at is not None
    later = job.next_run_at + 10.4 * S
    sent = Sent()
    [fired] = store.fire_due(later, sent)
    assert (fired.runs, fired.missed, len(sent.calls)) == (1, 10, 1)
    assert ScheduledJob.objects.get().next_run_at == job.next_run_at + 11 * S
    assert store.fire_due(later, sent) == []


def test_catch_up_all_after_downtime() -> None:
    job = emq.schedule(TASK, every=1, args=[1, 2])
    assert job.next_run_at is not None
    sent = Sent()
    store.fire_due(job.next_run_at + 10.4 * S, sent, CATCH_UP_ALL)
    assert len(sent.calls) == 11
    # one run per tick, each with its own due time (its job id comes from it)
    assert [due for _, due in sent.calls] == [job.next_run_at + k * S for k in range(11)]


def test_a_tick_id_is_fixed_by_the_schedule_and_the_due_time() -> None:
    due = timezone.now()
    assert tick_id("a", due) == tick_id("a", due.astimezone(dt.timezone(dt.timedelta(hours=2))))
    assert len({tick_id("a", due), tick_id("b", due), tick_id("a", due + S)}) == 3
    assert len(tick_id("a", due)) == 32


def test_max_runs_disables_the_schedule() -> None:
    job = emq.schedule(TASK, every=1, args=[1, 2], max_runs=2)
    assert job.next_run_at is not None
    sent = Sent()
    for k in range(4):
        store.fire_due(job.next_run_at + k * S, sent)
    job.refresh_from_db()
    assert (len(sent.calls), job.run_count, job.enabled) == (2, 2, False)


def test_disabled_schedules_do_not_fire() -> None:
    emq.schedule(TASK, every=1, args=[1, 2])
    ScheduledJob.objects.update(enabled=False)
    assert store.fire_due(timezone.now(), Sent()) == []
    assert store.soonest() is None


# ---- changes through the ORM ----------------------------------------------------------


def test_save_plans_a_changed_timing() -> None:
    job = emq.schedule(TASK, every=3600, args=[1, 2], nohaste=True)
    job.interval_seconds = 5
    job.save()
    assert job.next_run_at is not None
    assert job.next_run_at - timezone.now() <= 5 * S
    assert job.timing_key == Timing(interval=5).key


def test_reconcile_plans_rows_changed_behind_save() -> None:
    job = emq.schedule(TASK, every=3600, args=[1, 2], nohaste=True)
    ScheduledJob.objects.filter(pk=job.pk).update(interval_seconds=2)
    now = timezone.now()
    assert store.fire_due(now + 10 * S, Sent()) == [], "an unplanned change does not fire"
    assert store.reconcile(now) == 1
    job.refresh_from_db()
    assert job.next_run_at == now + 2 * S
    assert store.reconcile(now) == 0


def test_reconcile_plans_a_row_created_without_next_run() -> None:
    ScheduledJob.objects.bulk_create([ScheduledJob(name="raw", task=TASK, interval_seconds=5)])
    now = timezone.now()
    assert store.reconcile(now) == 1
    assert ScheduledJob.objects.get().next_run_at == now  # no nohaste: at once


def test_reconcile_disables_an_invalid_timing() -> None:
    emq.schedule(TASK, cron="* * * * *", args=[1, 2])
    ScheduledJob.objects.update(cron="not a cron")
    store.reconcile(timezone.now())
    assert ScheduledJob.objects.get().enabled is False


def test_model_validation_explains_a_bad_cron() -> None:
    job = ScheduledJob(task=TASK, cron="*/5 * * *")
    with pytest.raises(ValidationError) as info:
        job.full_clean()
    assert "has 4 fields; it needs 5" in str(info.value)
    with pytest.raises(ValidationError, match="interval or a cron"):
        ScheduledJob(task=TASK).full_clean()


# ---- @emq.periodic ------------------------------------------------------------------


def test_periodic_sync_stores_and_removes(monkeypatch: pytest.MonkeyPatch) -> None:
    from project.demo import tasks

    monkeypatch.setattr(api, "_declared", {})
    decorated = emq.periodic(every=30, args=[1, 2], nohaste=True)(tasks.add)
    assert decorated is tasks.add
    assert api.sync_periodic() == (1, 0)
    job = ScheduledJob.objects.get()
    assert (job.source, job.interval_seconds, job.nohaste) == (SOURCE_CODE, 30.0, True)
    next_run = job.next_run_at
    assert api.sync_periodic() == (1, 0)
    assert ScheduledJob.objects.get().next_run_at == next_run, "an unchanged declaration keeps it"
    emq.schedule(TASK, every=5, args=[9])  # not declared in code: stays
    monkeypatch.setattr(api, "_declared", {})
    assert api.sync_periodic() == (0, 1)
    assert ScheduledJob.objects.count() == 1


def test_a_periodic_schedule_disabled_in_the_admin_stays_disabled_at_the_next_start(
    monkeypatch: pytest.MonkeyPatch, admin_client: Client
) -> None:
    """Issue 29 item 7: the code declares a schedule, the admin decides whether it runs."""
    from project.demo import tasks

    monkeypatch.setattr(api, "_declared", {})
    emq.periodic(every=30, args=[1, 2])(tasks.add)
    api.sync_periodic()
    job = ScheduledJob.objects.get()
    page = admin_client.post(
        "/admin/emq_scheduler/scheduledjob/",
        {"action": "disable", "_selected_action": [job.pk]},
    )
    assert page.status_code == 302
    assert ScheduledJob.objects.get().enabled is False
    assert api.sync_periodic() == (1, 0)  # what emq_scheduler does when it starts
    assert ScheduledJob.objects.get().enabled is False
    ScheduledJob.objects.update(enabled=True)  # enabled again: the next start keeps that too
    api.sync_periodic()
    assert ScheduledJob.objects.get().enabled is True


def test_periodic_rejects_a_bad_cron_at_import() -> None:
    with pytest.raises(ValueError, match="out of range"):
        emq.periodic(cron="0 24 * * *")


# ---- admin -----------------------------------------------------------------------------


@pytest.fixture
def admin_client() -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_admin_changelist_shows_runs_and_toggle(admin_client: Client) -> None:
    emq.schedule(TASK, every=5, args=[1, 2])
    page = admin_client.get("/admin/emq_scheduler/scheduledjob/")
    text = page.content.decode()
    assert page.status_code == 200
    # the run times are shown to the second under "next run" / "last run" (issue 17)
    for column in ("next run", "last run", "run count", "every 5 s", "run the selected"):
        assert column in text.lower().replace("_", " "), column
    assert 'name="form-0-enabled"' in text


def test_admin_add_form_rejects_a_bad_cron(admin_client: Client) -> None:
    data: dict[str, Any] = {
        "name": "",
        "task": TASK,
        "args": "[]",
        "kwargs": "{}",
        "queue": "default",
        "enabled": "on",
        "cron": "61 * * * *",
        "timezone": "UTC",
        "retries": "0",
        "timeout": "0",
    }
    page = admin_client.post("/admin/emq_scheduler/scheduledjob/add/", data)
    assert page.status_code == 200
    assert "61 is out of range for the minute field (0-59)" in page.content.decode()
    data["cron"] = "*/5 * * * *"
    page = admin_client.post("/admin/emq_scheduler/scheduledjob/add/", data)
    assert page.status_code == 302, page.content.decode()[:2000]
    job = ScheduledJob.objects.get()
    assert job.name == task_key(TASK) and job.next_run_at is not None


def test_admin_run_now_without_a_broker_says_so(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django import client as client_module

    class NoBroker:
        def send(self, *args: Any, **kwargs: Any) -> str:
            raise BrokerUnavailable("the broker at tcp://x did not acknowledge")

    monkeypatch.setattr(client_module, "get_client", lambda: NoBroker())
    job = emq.schedule(TASK, every=5, args=[1, 2])
    page = admin_client.post(
        "/admin/emq_scheduler/scheduledjob/",
        {"action": "run_now", "_selected_action": [job.pk]},
        follow=True,
    )
    assert "not sent: the broker at tcp://x did not acknowledge" in page.content.decode()
    assert ScheduledJob.objects.get().run_count == 0


@pytest.mark.parametrize(
    "options",
    [{"retries": 2**31}, {"retries": -1}, {"timeout": 1e308}],
    ids=["retries-2-to-the-31", "retries-negative", "timeout-1e308"],
)
def test_schedule_refuses_options_no_run_could_send(options: dict[str, Any]) -> None:
    """Refused when scheduled, not at every run (the headers could not be built)."""
    with pytest.raises(ValueError):
        emq.schedule(TASK, every=5, args=[1, 2], **options)
    assert not ScheduledJob.objects.exists()


@pytest.mark.parametrize("every", [1e20, float("inf"), float("nan"), 11 * 366 * 86400])
def test_schedule_refuses_an_interval_whose_ticks_are_no_dates(every: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        emq.schedule(TASK, every=every, args=[1, 2])
    assert not ScheduledJob.objects.exists()
