"""The data behind the admin's metrics page, read from the models."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, F, FloatField, Max, Min, Sum
from django.db.models.functions import Cast

from emq_django.analytics.models import FailureMetric, JobManagerMetric, QueueMetric, TaskMetric

Series = dict[str, list[tuple[dt.datetime, float]]]


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    end: dt.datetime

    @classmethod
    def last(cls, hours: float, now: dt.datetime | None = None) -> Window:
        """At most ``hours`` up to the newest metric (or ``now`` when there is none),
        and no earlier than the first one: a young demo's minutes fill the chart."""
        span = QueueMetric.objects.aggregate(first=Min("minute"), newest=Max("minute"))
        newest, first = span["newest"], span["first"]
        end = (newest + dt.timedelta(minutes=1)) if newest else (now or dt.datetime.now(dt.UTC))
        start = end - dt.timedelta(hours=hours)
        if first is not None and first > start:
            start = first
        return cls(start, max(end, start + dt.timedelta(minutes=1)))

    @property
    def chart_end(self) -> dt.datetime:
        """The x axis ends at the last minute's point (a minute is drawn at its start)."""
        return max(self.end - dt.timedelta(minutes=1), self.start + dt.timedelta(minutes=1))

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


def queue_series(window: Window) -> dict[str, Series]:
    """Per chart (throughput, e2e p95, failure rate): one series per queue."""
    charts: dict[str, Series] = {"throughput": {}, "p95": {}, "failure_rate": {}}
    rows = QueueMetric.objects.filter(minute__gte=window.start, minute__lt=window.end).order_by(
        "minute"
    )
    for m in rows:
        charts["throughput"].setdefault(m.queue, []).append((m.minute, m.throughput))
        if m.e2e_p95_ms is not None:
            charts["p95"].setdefault(m.queue, []).append((m.minute, m.e2e_p95_ms))
        charts["failure_rate"].setdefault(m.queue, []).append((m.minute, 100 * m.failure_rate))
    return charts


def slowest_tasks(window: Window, limit: int = 15) -> list[dict[str, Any]]:
    """Tasks by their worst minute's p95 run time in the window, with totals."""
    rows = (
        TaskMetric.objects.filter(minute__gte=window.start, minute__lt=window.end)
        .values("queue", "task")
        .annotate(
            jobs=Sum("jobs"),
            failed=Sum("failed"),
            run_total=Sum("run_total_ms"),
            worst_p95=Max("run_p95_ms"),
            worst_p99=Max("run_p99_ms"),
        )
        .order_by(F("worst_p95").desc(nulls_last=True), "queue", "task")[:limit]
    )
    out = []
    for r in rows:
        jobs = r["jobs"] or 0
        out.append(
            {
                **r,
                "task": r["task"] or "(unnamed)",
                "run_mean": (r["run_total"] or 0.0) / jobs if jobs else None,
                "failure_rate": 100.0 * (r["failed"] or 0) / jobs if jobs else 0.0,
            }
        )
    return out


def utilisation(window: Window) -> list[dict[str, Any]]:
    """Per job manager: the mean busy processes over the minutes it has rows for
    (a minute without one is a minute it was not running, or had nothing to do)."""
    rows = (
        JobManagerMetric.objects.filter(minute__gte=window.start, minute__lt=window.end)
        .values("jm")
        .annotate(
            attempts=Sum("attempts"),
            busy=Sum("busy_ms"),
            peak=Max("utilisation"),
            minutes=Count("minute"),
        )
        .order_by("jm")
    )
    return [{**r, "mean": (r["busy"] or 0.0) / 60000.0 / max(r["minutes"], 1)} for r in rows]


def failures(window: Window, limit: int = 15) -> list[dict[str, Any]]:
    rows = (
        FailureMetric.objects.filter(minute__gte=window.start, minute__lt=window.end)
        .values("queue", "task", "error")
        .annotate(n=Cast(Sum("failures"), FloatField()))
        .order_by("-n", "queue", "task", "error")[:limit]
    )
    totals: dict[str, float] = defaultdict(float)
    for r in rows:
        totals[r["queue"]] += r["n"]
    return [{**r, "n": int(r["n"]), "task": r["task"] or "(unnamed)"} for r in rows]
