"""Issue 35: the admin's live lists and controls in headless Chromium.

broker + job manager (2 worker processes, each running an hour-long nap) +
`runserver`; 100,000 jobs wait in the queue. The queue's page lists its waiting
and running jobs a bounded page at a time and pages on; Pause keeps a freed worker
process idle while jobs wait, Resume sends them; Cancel stops a running job; the
job manager's page shows its processes and Resize grows them (2 -> 3); a staff
user without the permissions sees no Pause or Resize button and is refused with
the permission named.

The page's load time is printed (measured, not asserted: timing goes in bench/).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e import spine_tasks as tasks
from tests.e2e.test_browser_admin import message, shot
from tests.e2e.test_browser_dashboard import (  # noqa: F401  (fixture)
    browser,
    migrate_with_admin,
)
from tests.e2e.test_spine import job_manager, monitor, run_manage, start_jm, wait_jm_ready
from tests.support import EmqProcesses, free_tcp_port, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOBS = 100_000
QUEUE = "spine"  # nap's queue
VIEWER = """
from django.contrib.auth.models import User
User.objects.create_user("viewer", "v@example.com", "viewer", is_staff=True)
"""


def login(driver: Any, base: str, user: str, next_url: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{base}/admin/login/?next={next_url}")
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(user)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_until(
        lambda: (
            urlsplit(driver.current_url).path == urlsplit(next_url).path
            and driver.execute_script("return document.readyState") == "complete"
        ),
        f"the page {next_url} after logging in as {user}",
        30,
    )


def text(driver: Any, element_id: str) -> str:
    """The element's text; '' while the page is being replaced (after a click)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.ID, element_id).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def ids(driver: Any, table: str) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr td:first-child a")
    return [r.text for r in rows]


def test_live_lists_and_controls_in_browser(
    browser: Any,  # noqa: F811
    emq_processes: EmqProcesses,
    emq_client_env: dict[str, str],
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    env = emq_client_env
    migrate_with_admin(env)
    made = run_manage(env, "shell", "-c", VIEWER)
    assert made.returncode == 0, made.stderr
    broker = start_broker(emq_processes, env, extra_env={"EMQ_MAX_PENDING": str(JOBS * 2)})
    jm = start_jm(emq_processes, "live-jm", queues=f"{QUEUE}:10", concurrency=2)
    port = free_tcp_port()
    web = emq_processes.start(
        "runserver",
        "--noreload",
        f"127.0.0.1:{port}",
        name="web",
        env={"DEBUG": "1", "EMQ_RESULTS_SHOW_ARGS": "true"},
    )
    emq_processes.wait_for_port(port, proc=web)
    wait_jm_ready(env, "live-jm", 2, [broker, jm])
    procs = [broker, jm, web]
    base = f"http://127.0.0.1:{port}"
    page = f"/admin/emq_results/dashboard/queue/{QUEUE}/"

    for start in range(0, JOBS, 10_000):
        tasks.nap.map([(3600, f"n{i}") for i in range(start, start + 10_000)])

    def queue_doc() -> dict[str, Any]:
        return next(q for q in monitor(env)["queues"] if q["name"] == QUEUE)

    wait_until(
        lambda: queue_doc()["depth"] + queue_doc()["in_flight"] == JOBS,
        f"the broker to hold all {JOBS} jobs",
        60,
        procs,
    )
    wait_until(lambda: queue_doc()["in_flight"] >= 2, "two jobs running", 30, procs)

    login(browser, base, "admin", page)
    began = time.monotonic()
    browser.get(base + page)
    loaded = time.monotonic() - began
    print(f"the queue page with {JOBS} jobs loaded in {loaded * 1000:.0f} ms")
    waiting_total = int(text(browser, "emq-waiting-total"))
    assert waiting_total == JOBS - queue_doc()["in_flight"]
    first = ids(browser, "emq-waiting")
    assert len(first) == 50  # a bounded page, never the whole queue
    assert len(browser.page_source) < 500_000
    assert text(browser, "emq-waiting-pager").startswith("page 1 of")
    assert "3600" in text(browser, "emq-waiting")  # the arguments' preview (shown: SHOW_ARGS)
    running = text(browser, "emq-running")
    assert "live-jm" in running and "nap" in running
    shot(browser, "20-live-queue")

    browser.find_element(By.CSS_SELECTOR, "#emq-waiting-pager .emq-next").click()
    wait_until(lambda: "page 2 of 2000" in text(browser, "emq-waiting-pager"), "page 2", 30, procs)
    second = ids(browser, "emq-waiting")
    assert len(second) == 50 and not set(first) & set(second)
    began = time.monotonic()
    browser.get(base + page + "?waiting=1999")
    print(f"page 1999 of the waiting jobs loaded in {(time.monotonic() - began) * 1000:.0f} ms")
    assert len(ids(browser, "emq-waiting")) == 50

    # Pause: jobs wait; a worker process freed by Cancel stays idle
    browser.get(base + page)
    browser.find_element(By.ID, "emq-pause").click()
    wait_until(lambda: "Paused queue" in message(browser), "pause's message", 30, procs)
    assert text(browser, "emq-queue-paused").startswith("Paused")
    assert queue_doc()["paused"] is True
    browser.find_element(By.CSS_SELECTOR, "#emq-running .emq-cancel-running").click()
    wait_until(lambda: "being stopped" in message(browser), "cancel's message", 30, procs)

    def idle_slot() -> bool:
        entry = job_manager(monitor(env), "live-jm")
        return bool(entry and entry["free_slots"] >= 1 and queue_doc()["in_flight"] <= 1)

    wait_until(idle_slot, "a free worker process while the queue is paused", 60, procs)
    depth_paused = queue_doc()["depth"]
    assert depth_paused == waiting_total  # nothing was dispatched, nothing refused

    # its figures: jobs failed (the cancelled job's among them, or not yet) and
    # memory, which it reports on its heartbeats (every 0.5 s here, at most every 5 s)
    wait_until(lambda: bool(job_manager(monitor(env), "live-jm")["memory_bytes"]), "memory", 30)
    failed = job_manager(monitor(env), "live-jm")["jobs_failed"]
    browser.get(base + "/admin/emq_results/dashboard/jobmanager/live-jm/")
    assert "free" in text(browser, "emq-jm-slots")
    assert text(browser, "emq-jm-state") == "serving"
    assert int(text(browser, "emq-jm-failed")) >= failed
    memory = text(browser, "emq-jm-memory")
    assert re.match(r"[\d.]+\s(MB|GB): the job manager [\d.]+\s(MB|GB), worker pid \d+ ", memory)
    shot(browser, "21-live-job-manager")

    # Resize: 2 -> 3 worker processes; the page says what it did, the slots follow
    field = browser.find_element(By.ID, "emq-jm-concurrency")
    field.clear()
    field.send_keys("3")
    browser.find_element(By.ID, "emq-jm-resize").click()
    wait_until(lambda: "runs 3 worker processes" in message(browser), "resize's message", 30)

    def slots() -> int:
        entry = job_manager(monitor(env), "live-jm")
        return int(entry["slots"]) if entry else 0

    wait_until(lambda: slots() == 3, "three worker processes", 60, procs)
    browser.get(base + "/admin/emq_results/dashboard/jobmanager/live-jm/")
    assert text(browser, "emq-jm-slots").startswith("3 (")

    browser.get(base + page)
    browser.find_element(By.ID, "emq-resume").click()
    wait_until(lambda: "Resumed queue" in message(browser), "resume's message", 30, procs)
    wait_until(lambda: queue_doc()["in_flight"] >= 2, "the free process running again", 30, procs)
    assert queue_doc()["depth"] < depth_paused and queue_doc()["paused"] is False

    # a staff user without the permission: no button, and a refusal that names it
    login(browser, base, "viewer", page)
    assert browser.find_elements(By.ID, "emq-pause-readonly")
    assert not browser.find_elements(By.ID, "emq-pause")
    assert not browser.find_elements(By.CSS_SELECTOR, ".emq-cancel-running")
    browser.execute_script(
        "var f = document.createElement('form'); f.method = 'post';"
        f"f.action = '/admin/emq_results/dashboard/queue-action/{QUEUE}/';"
        "var t = document.querySelector('#logout-form [name=csrfmiddlewaretoken]').value;"
        "f.innerHTML = '<input name=csrfmiddlewaretoken value=' + t + '>"
        "<input name=action value=pause>';"
        "document.body.appendChild(f); f.submit();"
    )
    wait_until(
        lambda: "permission" in browser.find_element(By.TAG_NAME, "body").text,
        "the refusal",
        30,
        procs,
    )
    assert "emq_results.pause_queues" in browser.find_element(By.TAG_NAME, "body").text
    assert queue_doc()["paused"] is False
    browser.get(base + "/admin/emq_results/dashboard/jobmanager/live-jm/")
    assert browser.find_elements(By.ID, "emq-resize-readonly")
    assert not browser.find_elements(By.ID, "emq-jm-resize")
