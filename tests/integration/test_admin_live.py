"""Issue 35: the admin's live queue page and its Pause/Resume control against a real
BrokerServer (in a thread): the arguments masked by default (the broker is not
asked for bodies), the permission needed and named, what the control did in a
message and at the broker; ``/emq/metrics`` with the per-task metrics."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client

from emq_django.results import live_pages
from tests.support import private_broker_settings

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/admin/emq_results/dashboard/queue/parked/"
ACTION = "/admin/emq_results/dashboard/queue-action/parked/"


@pytest.fixture
def broker(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import zmq

    from emq_django.broker.server import BrokerServer
    from emq_django.client import reset_client
    from emq_django.conf import reset_cached_settings

    s = dataclasses.replace(private_broker_settings(tmp_path), TASK_METRICS=True)
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(s, context=context, shutdown_grace=1.0)
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    monkeypatch.setenv("EMQ_BROKER_URL", s.FRONTEND_BIND)
    monkeypatch.setenv("EMQ_MONITOR_URL", s.MONITOR_BIND)
    settings.EMQ_MONITOR_URL = s.MONITOR_BIND
    reset_cached_settings()
    reset_client()
    try:
        yield s.MONITOR_BIND
    finally:
        reset_client()
        server.request_shutdown()
        thread.join(5)
        assert not thread.is_alive(), "the broker thread did not stop"
        server.close()
        context.destroy(linger=0)


def send_parked(n: int) -> None:
    from emq_django.client import get_client
    from emq_django.protocol.body import encode_run_body
    from emq_django.protocol.headers import format_headers

    headers = format_headers(task="pkg.charge")
    for i in range(n):
        body = encode_run_body("pkg", "charge", ["card-4242-secret", i])
        get_client().send("parked", headers, body, confirm=True)


def staff(*perms: str) -> Client:
    user = User.objects.create_user("staff", "s@example.com", "pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


def test_queue_page_lists_waiting_jobs_with_masked_arguments(broker: str) -> None:
    send_parked(60)
    page = staff().get(PAGE)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="emq-waiting-total">60<' in text
    assert text.count("pkg.charge") == 50  # one page
    assert "card-4242-secret" not in text and live_pages.MASKED in text
    assert 'id="emq-pause-readonly"' in text and 'id="emq-pause"' not in text
    second = staff_again().get(PAGE + "?waiting=2").content.decode()
    assert second.count("pkg.charge") == 10 and "page 2 of 2" in second


def staff_again() -> Client:
    client = Client()
    client.force_login(User.objects.get(username="staff"))
    return client


def test_pause_needs_its_permission_and_says_what_it_did(broker: str) -> None:
    send_parked(3)
    refused = staff().post(ACTION, {"action": "pause"})
    assert refused.status_code == 403
    assert b"emq_results.pause_queues" in refused.content
    assert live_pages.ask("JOBS", "WAITING", "parked")["paused"] is False

    User.objects.all().delete()
    allowed = staff("emq_results.pause_queues")
    done = allowed.post(ACTION, {"action": "pause"})
    assert done.status_code == 302
    said = [str(m) for m in get_messages(done.wsgi_request)]
    assert said == [
        "Paused queue 'parked': its 3 waiting jobs and new ones wait (nothing is refused); "
        "running jobs finish."
    ]
    assert live_pages.ask("JOBS", "WAITING", "parked")["paused"] is True
    assert 'id="emq-resume"' in allowed.get(PAGE).content.decode()
    done = allowed.post(ACTION, {"action": "resume"})
    said = [str(m) for m in get_messages(done.wsgi_request)]
    assert said == ["Resumed queue 'parked': 0 waiting jobs dispatched."]  # nobody serves it
    assert live_pages.ask("JOBS", "WAITING", "parked")["paused"] is False
    bad = allowed.post(ACTION, {"action": "drop"})
    assert bad.status_code == 400 and b"pause, resume or rate" in bad.content


def test_metrics_carry_the_per_task_histogram(broker: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "admin"))
    text = client.get("/emq/metrics").content.decode()
    assert "# TYPE emq_task_run_seconds histogram" in text
    assert "# TYPE emq_task_succeeded_total counter" in text


def test_job_list_previews_arguments_masked_and_results(settings: Any) -> None:
    from tests.integration.test_admin_jobs import row

    row("p1", args='["card-4242-secret", 7]', kwargs='{"retry": true}', result='{"total": 12.5}')
    row("p2", args='["' + "x" * 300 + '"]', result='"' + "y" * 300 + '"')
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "admin"))
    masked = client.get("/admin/emq_results/jobresult/").content.decode()
    assert "card-4242-secret" not in masked and "••••" in masked
    assert "{&quot;total&quot;: 12.5}" in masked  # the result, as the job page shows it
    settings.EMQ_RESULTS_SHOW_ARGS = True
    shown = client.get("/admin/emq_results/jobresult/").content.decode()
    assert "[&quot;card-4242-secret&quot;, 7] {&quot;retry&quot;: true}" in shown  # tooltip
    assert "x" * 300 not in shown and "y" * 300 not in shown  # only the head is read


def test_a_queues_rate_limit_is_changed_with_its_own_permission(broker: str) -> None:
    send_parked(2)
    assert 'id="emq-rate-limit">none<' in staff().get(PAGE).content.decode()
    refused = staff_again().post(ACTION, {"action": "rate", "rate": "5/s"})
    assert refused.status_code == 403 and b"emq_results.rate_limit_queues" in refused.content
    assert live_pages.ask("JOBS", "WAITING", "parked")["rate_limit"] is None

    User.objects.all().delete()
    allowed = staff("emq_results.rate_limit_queues")
    assert 'id="emq-pause-readonly"' in allowed.get(PAGE).content.decode()  # not pause
    done = allowed.post(ACTION, {"action": "rate", "rate": " 30 / m "})
    said = [str(m) for m in get_messages(done.wsgi_request)]
    assert said == [
        "Queue 'parked': rate limit 30/m from now on (it was none) until the broker "
        "restarts; 0 waiting jobs dispatched at once."
    ]
    assert live_pages.ask("JOBS", "WAITING", "parked")["rate_limit"] == 0.5
    assert 'id="emq-rate-limit">30/m<' in allowed.get(PAGE).content.decode()
    bad = allowed.post(ACTION, {"action": "rate", "rate": "lots"})
    said = [str(m) for m in get_messages(bad.wsgi_request)]
    assert len(said) == 1 and said[0].startswith("Not done: the rate must be")
    assert live_pages.ask("JOBS", "WAITING", "parked")["rate_limit"] == 0.5  # unchanged
    done = allowed.post(ACTION, {"action": "rate", "rate": ""})  # empty: no limit
    said = [str(m) for m in get_messages(done.wsgi_request)]
    assert said[-1].startswith("Queue 'parked': rate limit none from now on (it was 30/m)")
    assert live_pages.ask("JOBS", "WAITING", "parked")["rate_limit"] is None
