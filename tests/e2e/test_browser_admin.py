"""Every emq admin page in headless Chromium at 1366x900 (issue 17), one screenshot
each under var/screenshots/: the index's one emq section, the dashboard (and its
last figures while the broker is down), the job list without horizontal
scrolling, a failed job retried and a waiting one cancelled from their own pages,
a schedule listing the runs it sent, the metrics of a 2-minute-old demo, the dead
letters.

broker (with a trace log) + job manager (recording) + scheduler + `runserver`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import spine_tasks as tasks
from tests.e2e.test_browser_dashboard import (  # noqa: F401  (fixture)
    browser,
    login,
    migrate_with_admin,
)
from tests.e2e.test_spine import run_manage, start_jm, wait_jm_ready
from tests.support import REPO_ROOT, EmqProcesses, free_tcp_port, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHOTS = REPO_ROOT / "var" / "screenshots"
SETUP = """
import datetime as dt
from emq_django.analytics.models import JobManagerMetric, QueueMetric
from emq_django.scheduler.models import ScheduledJob
ScheduledJob.objects.create(name="add-every-2s", task="tests.e2e.spine_tasks.add",
                            args=[2, 3], queue="spine", interval_seconds=2)
first = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
for n, rate in enumerate((1.6166666666666667, 26.05, 15.6)):
    QueueMetric.objects.create(queue="spine", minute=first + dt.timedelta(minutes=n),
        jobs=int(rate * 60), succeeded=int(rate * 60), failed=0, timed_out=0, retried=0,
        throughput=rate, e2e_p95_ms=3.63 * (n + 1), run_p95_ms=1.0, wait_p95_ms=0.5)
    JobManagerMetric.objects.create(jm="browser-jm", minute=first + dt.timedelta(minutes=n),
        attempts=10, succeeded=10, failed=0, busy_ms=600.0, utilisation=0.01)
"""


def shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1366, max(900, min(int(height) + 120, 4000)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1366, 900)


def no_horizontal_scroll(driver: Any) -> bool:
    return bool(
        driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"
            " && Array.from(document.querySelectorAll('#changelist .results, #content'))"
            ".every(function (el) { return el.scrollWidth <= el.clientWidth + 1; })"
        )
    )


def message(driver: Any) -> str:
    """The page's Django messages; '' while the page is being replaced (a click's
    POST and redirect have not loaded yet)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return " ".join(m.text for m in driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))
    except StaleElementReferenceException:
        return ""


def test_admin_pages_in_browser(
    browser: Any,  # noqa: F811
    emq_processes: EmqProcesses,
    emq_client_env: dict[str, str],
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    env = emq_client_env
    trace = {"EMQ_TRACE_DIR": str(tmp_path / "trace")}
    migrate_with_admin(env)
    setup = run_manage(env, "shell", "-c", SETUP)
    assert setup.returncode == 0, setup.stderr

    broker = start_broker(emq_processes, env, extra_env=trace)
    recorder = {"EMQ_RECORDER": "emq_django.results.recorder.DatabaseRecorder"}
    jm = start_jm(emq_processes, "browser-jm", concurrency=2, extra_env=recorder)
    scheduler = emq_processes.start("emq_scheduler", name="scheduler")
    port = free_tcp_port()
    web = emq_processes.start(
        "runserver",
        "--noreload",
        f"127.0.0.1:{port}",
        name="web",
        env={"DEBUG": "1", "EMQ_RESULTS_SHOW_ARGS": "true", **trace},
    )
    emq_processes.wait_for_port(port, proc=web)
    wait_jm_ready(env, "browser-jm", 2, [broker, jm])
    base = f"http://127.0.0.1:{port}"
    procs = [broker, jm, scheduler, web]

    for n in range(30):
        tasks.add.delay(n, 1)
    failed = tasks.boom.delay("broken on purpose")
    waiting = tasks.add.apply_async((40, 2), queue="parked")  # no job manager serves it

    browser.set_window_size(1366, 900)
    login(browser, base, "/admin/")
    section = browser.find_element(By.CSS_SELECTOR, ".app-emq_results").text
    for name in ("Dashboard", "Jobs", "Schedules", "Metrics", "Dead letters"):
        assert name in section, section
    assert not browser.find_elements(By.CSS_SELECTOR, ".app-emq_analytics, .app-emq_scheduler")
    shot(browser, "01-index")

    # the job list: fits 1366 px, seconds, human run times; then the failed job
    def failed_listed() -> bool:
        browser.get(f"{base}/admin/emq_results/jobresult/?status=failed")
        return failed.id in browser.page_source

    wait_until(failed_listed, "the failed job in the list", 20, procs)
    browser.get(f"{base}/admin/emq_results/jobresult/")
    assert no_horizontal_scroll(browser), "the job list scrolls sideways at 1366 px"
    assert browser.find_element(By.TAG_NAME, "h1").text == "Jobs"
    listed = browser.find_element(By.ID, "result_list").text
    assert "µs" in listed or " ms" in listed
    assert "job manager" in listed.lower() and "browser-jm" in listed
    shot(browser, "02-job-list")

    browser.get(f"{base}/admin/emq_results/jobresult/{failed.id}/change/")
    page = browser.find_element(By.ID, "content").text
    assert "ValueError" in page and "broken on purpose" in page and "browser-jm" in page
    assert browser.find_element(By.ID, "emq-enqueued").text != "—"
    shot(browser, "03-job-failed")
    browser.find_element(By.ID, "emq-retry").click()
    wait_until(lambda: "Sent again as" in message(browser), "retry's message", 10, procs)
    new_id = browser.find_element(By.CSS_SELECTOR, "ul.messagelist a").text
    assert new_id and new_id in browser.current_url
    assert failed.id in browser.find_element(By.ID, "emq-links").text  # retry of
    wait_until(
        lambda: (
            browser.refresh()
            or "boom" in browser.find_element(By.ID, "content").text
            and browser.find_elements(By.ID, "emq-retry")
        ),
        "the retried job to finish (it fails again)",
        20,
        procs,
    )
    shot(browser, "04-job-retried")

    browser.get(f"{base}/admin/emq_results/jobresult/{waiting.id}/change/")
    assert browser.find_element(By.ID, "emq-not-finished")
    assert "parked" in browser.find_element(By.ID, "emq-job").text  # its queue, from the trace
    shot(browser, "05-job-waiting")
    browser.find_element(By.ID, "emq-cancel").click()
    wait_until(lambda: "Cancelled:" in message(browser), "cancel's message", 10, procs)
    wait_until(
        lambda: browser.refresh() or browser.find_elements(By.ID, "emq-cancelled-waiting"),
        "the cancelled job's page to say it will not run",
        5,
        procs,
    )
    assert not browser.find_elements(By.ID, "emq-cancel")
    shot(browser, "06-job-cancelled")

    # the schedule lists the runs it sent, with their outcome
    def runs_listed() -> bool:
        browser.get(f"{base}/admin/emq_scheduler/scheduledjob/")
        browser.find_element(By.LINK_TEXT, "add-every-2s").click()
        return "succeeded" in browser.find_element(By.ID, "emq-schedule-runs").text

    wait_until(runs_listed, "the schedule's runs with an outcome", 20, procs)
    shot(browser, "07-schedule")
    browser.get(f"{base}/admin/emq_scheduler/scheduledjob/")
    assert no_horizontal_scroll(browser), "the schedule list scrolls sideways at 1366 px"
    assert browser.find_element(By.TAG_NAME, "h1").text == "Schedules"
    shot(browser, "07a-schedules")
    browser.find_element(By.LINK_TEXT, "add-every-2s").click()
    browser.find_element(By.ID, "emq-run-now").click()
    wait_until(lambda: "Sent job" in message(browser), "run now's message", 10, procs)

    browser.get(f"{base}/admin/emq_analytics/metricsdashboard/")
    svg = browser.find_element(By.CSS_SELECTOR, "figure svg")
    assert svg.size["width"] > 900, svg.size  # the page's width, not 550 px
    xs = browser.execute_script(
        "var p = arguments[0].querySelector('polyline').points;"
        "return [p.getItem(0).x, p.getItem(p.numberOfItems - 1).x,"
        " arguments[0].viewBox.baseVal.width];",
        svg,
    )
    assert xs[0] < 0.1 * xs[2] and xs[1] > 0.9 * xs[2] - 60, xs  # 2 minutes across
    shot(browser, "08-metrics")

    browser.get(f"{base}/admin/emq_results/dashboard/deadletters/")
    assert browser.find_element(By.ID, "emq-dead-letters")
    shot(browser, "09-dead-letters")
    # Purge ALL asks first, as Django's delete action does (issue 29 item 19)
    browser.find_element(By.ID, "emq-purge-all").click()
    wait_until(
        lambda: browser.find_elements(By.ID, "emq-confirm-purge"), "the purge question", 10, procs
    )
    assert "for good" in browser.find_element(By.ID, "emq-purge-question").text
    shot(browser, "09a-purge-confirm")
    browser.find_element(By.ID, "emq-confirm-purge").click()
    wait_until(lambda: "Purged" in message(browser), "purge's message", 10, procs)

    browser.get(f"{base}/admin/emq_results/dashboard/")
    wait_until(
        lambda: browser.find_element(By.ID, "emq-succeeded").text.replace(",", "").isdigit(),
        "the dashboard's figures",
        10,
        procs,
    )
    ticks = [
        t.text for t in browser.find_elements(By.CSS_SELECTOR, "#emq-chart-throughput .emq-ytick")
    ]
    assert ticks and all("e+" not in t and len(t.split(".")[-1]) <= 2 for t in ticks), ticks
    shot(browser, "10-dashboard")
    # the journal's jobs that wait, not the finished ones kept to de-duplicate (item 21)
    assert " waiting" in browser.find_element(By.ID, "emq-journal").text
    seen = browser.find_element(By.ID, "emq-succeeded").text
    emq_processes.stop(broker)
    wait_until(
        lambda: browser.find_element(By.ID, "emq-unreachable").is_displayed(),
        "the broker-unreachable panel",
        5,
    )
    time.sleep(2.5)  # a further poll, still down
    assert browser.find_element(By.ID, "emq-succeeded").text == seen  # the last figures seen
    browser.refresh()  # a page opened while the broker is down: the server's last figures
    wait_until(
        lambda: browser.find_element(By.ID, "emq-succeeded").text == seen,
        "the last figures seen after a reload",
        8,
    )
    cards = browser.find_element(By.CSS_SELECTOR, ".emq-cards").text
    assert "–" not in cards and "-" not in cards.replace("n/a", ""), cards  # no card left blank
    shot(browser, "11-dashboard-unreachable")
