"""The monitor channel's ``TOPIC LATEST <n> <topic>``: the Topics page's source for a
topic's latest events, in memory and through the journal (a real SQLite file)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack

from emq_django.broker.core import BrokerCore
from emq_django.broker.journal import Journal
from emq_django.broker.ports.monitor import MAX_LATEST, MonitorPort
from emq_django.broker.state import BrokerConfig
from emq_django.broker.topics import TopicSpace


def core_with_events(journal: Journal | None = None) -> BrokerCore:
    core = BrokerCore(BrokerConfig(1.0, 3), 0.0, topics=TopicSpace())
    if journal is not None:
        core.life.journal_ops = []
        core.topics.attach(journal, core.life)
    for i in range(5):
        core.topic_publish(
            "orders/new",
            msgpack.packb({"n": i}),
            producer="shop",
            content_type="application/msgpack",
            headers=(("X-Trace", str(i)),),
            now=0.0,
        )
        core.topic_publish("other topic", b"%d" % i, producer="p", content_type="", now=0.0)
    return core


def latest(port: MonitorPort, request: bytes) -> dict:  # type: ignore[type-arg]
    return json.loads(port.answer(request, 0.0))


def test_latest_events_of_one_topic_oldest_first() -> None:
    port = MonitorPort(core_with_events())
    doc = latest(port, b"TOPIC LATEST 3 orders/new")
    assert doc["topic"] == "orders/new"
    assert [e["seq"] for e in doc["events"]] == [5, 7, 9]
    first = doc["events"][0]
    assert msgpack.unpackb(base64.b64decode(first["data"])) == {"n": 2}
    assert first["producer"] == "shop" and first["content_type"] == "application/msgpack"
    assert first["headers"] == [["X-Trace", "2"]] and len(first["uuid"]) == 32
    # a topic with a space in its name is the rest of the line
    assert [e["seq"] for e in latest(port, b"topic latest 2 other topic")["events"]] == [8, 10]
    assert latest(port, b"TOPIC LATEST 5 nothing/here")["events"] == []


def test_latest_through_the_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")
    try:
        core = core_with_events(journal)
        ops, core.life.journal_ops = core.life.journal_ops or [], []
        journal.apply(ops)  # what the server does at the end of a loop turn
        core.topics.saved()
        core.topic_publish("orders/new", b"\x01", producer="shop", content_type="", now=0.0)
        doc = latest(MonitorPort(core), b"TOPIC LATEST 2 orders/new")
        assert [e["seq"] for e in doc["events"]] == [9, 11]  # stored, then not yet committed
    finally:
        journal.close()


def test_bad_requests_are_answered_and_counted() -> None:
    core = core_with_events()
    port = MonitorPort(core)
    for bad in (b"TOPIC LATEST", b"TOPIC LATEST x orders/new", b"TOPIC LATEST 3"):
        assert port.answer(bad, 0.0).startswith(b"ERROR unknown command")
    assert port.answer(b"TOPIC LATEST 3 \xff\xfe", 0.0) == b"ERROR a topic is UTF-8"
    assert core.counters["protocol_errors"] == 4
    many = latest(port, b"TOPIC LATEST 100000 orders/new")["events"]
    assert len(many) == 5 and MAX_LATEST == 100
