"""Issue 29 item 19: each destructive admin action needs its own permission, and
"Purge ALL" asks for confirmation as Django's delete action does.

A staff login is not enough to purge the broker's dead letters (the web process's
monitor key makes any staff login an admin towards the broker), and the view
permission on jobs or schedules is not enough to retry, cancel or run them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from emq_django.results import actions
from emq_django.scheduler.models import ScheduledJob
from tests.integration.test_admin_jobs import LIST, FakeMonitor, monitor, row  # noqa: F401
from tests.integration.test_results import FakeClient

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "/admin/emq_results/dashboard/deadletters/"
LETTER = {
    "id": "d1",
    "queue": "default",
    "task": "pkg.fn",
    "attempts": 3,
    "error": "ValueError",
    "died_at": 1795223942.5,
    "guaranteed": True,
}


def login(*perms: str) -> Client:
    """A staff user (not a superuser) with exactly these permissions."""
    user = User.objects.create_user("staff", "s@example.com", "pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def letters(monitor: FakeMonitor) -> FakeMonitor:  # noqa: F811
    monitor.answers["DEADLETTERS LIST"] = {"dead_letters": [LETTER], "count": 1}
    monitor.answers["DEADLETTERS PURGE"] = {"purged": 1}
    monitor.answers["DEADLETTERS REQUEUE"] = {"requeued": 1}
    return monitor


def commands(fake: FakeMonitor) -> list[str]:
    return [r for r in fake.requests if r != "DEADLETTERS LIST"]


def test_staff_without_permissions_cannot_purge_or_requeue_dead_letters(
    letters: FakeMonitor,
) -> None:
    staff = login()
    page = staff.get(DEAD)
    assert page.status_code == 200  # staff may look
    text = page.content.decode()
    assert 'id="emq-purge-all"' not in text and 'id="emq-purge"' not in text
    assert 'id="emq-requeue-all"' not in text
    for data in (
        {"action": "purge", "all": "1", "confirmed": "yes"},
        {"action": "purge", "job_id": ["d1"], "confirmed": "yes"},
        {"action": "requeue", "all": "1"},
    ):
        refused = staff.post(DEAD + "do/", data)
        assert refused.status_code == 403, data
        assert b"permission" in refused.content
    assert commands(letters) == []


def test_purge_all_asks_for_confirmation_first(letters: FakeMonitor) -> None:
    staff = login("emq_results.purge_deadletters")
    page = staff.get(DEAD).content.decode()
    assert 'id="emq-purge-all"' in page and 'id="emq-requeue-all"' not in page
    asked = staff.post(DEAD + "do/", {"action": "purge", "all": "1"})
    assert asked.status_code == 200
    text = asked.content.decode()
    assert 'id="emq-confirm-purge"' in text
    assert "d1" in text and "guaranteed" in text  # what would be gone for good
    assert commands(letters) == []
    done = staff.post(
        DEAD + "do/", {"action": "purge", "all": "1", "confirmed": "yes"}, follow=True
    )
    assert "Purged 1 dead letters" in done.content.decode()
    assert commands(letters) == ["DEADLETTERS PURGE ALL"]


def test_requeue_needs_its_own_permission(letters: FakeMonitor) -> None:
    staff = login("emq_results.requeue_deadletters")
    done = staff.post(DEAD + "do/", {"action": "requeue", "job_id": ["d1"]}, follow=True)
    assert "Requeued 1 dead letters" in done.content.decode()
    refused = staff.post(DEAD + "do/", {"action": "purge", "all": "1", "confirmed": "yes"})
    assert refused.status_code == 403
    assert commands(letters) == ["DEADLETTERS REQUEUE d1"]


def test_view_permission_alone_cannot_retry_or_cancel_jobs(
    letters: FakeMonitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeClient()
    monkeypatch.setattr(actions, "get_client", lambda: fake)
    row("r1", "retrying", task="other.mod.fn")
    viewer = login("emq_results.view_jobresult")
    page = viewer.get(f"{LIST}r1/change/").content.decode()
    assert 'id="emq-retry"' not in page and 'id="emq-cancel"' not in page
    assert viewer.post(f"{LIST}r1/retry/").status_code == 403
    assert viewer.post(f"{LIST}r1/cancel/").status_code == 403
    listing = viewer.get(LIST).content.decode()
    assert 'value="retry_jobs"' not in listing and 'value="cancel_jobs"' not in listing
    for action in ("retry_jobs", "cancel_jobs"):
        viewer.post(LIST, {"action": action, "_selected_action": ["r1"]})
    assert fake.sent == [] and commands(letters) == []


def test_retry_and_cancel_each_need_their_permission(
    letters: FakeMonitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeClient()
    monkeypatch.setattr(actions, "get_client", lambda: fake)
    letters.answers["CANCEL r1"] = {"cancelled": ["r1"], "running": [], "unknown": []}
    row("r1", "retrying", task="other.mod.fn")
    retrier = login("emq_results.view_jobresult", "emq_results.retry_jobresult")
    page = retrier.get(f"{LIST}r1/change/").content.decode()
    assert 'id="emq-retry"' in page and 'id="emq-cancel"' not in page
    assert retrier.post(f"{LIST}r1/retry/").status_code == 302
    assert retrier.post(f"{LIST}r1/cancel/").status_code == 403
    assert len(fake.sent) == 1
    User.objects.all().delete()
    canceller = login("emq_results.view_jobresult", "emq_results.cancel_jobresult")
    assert canceller.post(f"{LIST}r1/cancel/").status_code == 302
    assert commands(letters) == ["CANCEL r1"]


def test_schedules_run_now_and_enable_need_their_permissions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeClient()
    monkeypatch.setattr("emq_django.client.get_client", lambda: fake)
    job = ScheduledJob.objects.create(name="t", task="project.demo.tasks.add", interval_seconds=60)
    viewer = login("emq_scheduler.view_scheduledjob")
    assert viewer.post(f"/admin/emq_scheduler/scheduledjob/{job.pk}/run-now/").status_code == 403
    listing = viewer.get("/admin/emq_scheduler/scheduledjob/").content.decode()
    for action in ("run_now", "enable", "disable"):
        assert f'value="{action}"' not in listing, action
        viewer.post("/admin/emq_scheduler/scheduledjob/", _action(action, job.pk))
    assert fake.sent == [] and ScheduledJob.objects.get().enabled
    User.objects.all().delete()
    runner = login("emq_scheduler.view_scheduledjob", "emq_scheduler.run_scheduledjob")
    assert runner.post(f"/admin/emq_scheduler/scheduledjob/{job.pk}/run-now/").status_code == 302
    assert len(fake.sent) == 1


def _action(name: str, pk: Any) -> dict[str, Any]:
    return {"action": name, "_selected_action": [pk]}


def test_revoking_or_enabling_a_curve_key_needs_the_change_permission() -> None:
    from emq_django.security.models import AuthorizedKey

    key = AuthorizedKey.objects.create(name="jm", public_key="x" * 40, enabled=False)
    url = "/admin/emq_security/authorizedkey/"
    viewer = login("emq_security.view_authorizedkey")
    listing = viewer.get(url).content.decode()
    assert 'value="enable"' not in listing and 'value="revoke"' not in listing
    viewer.post(url, _action("enable", key.pk))
    assert AuthorizedKey.objects.get().enabled is False  # a revoked key stays revoked
    User.objects.all().delete()
    editor = login("emq_security.view_authorizedkey", "emq_security.change_authorizedkey")
    editor.post(url, _action("enable", key.pk))
    assert AuthorizedKey.objects.get().enabled is True
