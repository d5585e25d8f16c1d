"""The admin's Topics page and the topic figures in /emq/metrics, against a real
BrokerServer (in a thread, its journal in tmp_path) with events published through
it: staff only, figures per topic and per port, the latest events decoded, an
unreachable broker, a broker without topics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from emq_django.results.topics_page import figures
from tests.eventbus_client import BusClient
from tests.support import free_tcp_port, private_broker_settings, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/admin/emq_results/dashboard/topics/"
DATA = PAGE + "data/"


@pytest.fixture
def staff() -> Client:
    c = Client()
    c.force_login(User.objects.create_superuser("admin", "a@example.com", "admin"))
    return c


@pytest.fixture
def broker(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real BrokerServer (in a thread): monitor channel, Event BUS, journal."""
    import zmq

    from emq_django.broker.server import BrokerServer
    from emq_django.client import reset_client
    from emq_django.conf import reset_cached_settings

    s = private_broker_settings(tmp_path)
    front, mon = s.FRONTEND_BIND, s.MONITOR_BIND
    snap, pub, coll = s.BUS_SNAPSHOT_BIND, s.BUS_PUBLISH_BIND, s.BUS_COLLECT_BIND
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(s, context=context, shutdown_grace=1.0)
    server.bind()
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    for name, value in (
        ("EMQ_BROKER_URL", front),
        ("EMQ_MONITOR_URL", mon),
        ("EMQ_BUS_SNAPSHOT_BIND", snap),
        ("EMQ_BUS_PUBLISH_BIND", pub),
        ("EMQ_BUS_COLLECT_BIND", coll),
    ):
        monkeypatch.setenv(name, value)
    settings.EMQ_MONITOR_URL = mon
    reset_cached_settings()
    reset_client()
    try:
        yield mon
    finally:
        reset_client()
        server.request_shutdown()
        server.request_shutdown()
        thread.join(5)
        assert not thread.is_alive(), "the broker thread did not stop"
        server.close()
        context.destroy(linger=0)


@pytest.fixture
def bus(broker: str) -> Iterator[BusClient]:
    """A producer on the broker's Event BUS collector (the spec-written test client)."""
    from emq_django.conf import cached_settings

    s = cached_settings()
    client = BusClient(s.BUS_SNAPSHOT_BIND, s.BUS_PUBLISH_BIND, s.BUS_COLLECT_BIND)
    yield client
    client.close()


def test_topics_page_is_for_staff_only(broker: str) -> None:
    assert Client().get(PAGE).status_code == 302
    c = Client()
    c.force_login(User.objects.create_user("bob", password="pw"))
    assert c.get(PAGE).status_code == 302  # to the admin login
    assert c.get(DATA).status_code == 302


def test_figures_and_latest_events_from_a_live_broker(staff: Client, bus: BusClient) -> None:
    page = staff.get(PAGE).content.decode()
    assert "<title>Topics" in page and 'id="emq-topic-table"' in page
    for n in range(5):
        bus.publish("orders/new", {"order": n, "items": ["tea"] * n}, producer="shop")
    bus.publish("audit", {"who": "alice"})
    seqs = [1, 2, 3, 4, 5, 6]  # a new broker numbers from 1; one producer keeps its order
    doc = wait_until(
        lambda: (d := staff.get(DATA).json())["ok"] and d["last_seq"] == seqs[-1] and d,
        "the events in the figures",
    )
    rows = {t["topic"]: t for t in doc["topics"]}
    assert rows["orders/new"]["last_seq"] == seqs[4] and rows["orders/new"]["events"] == 5
    assert rows["audit"]["last_seq"] == seqs[5] and rows["audit"]["events"] == 1
    assert rows["orders/new"]["events_per_s"] > 0
    assert "latest" not in doc

    latest = staff.get(DATA, {"topic": "orders/new"}).json()["latest"]
    assert latest["topic"] == "orders/new" and latest["error"] == ""
    assert [e["seq"] for e in latest["events"]] == seqs[:5]
    last = latest["events"][-1]
    assert last["as"] == "msgpack" and last["content_type"] == "application/msgpack"
    assert last["producer"] == "shop"
    assert json.loads(last["text"]) == {"order": 4, "items": ["tea"] * 4}
    assert staff.get(DATA, {"topic": "nothing/here"}).json()["latest"]["events"] == []
    assert staff.get(DATA, {"topic": " spaced "}).json()["latest"]["error"] == "not a topic name"

    text = staff.get("/emq/metrics").content.decode()
    assert f"emq_topics_last_seq {seqs[-1]}" in text
    assert f'emq_topic_last_seq{{topic="orders/new"}} {seqs[4]}' in text
    assert 'emq_topic_events_total{topic="orders/new"} 5' in text
    assert 'emq_topic_events_per_second{topic="audit"}' in text


def test_subscribers_per_port(staff: Client, broker: str) -> None:
    import zmq

    from emq_django.conf import cached_settings

    # two plain SUB sockets on the Event BUS publish socket
    ctx = zmq.Context.instance()
    subs = []
    for _ in range(2):
        sock = ctx.socket(zmq.SUB)
        sock.connect(cached_settings().BUS_PUBLISH_BIND)
        sock.subscribe(b"orders/")
        subs.append(sock)
    try:

        def bus_subscribers() -> int:
            ports = {p["port"]: p["subscribers"] for p in staff.get(DATA).json()["ports"]}
            return sum(n for name, n in ports.items() if "bus" in name)

        wait_until(lambda: bus_subscribers() == 2, "two Event BUS subscribers")
        text = staff.get("/emq/metrics").content.decode()
        assert "emq_port_subscribers{port=" in text
    finally:
        for sock in subs:
            sock.close(linger=0)


def test_unreachable_broker(staff: Client, settings: Any) -> None:
    url = f"tcp://127.0.0.1:{free_tcp_port()}"
    settings.EMQ_MONITOR_URL = url
    settings.EMQ_DASHBOARD_TIMEOUT = 0.2
    doc = staff.get(DATA, {"topic": "orders/new"}).json()
    assert doc["ok"] is False and f"broker unreachable at {url}" in doc["error"]
    assert "Broker unreachable at" in staff.get(PAGE).content.decode()


def test_a_broker_without_topics_shows_none() -> None:
    doc = figures({"counters": {}, "queues": []})
    assert doc == {"available": False, "last_seq": None, "topics": [], "ports": []}
    shaped = figures(
        {
            "topics": {
                "last_seq": 9,
                "topics": {"a": {"last_seq": 9, "published": 2, "events_per_s": 0.2}},
                "ports": {"bus": {"subscribers": 3}, "mc0": {"subscribers": 0}},
            }
        }
    )
    assert shaped["topics"][0]["events"] == 2
    assert shaped["ports"] == [
        {"port": "bus", "subscribers": 3},
        {"port": "mc0", "subscribers": 0},
    ]
