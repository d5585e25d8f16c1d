"""Upserting metric rows into the Django models (no Spark here).

A batch hands over every row of the dates it touched; those dates' rows are
replaced in one transaction, so a rerun over the same data leaves the same rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models, transaction

from emq_django.analytics.models import FailureMetric, JobManagerMetric, QueueMetric, TaskMetric
from emq_django.analytics.schema import LATENCIES, PERCENTILE_NAMES

BATCH = 2000


def _ms(us: Any) -> float | None:
    return None if us is None else float(us) / 1000.0


def _aware(minute: dt.datetime | int) -> dt.datetime:
    """A UTC datetime from µs since the epoch (what the pipeline hands over) or a
    datetime (naive means UTC)."""
    if isinstance(minute, int):
        return dt.datetime.fromtimestamp(minute / 1_000_000, dt.UTC)
    return minute if minute.tzinfo else minute.replace(tzinfo=dt.UTC)


def _minute_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    fields = {
        "minute": _aware(row["minute"]),
        "jobs": row["jobs"],
        "succeeded": row["succeeded"],
        "failed": row["failed"],
        "timed_out": row["timed_out"],
        "retried": row["retried"],
        "throughput": row["throughput"],
        "run_total_ms": _ms(row["run_total_us"]) or 0.0,
    }
    for name in LATENCIES:
        for p in PERCENTILE_NAMES:
            fields[f"{name}_{p}_ms"] = _ms(row[f"{name}_{p}_us"])
    return fields


def queue_metric(row: Mapping[str, Any]) -> QueueMetric:
    return QueueMetric(queue=row["queue"], **_minute_fields(row))


def task_metric(row: Mapping[str, Any]) -> TaskMetric:
    return TaskMetric(queue=row["queue"], task=row["task"], **_minute_fields(row))


def jm_metric(row: Mapping[str, Any]) -> JobManagerMetric:
    return JobManagerMetric(
        jm=row["jm"],
        minute=_aware(row["minute"]),
        attempts=row["attempts"],
        succeeded=row["succeeded"],
        failed=row["failed"],
        busy_ms=_ms(row["busy_us"]) or 0.0,
        utilisation=row["utilisation"],
    )


def failure_metric(row: Mapping[str, Any]) -> FailureMetric:
    return FailureMetric(
        queue=row["queue"],
        task=row["task"],
        error=row["error"],
        minute=_aware(row["minute"]),
        failures=row["failures"],
    )


def _day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def replace_dates(
    model: type[models.Model], dates: Iterable[dt.date], objects: Iterable[models.Model]
) -> int:
    """Delete ``model``'s rows on ``dates`` and insert ``objects``; returns how many."""
    count = 0
    with transaction.atomic():
        for day in dates:
            start, end = _day_bounds(day)
            model._default_manager.filter(minute__gte=start, minute__lt=end).delete()
        chunk: list[models.Model] = []
        for obj in objects:
            chunk.append(obj)
            if len(chunk) >= BATCH:
                model._default_manager.bulk_create(chunk)
                count += len(chunk)
                chunk = []
        if chunk:
            model._default_manager.bulk_create(chunk)
            count += len(chunk)
    return count
