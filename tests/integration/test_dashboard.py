"""The dashboard's data view and /emq/metrics: staff only, unreachable broker,
the broker's state from a real BrokerServer's monitor channel, and scale: the
job history's changelist with 100,000 rows."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from emq_django.results.metrics import render
from emq_django.results.models import JobResult
from emq_django.results.recorder import DatabaseRecorder
from emq_django.worker.recording import JobRecord
from tests.support import free_tcp_port, free_tcp_ports

pytestmark = pytest.mark.django_db(transaction=True)
DATA = "/admin/emq_results/dashboard/data/"


@pytest.fixture
def staff() -> Client:
    c = Client()
    c.force_login(User.objects.create_superuser("admin", "a@example.com", "admin"))
    return c


@pytest.fixture
def nowhere(settings: Any) -> str:
    url = f"tcp://127.0.0.1:{free_tcp_port()}"
    settings.EMQ_MONITOR_URL = url
    settings.EMQ_DASHBOARD_TIMEOUT = 0.2
    return url


def test_dashboard_is_for_staff_only(nowhere: str) -> None:
    assert Client().get("/admin/emq_results/dashboard/").status_code == 302
    user = User.objects.create_user("bob", password="pw")
    c = Client()
    c.force_login(user)
    assert c.get(DATA).status_code == 302  # to the admin login


def test_unreachable_broker_is_reported_with_its_address(staff: Client, nowhere: str) -> None:
    doc = staff.get(DATA).json()
    # bounded by the dashboard's monitor timeout (here 0.2 s), not by the broker's:
    # the error names the one it waited for (no wall-clock threshold)
    assert doc["ok"] is False
    assert "did not answer within 0.2 s" in doc["error"]
    assert doc["address"] == nowhere
    assert f"broker unreachable at {nowhere}" in doc["error"]
    assert doc["series"]["points"] == []
    page = staff.get("/admin/emq_results/dashboard/").content.decode()
    assert "Broker unreachable at" in page and nowhere in page


@pytest.fixture
def broker(settings: Any, tmp_path: Path) -> Iterator[str]:
    """A real BrokerServer (in a thread) with a monitor channel."""
    import zmq

    from emq_django.broker.server import BrokerServer
    from emq_django.conf import EmqSettings

    front, back, mon = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    s = EmqSettings(
        FRONTEND_BIND=front,
        BACKEND_BIND=back,
        MONITOR_BIND=mon,
        MDP_BIND="",  # off
        PZQ_RECEIVE_BIND="",  # off
        MC0_BIND="",  # off
        BUS_SNAPSHOT_BIND="",  # off
        JOURNAL_PATH=str(tmp_path / "journal.sqlite3"),
    )
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(s, context=context, shutdown_grace=1.0)
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    settings.EMQ_MONITOR_URL = mon
    try:
        yield mon
    finally:
        server.request_shutdown()
        server.request_shutdown()
        thread.join(5)
        assert not thread.is_alive(), "the broker thread did not stop"
        server.close()
        context.destroy(linger=0)


def test_dashboard_data_and_metrics_from_a_live_broker(
    staff: Client, broker: str, settings: Any
) -> None:
    r = DatabaseRecorder()
    now = time.time()
    for i in range(30):
        r.record(
            JobRecord(
                f"j{i}",
                1,
                "t.x",
                "mail",
                [],
                {},
                now - 20.5,
                now - 20,
                i % 3 == 0,
                "ValueError" if i % 3 == 0 else "",
                b'{"value":1}',
                "vm:1",
            )
        )
    r.flush()
    r.close()
    doc = staff.get(DATA).json()
    assert doc["ok"] is True, doc
    assert doc["monitor"]["broker"]["pid"]
    assert doc["dead_letters"] is None or isinstance(doc["dead_letters"], int)
    points = doc["series"]["points"]
    assert sum(p[1] for p in points) * 10 == pytest.approx(20)
    assert sum(p[2] for p in points) * 10 == pytest.approx(10)
    assert doc["queue_rates"]["mail"] == pytest.approx(0.5)

    assert Client().get("/emq/metrics").status_code == 401
    text = staff.get("/emq/metrics").content.decode()
    assert "emq_up 1" in text and "emq_succeeded_total 0" in text
    settings.EMQ_METRICS_TOKEN = "s3cret"
    assert Client().get("/emq/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    ok = Client().get("/emq/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")


def test_metrics_text_format() -> None:
    state = {
        "ok": True,
        "dead_letters": 3,
        "journal": {"size_bytes": 4096, "jobs": 2},
        "monitor": {
            "broker": {"uptime": 5.0},
            "counters": {"succeeded": 7, "failed": 1},
            "in_flight": 2,
            "queues": [{"name": 'we"ird', "depth": 4, "in_flight": 2}],
            "job_managers": [
                {"identity": "vm:1", "slots": 2, "busy": 1, "free_slots": 1, "jobs_done": 8}
            ],
            "schedulers": [],
        },
    }
    text = render(state)
    assert "# TYPE emq_succeeded_total counter\nemq_succeeded_total 7" in text
    assert 'emq_queue_depth{queue="we\\"ird"} 4' in text
    assert 'emq_job_manager_jobs_done_total{job_manager="vm:1"} 8' in text
    assert "emq_dead_letters 3" in text and "emq_journal_size_bytes 4096" in text
    assert render({"ok": False}).strip().endswith("emq_up 0")


# ---- scale ---------------------------------------------------------------------


@pytest.mark.slow
def test_changelist_with_100k_rows_stays_a_few_indexed_queries(
    staff: Client, nowhere: str, django_assert_max_num_queries: Any
) -> None:
    """At 100,000 rows every filter renders with a handful of queries. The load
    times are printed, not asserted: timing thresholds do not belong in the suite
    (on this machine they were 143-459 ms)."""
    rnd = random.Random(5)
    now = time.time()
    r = DatabaseRecorder()
    tasks = [f"pkg.tasks.t{i}" for i in range(12)]
    queues = ["default", "email", "reports", "bulk"]
    for i in range(100_000):
        failed = rnd.random() < 0.05
        finished = now - rnd.uniform(0, 6 * 86400)
        r.record(
            JobRecord(
                f"{i:012x}",
                1,
                rnd.choice(tasks),
                rnd.choice(queues),
                [i],
                {"k": "v"},
                finished - 0.01,
                finished,
                failed,
                "ValueError" if failed else "",
                b'{"error":{"type":"ValueError","message":"m","traceback":"t"}}'
                if failed
                else b'{"value":null}',
                "vm:1",
            )
        )
        if i % 5000 == 4999:
            r.flush()
    r.flush()
    r.close()
    assert JobResult.objects.count() == 100_000
    url = "/admin/emq_results/jobresult/"
    staff.get(url)  # warm: templates, caches
    timings = {}
    for query in (
        "",
        "?status=failed",
        "?queue=email&status=succeeded",
        "?task=pkg.tasks.t3",
        "?finished=1h",
        "?finished=24h&status=failed&queue=bulk",
        "?q=00000001",
        "?p=50",
    ):
        t0 = time.perf_counter()
        with django_assert_max_num_queries(12):
            response = staff.get(url + query)
        timings[query or "(none)"] = time.perf_counter() - t0
        assert response.status_code == 200, query
    print(
        "changelist load times at 100k rows:", {k: f"{v * 1000:.0f} ms" for k, v in timings.items()}
    )
