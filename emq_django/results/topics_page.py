"""What the admin's Topics page and ``/emq/metrics`` show of the broker's topics.

Both read the monitor channel: ``MONITOR JSON`` for the figures (per topic: last
sequence, events/s; per port: subscribers) and ``TOPIC LATEST <n> <topic>`` for
a topic's latest events, whose data is decoded here (``topic_data.decode``).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import query
from emq_django.results import dashboard
from emq_django.results.conf import results_settings
from emq_django.results.topic_data import decode

LATEST = 20  # events of the selected topic shown
MAX_TOPIC = 255  # bytes, as the broker's topic space allows


def figures(monitor: dict[str, Any]) -> dict[str, Any]:
    """The topic figures of a ``MONITOR JSON`` document (its ``topics`` section, from
    ``TopicSpace.stats()`` plus the ports' subscribers) in the page's shape:
    ``{"available", "last_seq", "topics": [{topic, last_seq, events, events_per_s,
    last_ts}], "ports": [{port, subscribers}]}``; ``available`` is False for a
    broker without a topic space."""
    section = monitor.get("topics")
    if not isinstance(section, dict):
        return {"available": False, "last_seq": None, "topics": [], "ports": []}
    rows = []
    per_topic = section.get("topics")
    for name, stats in (per_topic if isinstance(per_topic, dict) else {}).items():
        if isinstance(stats, dict):
            rows.append(
                {
                    "topic": str(name),
                    "last_seq": stats.get("last_seq"),
                    "events": stats.get("published"),  # since the broker started
                    "events_per_s": stats.get("events_per_s"),
                    "last_ts": stats.get("last_ts"),
                }
            )
    rows.sort(key=lambda r: str(r["topic"]))
    ports = []
    per_port = section.get("ports")
    for name, stats in sorted((per_port if isinstance(per_port, dict) else {}).items()):
        count = stats.get("subscribers") if isinstance(stats, dict) else stats
        ports.append({"port": str(name), "subscribers": count if isinstance(count, int) else 0})
    return {
        "available": True,
        "last_seq": section.get("last_seq"),
        "published": section.get("published"),
        "topics": rows,
        "ports": ports,
    }


def latest(url: str, topic: str, n: int, timeout: float) -> dict[str, Any]:
    """The broker's latest ``n`` events of ``topic``, their data decoded."""
    raw = query(url, f"TOPIC LATEST {n} {topic}".encode(), timeout)
    if raw.startswith(b"ERROR"):
        return {"topic": topic, "events": [], "error": raw.decode("utf-8", "replace")}
    doc = json.loads(raw)
    events = []
    for e in doc.get("events", []):
        data = base64.b64decode(e.get("data", ""))
        content_type = e.get("content_type", "")
        events.append(
            {
                "seq": e.get("seq"),
                "ts": e.get("ts"),
                "producer": e.get("producer", ""),
                "content_type": content_type,
                "size": len(data),
                **decode(data, content_type),
            }
        )
    return {"topic": topic, "events": events, "error": doc.get("error", "")}


def valid_topic(topic: str) -> bool:
    return 0 < len(topic.encode("utf-8")) <= MAX_TOPIC and topic == topic.strip()


def data(topic: str = "", now: float | None = None) -> dict[str, Any]:
    """The Topics page's poll: the figures, and the selected topic's latest events."""
    now = time.time() if now is None else now
    url = dashboard.monitor_url()
    timeout = results_settings().dashboard_timeout
    doc: dict[str, Any] = {"address": url, "time": now, "poll_ms": dashboard.POLL_MS}
    state = dashboard.broker_state(url, timeout)
    doc["ok"] = state["ok"]
    if not state["ok"]:
        doc["error"] = state["error"]
        return doc
    doc.update(figures(state["monitor"]))
    doc["broker_time"] = state["monitor"].get("broker", {}).get("time", now)
    if topic:
        if not valid_topic(topic):
            doc["latest"] = {"topic": topic, "events": [], "error": "not a topic name"}
        else:
            try:
                doc["latest"] = latest(url, topic, LATEST, timeout)
            except BrokerUnavailable as exc:
                doc["latest"] = {"topic": topic, "events": [], "error": str(exc)}
    return doc
