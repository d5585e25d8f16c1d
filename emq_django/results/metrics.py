"""``/emq/metrics``: the monitor's counters and gauges in Prometheus' text format.

Open to staff users (session login) and to ``Authorization: Bearer <token>``
when ``EMQ_METRICS_TOKEN`` is set.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse

from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import query
from emq_django.results import dashboard
from emq_django.results.conf import results_settings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric(name: str, kind: str, help_: str, samples: list[tuple[str, Any]]) -> Iterator[str]:
    yield f"# HELP {name} {help_}"
    yield f"# TYPE {name} {kind}"
    for labels, value in samples:
        yield f"{name}{labels} {value}"


def render(state: dict[str, Any]) -> str:
    lines = list(
        _metric(
            "emq_up",
            "gauge",
            "1 if the broker's monitor channel answered.",
            [("", int(state["ok"]))],
        )
    )
    if not state["ok"]:
        return "\n".join(lines) + "\n"
    doc = state["monitor"]
    for key, value in sorted(doc.get("counters", {}).items()):
        name = "emq_" + _NAME.sub("_", key) + "_total"
        lines += _metric(name, "counter", f"Broker counter {key}.", [("", value)])
    broker = doc.get("broker", {})
    lines += _metric(
        "emq_uptime_seconds", "gauge", "Broker uptime.", [("", broker.get("uptime", 0))]
    )
    lines += _metric(
        "emq_in_flight",
        "gauge",
        "Jobs dispatched, not yet answered.",
        [("", doc.get("in_flight", 0))],
    )
    queues = doc.get("queues", [])
    for field, help_ in (
        ("depth", "Jobs waiting in the queue."),
        ("in_flight", "Jobs of the queue running."),
    ):
        samples = [(f'{{queue="{_label(q["name"])}"}}', q.get(field, 0)) for q in queues]
        lines += _metric(f"emq_queue_{field}", "gauge", help_, samples)
    managers = doc.get("job_managers", [])
    for field, kind, help_ in (
        ("slots", "gauge", "Worker slots of the job manager."),
        ("busy", "gauge", "Busy slots."),
        ("free_slots", "gauge", "Credits (free slots) the broker holds."),
        ("jobs_done", "counter", "Jobs the job manager finished."),
        ("jobs_failed", "counter", "Of those, the failed ones (time-outs, lost processes)."),
    ):
        name = f"emq_job_manager_{field}" + ("_total" if kind == "counter" else "")
        samples = [
            (f'{{job_manager="{_label(m["identity"])}"}}', m.get(field, 0)) for m in managers
        ]
        lines += _metric(name, kind, help_, samples)
    lines += _metric(
        "emq_schedulers", "gauge", "Connected schedulers.", [("", len(doc.get("schedulers", [])))]
    )
    lines += _topic_metrics(doc)
    lines += _ha_metrics(doc.get("ha"))
    if state.get("dead_letters") is not None:
        lines += _metric(
            "emq_dead_letters", "gauge", "Dead-lettered jobs.", [("", state["dead_letters"])]
        )
    journal = state.get("journal") or {}
    if journal.get("size_bytes") is not None:
        lines += _metric(
            "emq_journal_size_bytes", "gauge", "Journal size.", [("", journal["size_bytes"])]
        )
    if journal.get("jobs") is not None:
        lines += _metric(
            "emq_journal_jobs", "gauge", "Jobs in the journal.", [("", journal["jobs"])]
        )
    return "\n".join(lines) + "\n"


def _topic_metrics(doc: dict[str, Any]) -> list[str]:
    """The Topics page's figures: per topic, and subscribers per port."""
    from emq_django.results.topics_page import figures

    fig = figures(doc)
    if not fig["available"]:
        return []
    lines = list(
        _metric(
            "emq_topics_last_seq",
            "gauge",
            "The broker's last event sequence number (all topics).",
            [("", fig["last_seq"] or 0)],
        )
    )
    topics = fig["topics"]
    for field, name, kind, help_ in (
        ("last_seq", "emq_topic_last_seq", "gauge", "Last sequence number of the topic."),
        ("events", "emq_topic_events_total", "counter", "Events published on the topic."),
        ("events_per_s", "emq_topic_events_per_second", "gauge", "Events/s on the topic now."),
    ):
        samples = [
            (f'{{topic="{_label(t["topic"])}"}}', t[field]) for t in topics if t[field] is not None
        ]
        lines += _metric(name, kind, help_, samples)
    lines += _metric(
        "emq_port_subscribers",
        "gauge",
        "Topic subscribers connected to each port.",
        [(f'{{port="{_label(p["port"])}"}}', p["subscribers"]) for p in fig["ports"]],
    )
    return lines


def _ha_metrics(ha: Any) -> list[str]:
    """The lease (``EMQ_JOURNAL_URL``): the answering broker's role, the epoch, the
    brokers by role, the last failover's duration and when it was."""
    if not isinstance(ha, dict):
        return []
    name = _label(ha.get("name"))
    lines = list(
        _metric(
            "emq_ha_active",
            "gauge",
            "1 if the broker that answered holds the lease (active), 0 if a standby.",
            [(f'{{broker="{name}"}}', int(ha.get("role") == "active"))],
        )
    )
    lines += _metric(
        "emq_ha_epoch",
        "gauge",
        "The lease's epoch (fencing token): +1 at each taking of the lease.",
        [("", ha.get("epoch") or 0)],
    )
    brokers = ha.get("brokers") or []
    roles = sorted({str(b.get("role")) for b in brokers} | {"active", "standby"})
    lines += _metric(
        "emq_ha_brokers",
        "gauge",
        "Brokers sharing the journal seen in the last minute, by role (unseen: silent 3 s).",
        [(f'{{role="{_label(r)}"}}', sum(b.get("role") == r for b in brokers)) for r in roles],
    )
    if ha.get("expires_in") is not None:
        lines += _metric(
            "emq_ha_lease_expires_in_seconds",
            "gauge",
            "Seconds until the lease expires unless renewed (PostgreSQL's clock).",
            [("", ha["expires_in"])],
        )
    failover = ha.get("last_failover")
    if isinstance(failover, dict):
        if failover.get("took_s") is not None:
            lines += _metric(
                "emq_ha_last_failover_seconds",
                "gauge",
                "The last failover: from the old lease's expiry to the new active serving.",
                [("", failover["took_s"])],
            )
        lines += _metric(
            "emq_ha_last_failover_timestamp_seconds",
            "gauge",
            "When the lease was last taken from another broker (Unix time).",
            [("", failover.get("at") or 0)],
        )
    return lines


def authorized(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = results_settings().metrics_token
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode())
    return False


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not authorized(request):
        response = HttpResponse(
            "staff login or a bearer token needed\n", status=401, content_type=CONTENT_TYPE
        )
        response["WWW-Authenticate"] = 'Bearer realm="emq metrics"'
        return response
    url, timeout = dashboard.monitor_url(), results_settings().dashboard_timeout
    state = dashboard.broker_state(url, timeout)
    text = render(state)
    if state["ok"]:
        text += render_tasks(task_stats(url, timeout))
    return HttpResponse(text, content_type=CONTENT_TYPE)


def task_stats(url: str, timeout: float) -> dict[str, Any] | None:
    """The monitor channel's ``TASKS``; None when it did not answer with them (a
    broker before issue 35 answers ERROR)."""
    try:
        doc = json.loads(query(url, b"TASKS", timeout))
    except (BrokerUnavailable, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def render_tasks(doc: dict[str, Any] | None) -> str:
    """Per task and queue: counters by outcome and the attempts' run-time histogram."""
    if not doc or not doc.get("enabled"):
        return ""
    tasks = doc.get("tasks", [])
    lines: list[str] = []
    for field, help_ in (
        ("succeeded", "Jobs of the task that succeeded."),
        ("failed", "Jobs of the task that failed for good (no retry left)."),
        ("retried", "Failed attempts of the task that were retried."),
        ("dead_lettered", "Jobs of the task moved to the dead letters."),
    ):
        samples = [(_task_labels(t), t.get(field, 0)) for t in tasks]
        lines += _metric(f"emq_task_{field}_total", "counter", help_, samples)
    lines.append("# HELP emq_task_run_seconds Run time of the task's attempts at the broker.")
    lines.append("# TYPE emq_task_run_seconds histogram")
    bounds = doc.get("buckets", [])
    for t in tasks:
        labels = _task_labels(t)[1:-1]
        for bound, count in zip(bounds, t.get("run_buckets", []), strict=False):
            lines.append(f'emq_task_run_seconds_bucket{{{labels},le="{bound}"}} {count}')
        lines.append(f'emq_task_run_seconds_bucket{{{labels},le="+Inf"}} {t.get("run_count", 0)}')
        lines.append(f"emq_task_run_seconds_sum{{{labels}}} {t.get('run_sum', 0)}")
        lines.append(f"emq_task_run_seconds_count{{{labels}}} {t.get('run_count', 0)}")
    return "\n".join(lines) + "\n"


def _task_labels(t: dict[str, Any]) -> str:
    return f'{{task="{_label(t.get("task") or "")}",queue="{_label(t.get("queue", ""))}"}}'
