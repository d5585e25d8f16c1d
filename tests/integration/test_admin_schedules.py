"""Issue 29 item 20: schedules in the admin as django-celery-beat users know them:
a choice among the registered tasks, a start time, an expiry and one-off runs."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from emq_django.scheduler import store
from emq_django.scheduler.models import ScheduledJob
from tests.integration.test_scheduler_store import TASK, Sent

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/emq_scheduler/scheduledjob/add/"
S = dt.timedelta(seconds=1)


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def form(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "",
        "task": TASK,
        "args": "[1, 2]",
        "kwargs": "{}",
        "queue": "default",
        "enabled": "on",
        "interval_seconds": "60",
        "cron": "",
        "timezone": "UTC",
        "retries": "0",
        "timeout": "0",
    }
    data.update(changes)
    return data


def test_the_task_is_a_choice_among_the_registered_tasks(admin: Client) -> None:
    page = admin.get(ADD).content.decode()
    assert '<select name="task"' in page
    assert f'<option value="{TASK}">' in page
    refused = admin.post(ADD, form(task="project.demo.tasks.nope"))
    assert refused.status_code == 200
    assert "not one of the available choices" in refused.content.decode()
    assert ScheduledJob.objects.count() == 0
    assert admin.post(ADD, form()).status_code == 302
    assert ScheduledJob.objects.get().task == TASK


def test_a_schedule_from_the_admin_starts_at_its_start_time(admin: Client) -> None:
    start = (timezone.now() + dt.timedelta(days=2)).replace(microsecond=0)
    local = timezone.localtime(start)
    data = form(start_at_0=f"{local:%Y-%m-%d}", start_at_1=f"{local:%H:%M:%S}")
    response = admin.post(ADD, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    job = ScheduledJob.objects.get()
    assert job.start_at == start and job.next_run_at == start
    assert store.fire_due(start - S, Sent()) == []
    sent = Sent()
    store.fire_due(start, sent)
    assert sent.calls == [(job.name, start)]


def test_a_one_off_schedule_runs_once_then_is_disabled(admin: Client) -> None:
    assert admin.post(ADD, form(one_off="on")).status_code == 302
    job = ScheduledJob.objects.get()
    assert job.one_off and job.next_run_at is not None
    sent = Sent()
    store.fire_due(job.next_run_at, sent)
    store.fire_due(job.next_run_at + 60 * S, sent)
    job.refresh_from_db()
    assert (len(sent.calls), job.run_count, job.enabled) == (1, 1, False)


def test_an_expired_schedule_sends_nothing_and_is_disabled(admin: Client) -> None:
    expires = (timezone.now() + dt.timedelta(minutes=30)).replace(microsecond=0)
    local = timezone.localtime(expires)
    data = form(expires_at_0=f"{local:%Y-%m-%d}", expires_at_1=f"{local:%H:%M:%S}")
    data["interval_seconds"] = "3600"
    assert admin.post(ADD, data).status_code == 302
    job = ScheduledJob.objects.get()
    assert job.next_run_at is not None
    sent = Sent()
    store.fire_due(job.next_run_at, sent)  # before the expiry: runs
    job.refresh_from_db()
    assert job.next_run_at is not None and job.next_run_at > expires
    store.fire_due(job.next_run_at, sent)  # after it: nothing, and disabled
    job.refresh_from_db()
    assert (len(sent.calls), job.enabled) == (1, False)


def test_the_change_form_shows_start_expiry_and_one_off(admin: Client) -> None:
    job = ScheduledJob.objects.create(name="t", task=TASK, interval_seconds=60)
    page = admin.get(f"/admin/emq_scheduler/scheduledjob/{job.pk}/change/").content.decode()
    for field in ('name="start_at_0"', 'name="expires_at_0"', 'name="one_off"'):
        assert field in page, field
