"""Issue 35: the job manager page's Drain control, against a real broker and job
manager (processes): the permission needed and named, what it did in a message and
at the broker (MONITOR JSON), and giving it jobs again; a broker's refusal is shown
with its reason."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from django.contrib.auth.models import User
from django.contrib.messages import get_messages

from tests.e2e.test_spine import job_manager, monitor, wait_jm_ready
from tests.integration.test_admin_live import staff
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]
PAGE = "/admin/emq_results/dashboard/jobmanager/da/"
ACTION = "/admin/emq_results/dashboard/jobmanager-action/da/"


@pytest.fixture
def env(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, settings: Any
) -> Iterator[dict[str, str]]:
    settings.EMQ_MONITOR_URL = emq_client_env["EMQ_MONITOR_URL"]
    broker = start_broker(emq_processes, emq_client_env)
    jm = emq_processes.start(
        "emq_jobmanager", "--queues", "parked", "--concurrency", "1", "--name", "da"
    )
    wait_jm_ready(emq_client_env, "da", 1, [broker, jm])
    yield emq_client_env


def drained(env: dict[str, str]) -> bool:
    entry = job_manager(monitor(env), "da")
    assert entry is not None
    return bool(entry["drained"])


def said(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_drain_needs_its_permission_and_says_what_it_did(env: dict[str, str]) -> None:
    viewer = staff()
    page = viewer.get(PAGE).content.decode()
    assert 'id="emq-drain-readonly"' in page and 'id="emq-jm-drain"' not in page
    refused = viewer.post(ACTION, {"action": "drain"})
    assert refused.status_code == 403 and b"emq_results.drain_job_managers" in refused.content
    assert drained(env) is False

    User.objects.all().delete()
    admin = staff("emq_results.drain_job_managers")
    assert 'id="emq-jm-drain"' in admin.get(PAGE).content.decode()
    done = admin.post(ACTION, {"action": "drain"})
    assert done.status_code == 302
    assert said(done) == [
        "Drained job manager 'da': its 0 running jobs finish, and it gets no new job; "
        "the other job managers of its queues take them."
    ]
    assert drained(env) is True
    page = admin.get(PAGE).content.decode()
    assert "drained: finishes its running jobs" in page and 'id="emq-jm-resume"' in page
    done = admin.post(ACTION, {"action": "resume"})
    assert said(done) == ["Job manager 'da' takes jobs again: 0 waiting jobs dispatched to it."]
    assert drained(env) is False

    gone = admin.post("/admin/emq_results/dashboard/jobmanager-action/nosuch/", {"action": "drain"})
    assert said(gone)[-1] == "Not done: ERROR no job manager named nosuch is connected"
    bad = admin.post(ACTION, {"action": "explode"})
    assert bad.status_code == 400 and b"drain, resume, stop or resize" in bad.content
    # stopping needs its own permission
    assert 'id="emq-jm-stop"' not in admin.get(PAGE).content.decode()
    refused = admin.post(ACTION, {"action": "stop"})
    assert refused.status_code == 403 and b"emq_results.stop_job_managers" in refused.content


def test_stop_says_what_it_did_and_the_job_manager_exits(
    env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    admin = staff("emq_results.stop_job_managers")
    assert 'id="emq-jm-stop"' in admin.get(PAGE).content.decode()
    done = admin.post(ACTION, {"action": "stop"})
    assert said(done) == [
        "Stopping job manager 'da': it gets no new job, its 0 running jobs finish, "
        "then its process exits."
    ]
    jm = next(p for p in emq_processes.processes if "emq_jobmanager" in p.argv)
    wait_until(lambda: not jm.alive(), "the job manager exited", 120)
    assert jm.popen.returncode == 0


def test_resize_needs_its_permission_and_says_what_it_did(env: dict[str, str]) -> None:
    drainer = staff("emq_results.drain_job_managers")
    page = drainer.get(PAGE).content.decode()
    assert 'id="emq-resize-readonly"' in page and 'id="emq-jm-resize"' not in page
    refused = drainer.post(ACTION, {"action": "resize", "concurrency": "2"})
    assert refused.status_code == 403 and b"emq_results.resize_job_managers" in refused.content

    User.objects.all().delete()
    admin = staff("emq_results.resize_job_managers")
    page = admin.get(PAGE).content.decode()
    assert 'id="emq-jm-resize"' in page and 'max="64"' in page
    done = admin.post(ACTION, {"action": "resize", "concurrency": "2"})
    assert done.status_code == 302
    assert said(done) == [
        "Job manager 'da' runs 2 worker processes from now on (it ran 1): it starts more, "
        "or stops idle ones first and lets busy ones finish their running job."
    ]
    wait_until(lambda: slots(env) == 2, "da runs 2 worker processes", 60)
    done = admin.post(ACTION, {"action": "resize", "concurrency": "1"})
    wait_until(lambda: slots(env) == 1, "da runs 1 worker process", 60)
    # refusals say why: the broker's bound, and a number that is not one
    done = admin.post(ACTION, {"action": "resize", "concurrency": "65"})
    assert said(done)[-1] == (
        "Not done: ERROR da can run from 1 to 64 worker processes (its --max-concurrency), not 65"
    )
    done = admin.post(ACTION, {"action": "resize", "concurrency": "many"})
    assert said(done)[-1] == (
        "Not done: the number of worker processes is a whole number, not 'many'."
    )
    assert slots(env) == 1


def slots(env: dict[str, str]) -> int:
    entry = job_manager(monitor(env), "da")
    assert entry is not None
    return int(entry["slots"])


def test_the_page_shows_jobs_failed_and_memory_or_not_reported(env: dict[str, str]) -> None:
    """Ours reports its memory on its heartbeats; a job manager that sends no report
    (EventMQ's: an INFORM with no meta, as it sends it) is "not reported"."""
    wait_until(lambda: bool(job_manager(monitor(env), "da")["memory_bytes"]), "a report", 30)
    viewer = staff()
    page = viewer.get(PAGE).content.decode()
    assert '<td id="emq-jm-failed">0</td>' in page
    assert re.search(r'id="emq-jm-memory">[\d.]+\xa0MB: the job manager [\d.]+\xa0MB, ', page)
    context = zmq.Context()  # its own: the monitor client's queries end theirs
    legacy = context.socket(zmq.DEALER)
    legacy.setsockopt(zmq.IDENTITY, b"legacy-jm")
    legacy.connect(env["EMQ_WORKER_URL"])
    try:
        legacy.send_multipart([b"", b"eMQP/1.0", b"INFORM", b"i1", b'[[10, "parked"]]', b"worker"])
        wait_until(lambda: job_manager(monitor(env), "legacy-jm") is not None, "legacy-jm", 30)
        page = viewer.get("/admin/emq_results/dashboard/jobmanager/legacy-jm/").content.decode()
        assert "not reported (EventMQ's job manager sends none)" in page, page
    finally:
        legacy.close(linger=0)
        context.destroy(linger=0)
