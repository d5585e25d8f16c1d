"""The admin dashboard in a real browser (headless Chromium through Selenium).

broker + job manager (recording to a migrated SQLite database) + `runserver`,
with this process sending jobs. The browser logs into the admin, watches the
dashboard list the job manager and the succeeded count rise, then sees the
"broker unreachable" panel when the broker stops and the live state again when
it is back. Screenshots go to test-artifacts/ (kept by CI as artifacts).

Chromium and its driver are the Debian packages (`make test` installs them);
the test is skipped without them unless EMQ_REQUIRE_BROWSER=1 (set by `make test`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e import spine_tasks as tasks
from tests.e2e.test_spine import run_manage, start_jm, wait_jm_ready
from tests.support import REPO_ROOT, EmqProcesses, free_tcp_port, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1300",
)


def _browser_missing() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install chromium chromium-driver; make test does)"
    return ""


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("EMQ_REQUIRE_BROWSER") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="emq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Producer(threading.Thread):
    """Sends `add` jobs from this process until stopped, riding out broker restarts."""

    def __init__(self, rate: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.stopped = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from emq_django.exceptions import EmqError

        while not self.stopped.is_set():
            try:
                tasks.add.delay(self.sent, 1)
                self.sent += 1
            except EmqError:
                self.stopped.wait(0.5)
            self.stopped.wait(1.0 / self.rate)


def manager_row(browser: Any, identity: str) -> dict[str, str] | None:
    """The dashboard's row of one job manager, by column heading (None while the
    page redraws the table under the read)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        table = browser.find_element(By.ID, "emq-jobmanagers")
        heads = [h.get_attribute("textContent") for h in table.find_elements(By.TAG_NAME, "th")]
        for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr"):
            cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            if cells and cells[0].startswith(identity):
                return dict(zip(heads, cells, strict=False))
    except StaleElementReferenceException:
        pass
    return None


def number(driver: Any, element_id: str) -> int:
    from selenium.webdriver.common.by import By

    text = driver.find_element(By.ID, element_id).text.replace(",", "").strip()
    return int(text) if text.isdigit() else -1


def migrate_with_admin(env: dict[str, str]) -> None:
    """Migrate the test database and make the superuser admin/admin that `login` uses."""
    assert run_manage(env, "migrate", "--noinput").returncode == 0
    made = run_manage(
        env,
        "createsuperuser",
        "--noinput",
        extra_env={
            "DJANGO_SUPERUSER_USERNAME": "admin",
            "DJANGO_SUPERUSER_PASSWORD": "admin",
            "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
        },
    )
    assert made.returncode == 0, made.stderr


def login(driver: Any, base: str, next_url: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/admin/login/?next={next_url}")
    driver.find_element(By.NAME, "username").send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys("admin")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The click returns before the POST's redirect has loaded the next page on a
    # loaded machine; a find_element then finds the old page's elements, or none
    # (NoSuchElementException: session 26's make test). Wait for the page asked for.
    wait_until(
        lambda: (
            urlsplit(driver.current_url).path == urlsplit(next_url).path
            and driver.execute_script("return document.readyState") == "complete"
        ),
        f"the page {next_url} after logging in (at {driver.current_url})",
        30,
    )


def test_dashboard_live_in_browser(
    browser: Any, emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    from selenium.webdriver.common.by import By

    env = client
    ARTIFACTS.mkdir(exist_ok=True)
    migrate_with_admin(env)

    recorder = {
        "EMQ_RECORDER": "emq_django.results.recorder.DatabaseRecorder",
        # the recorder process waits for a quiet machine (up to this long) before it
        # writes: in a busy test run the history would still be empty at the end
        "EMQ_RECORDER_MAX_DELAY": "1",
    }
    broker = start_broker(emq_processes, env)
    jm = start_jm(emq_processes, "browser-jm", concurrency=2, extra_env=recorder)
    web_port = free_tcp_port()
    web = emq_processes.start(
        "runserver", "--noreload", f"127.0.0.1:{web_port}", name="web", env={"DEBUG": "1"}
    )
    emq_processes.wait_for_port(web_port, proc=web)
    wait_jm_ready(env, "browser-jm", 2, [broker, jm])
    base = f"http://127.0.0.1:{web_port}"

    producer = Producer()
    producer.start()
    try:
        login(browser, base, "/admin/emq_results/dashboard/")
        wait_until(
            lambda: "browser-jm" in browser.find_element(By.ID, "emq-jobmanagers").text,
            "the dashboard to list job manager browser-jm",
            15,
            [broker, jm, web],
        )
        first = wait_until(lambda: max(number(browser, "emq-succeeded"), 0), "a count", 10)
        later = wait_until(
            lambda: number(browser, "emq-succeeded") > first and number(browser, "emq-succeeded"),
            "the succeeded count to go up without a reload",
            10,
            [broker, jm, web],
        )
        print(f"succeeded on the dashboard: {first} -> {later}")
        queues = browser.find_element(By.ID, "emq-queues").text
        assert "spine" in queues
        assert "browser-jm" in queues

        # the job manager's row: jobs failed (none: the producer's jobs succeed) and
        # its memory, which it reports every 5 s
        def reported() -> dict[str, str] | None:
            row = manager_row(browser, "browser-jm")
            return row if row and "MiB" in row.get("memory", "") else None

        row = wait_until(
            reported,
            "the job manager's memory on the dashboard",
            15,
            [broker, jm, web],
        )
        print(f"job manager row: {row}")
        assert row["failed"] == "0"
        assert float(row["memory"].removesuffix(" MiB")) > 10  # a Python process and 2 workers
        wait_until(
            lambda: browser.find_element(By.ID, "emq-chart-throughput").find_elements(
                By.TAG_NAME, "polyline"
            ),
            "the throughput chart",
            5,
        )
        browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))

        # the broker stops: the panel must come up within 3 s
        assert not browser.find_element(By.ID, "emq-unreachable").is_displayed()
        emq_processes.stop(broker)
        stopped = time.monotonic()
        wait_until(
            lambda: browser.find_element(By.ID, "emq-unreachable").is_displayed(),
            "the broker-unreachable panel",
            5,
            interval=0.05,
        )
        delay = time.monotonic() - stopped
        panel = browser.find_element(By.ID, "emq-unreachable").text
        print(f"unreachable panel {delay:.2f} s after the broker stopped: {panel!r}")
        browser.save_screenshot(str(ARTIFACTS / "dashboard-unreachable.png"))
        assert f"broker unreachable at {env['EMQ_MONITOR_URL']}" in panel.lower()
        assert delay < 3.0

        # ... and it recovers when the broker is back
        broker2 = start_broker(emq_processes, env, name="broker-2")
        wait_until(
            lambda: not browser.find_element(By.ID, "emq-unreachable").is_displayed(),
            "the dashboard to recover",
            10,
            [broker2, web],
        )
        wait_until(
            lambda: "browser-jm" in browser.find_element(By.ID, "emq-jobmanagers").text,
            "the job manager on the new broker",
            15,
            [broker2, jm, web],
        )
    finally:
        producer.stopped.set()
        producer.join(5)

    # the job history filled, and its admin page shows it (written within the
    # recorder's delay, so reload until the rows are there)
    def history_rows() -> list[Any]:
        browser.get(f"{base}/admin/emq_results/jobresult/")  # logged in already
        return browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")

    rows = wait_until(history_rows, "the job history's rows in the admin", 20, [jm, web])
    assert rows, "the job history is empty"
    assert "spine_tasks.add" in browser.find_element(By.ID, "result_list").text
    browser.save_screenshot(str(ARTIFACTS / "job-history.png"))


@pytest.fixture
def client(emq_client_env: dict[str, str]) -> dict[str, str]:
    """This process as a client of the test's broker (see conftest)."""
    return emq_client_env
