"""The admin's Topics page in a real browser (headless Chromium through Selenium).

broker + `runserver` as subprocesses, this process publishing events on the
broker's Event BUS collector (the spec-written test client, MessagePack data).
The browser logs into the admin, opens Topics from the admin index, and watches
the page's figures change without a reload as events are published: a new topic
appears, its last sequence and event count go up, and choosing it shows its
latest events with their MessagePack data decoded.
Screenshots go to test-artifacts/.

Chromium and its driver are the Debian packages (`make test` installs them); the
test is skipped without them unless EMQ_REQUIRE_BROWSER=1 (set by `make test`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_browser_dashboard import (  # noqa: F401
    ARTIFACTS,
    browser,
    client,
    login,
    migrate_with_admin,
)
from tests.eventbus_client import BusClient
from tests.support import EmqProcesses, free_tcp_port, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class Publisher:
    """Events through the broker's Event BUS; a new broker numbers them from 1."""

    def __init__(self, env: dict[str, str]) -> None:
        self.bus = BusClient(
            env["EMQ_BUS_SNAPSHOT_BIND"], env["EMQ_BUS_PUBLISH_BIND"], env["EMQ_BUS_COLLECT_BIND"]
        )
        self.seq = 0

    def __call__(self, topic: str, value: Any) -> int:
        self.bus.publish(topic, value, producer="browser-test")
        self.seq += 1
        return self.seq


def rows(driver: Any, table: str) -> list[list[str]]:
    """A table's body cells, read in one script (the page redraws it every 2 s)."""
    return driver.execute_script(  # type: ignore[no-any-return]
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
        ".map(r => Array.from(r.cells).map(c => c.textContent));",
        f"#{table}",
    )


def cell_numbers(driver: Any, topic: str) -> tuple[int, int] | None:
    """(last sequence, events) in the topic's row of the topics table, if listed."""
    for cells in rows(driver, "emq-topic-table"):
        cells = [c.replace(",", "").strip() for c in cells]
        if cells and cells[0] == topic and cells[1].isdigit() and cells[2].isdigit():
            return int(cells[1]), int(cells[2])
    return None


def event_data(driver: Any) -> list[Any]:
    """The decoded data of the latest events listed, parsed back from the page."""
    return [json.loads(cells[-1]) for cells in rows(driver, "emq-latest") if len(cells) == 6]


def test_topics_page_live_in_browser(
    browser: Any,  # noqa: F811
    emq_processes: EmqProcesses,
    client: dict[str, str],  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By

    env = client
    ARTIFACTS.mkdir(exist_ok=True)
    migrate_with_admin(env)
    broker = start_broker(emq_processes, env)
    web_port = free_tcp_port()
    web = emq_processes.start(
        "runserver", "--noreload", f"127.0.0.1:{web_port}", name="web", env={"DEBUG": "1"}
    )
    emq_processes.wait_for_port(web_port, proc=web)
    base = f"http://127.0.0.1:{web_port}"
    procs = [broker, web]
    emq_processes.wait_for_port(int(env["EMQ_BUS_COLLECT_BIND"].rsplit(":", 1)[1]), proc=broker)
    publish = Publisher(env)
    publish("browser/warm", {"n": 0})
    login(browser, base, "/admin/")
    section = browser.find_element(By.CSS_SELECTOR, ".app-emq_results").text
    assert "Topics" in section, section
    browser.find_element(By.LINK_TEXT, "Topics").click()
    assert browser.find_element(By.TAG_NAME, "h1").text == "Topics"
    wait_until(
        lambda: browser.find_element(By.ID, "emq-state").text == "up",
        "the page to reach the broker",
        10,
        procs,
    )
    assert "orders/new" not in browser.find_element(By.ID, "emq-topic-table").text

    # a new topic appears without a reload, then its figures go up
    first = [publish("orders/new", {"order": n, "items": ["tea", n]}) for n in range(3)]
    shown = wait_until(
        lambda: cell_numbers(browser, "orders/new"), "the new topic in the table", 10, procs
    )
    assert shown == (first[-1], 3), shown
    more = [publish("orders/new", {"order": n, "items": ["tea", n]}) for n in range(3, 8)]
    wait_until(
        lambda: cell_numbers(browser, "orders/new") == (more[-1], 8),
        "the topic's last sequence and count to go up without a reload",
        10,
        procs,
    )
    last_seq = int(browser.find_element(By.ID, "emq-last-seq").text.replace(",", ""))
    assert last_seq == more[-1]
    rate = float(browser.find_element(By.ID, "emq-events-rate").text.replace(",", ""))
    assert rate > 0
    browser.save_screenshot(str(ARTIFACTS / "topics.png"))

    # the topic's latest events, their MessagePack data decoded
    browser.find_element(By.LINK_TEXT, "orders/new").click()
    datas = wait_until(
        lambda: len(data := event_data(browser)) == 8 and data,  # the topic's 8 events
        "the latest events of orders/new",
        10,
        procs,
    )
    assert datas[0] == {"order": 7, "items": ["tea", 7]}  # newest first
    assert datas[-1] == {"order": 0, "items": ["tea", 0]}
    assert "browser-test" in browser.find_element(By.ID, "emq-latest").text  # the producer
    # and they follow new events too
    publish("orders/new", {"order": 8, "items": []})
    wait_until(
        lambda: event_data(browser)[:1] == [{"order": 8, "items": []}],
        "the newest event at the top without a reload",
        10,
        procs,
    )
    browser.save_screenshot(str(ARTIFACTS / "topics-latest.png"))
    publish.bus.close()
