"""What the dashboard shows: the broker's live state and the last hour's figures.

The live part comes from the monitor channel (``MONITOR JSON``), asked with a
short timeout so that a stopped broker shows as unreachable within one poll;
the charts and the per-queue rates come from ``JobStat`` (10-second buckets).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError
from django.db.models import Max, Sum

from emq_django.conf import cached_settings
from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import status
from emq_django.results.conf import results_settings

POLL_MS = 2000
HOUR = 3600
RATE_WINDOW = 60  # seconds of complete buckets behind a queue's rate


def monitor_url() -> str:
    return cached_settings().MONITOR_URL


def broker_state(url: str, timeout: float) -> dict[str, Any]:
    """``{"ok": True, "monitor": doc}`` or ``{"ok": False, "error": ...}``."""
    try:
        doc = status(url, timeout=timeout)
    except BrokerUnavailable as exc:
        return {"ok": False, "error": str(exc)}
    return {
        "ok": True,
        "monitor": doc,
        # from the broker's journal and dead letters (issue #3) when it reports them
        "dead_letters": _count(doc.get("dead_letters")),
        "journal": _journal(doc.get("journal")),
    }


def _count(value: Any) -> int | None:
    """A count given as a number, or as a per-queue mapping or a list of entries."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, dict):
        return sum(v if isinstance(v, int) else 1 for v in value.values())
    if isinstance(value, list):
        return len(value)
    return None


def _journal(value: Any) -> dict[str, int | None] | None:
    """Its size and jobs: ``waiting`` (ready, delayed, spilled: not finished),
    ``dead`` (dead letters) and ``done`` (finished, kept only to de-duplicate a
    resend), so that a finished job does not read as one pending."""
    if not isinstance(value, dict):
        return None
    jobs = value.get("jobs")
    journal: dict[str, int | None] = {
        "size_bytes": _count(value.get("size_bytes")),
        "jobs": _count(jobs),
    }
    if isinstance(jobs, dict):
        counts = {k: v for k, v in jobs.items() if isinstance(v, int)}
        dead, done = counts.get("dead", 0), counts.get("done", 0)
        journal.update(dead=dead, done=done, waiting=sum(counts.values()) - dead - done)
    return journal


def series(now: float) -> dict[str, Any]:
    """Per 10-second bucket over the last hour: jobs/s (ok, failed), mean and max ms."""
    from emq_django.results.models import JobStat  # here: urls.py imports this module

    width = JobStat.BUCKET_SECONDS
    end = int(now // width) * width  # the current bucket is still filling: left out
    since = datetime.fromtimestamp(end - HOUR, UTC)
    rows = (
        JobStat.objects.filter(bucket__gte=since, bucket__lt=datetime.fromtimestamp(end, UTC))
        .values("bucket")
        .annotate(
            ok=Sum("succeeded"),
            failed=Sum("failed"),
            run_sum=Sum("run_sum"),
            run_max=Max("run_max"),
        )
        .order_by("bucket")
    )
    points = []
    for row in rows:
        done = (row["ok"] or 0) + (row["failed"] or 0)
        points.append(
            [
                int(row["bucket"].timestamp()),
                round((row["ok"] or 0) / width, 2),
                round((row["failed"] or 0) / width, 2),
                round((row["run_sum"] or 0.0) / done * 1000, 3) if done else None,
                round((row["run_max"] or 0.0) * 1000, 3),
            ]
        )
    return {"bucket_seconds": width, "from": end - HOUR, "to": end - width, "points": points}


def queue_rates(now: float) -> dict[str, float]:
    """Jobs/s each queue finished over the last minute of complete buckets."""
    from emq_django.results.models import JobStat

    width = JobStat.BUCKET_SECONDS
    end = int(now // width) * width  # the current bucket is still filling
    rows = (
        JobStat.objects.filter(
            bucket__gte=datetime.fromtimestamp(end - RATE_WINDOW, UTC),
            bucket__lt=datetime.fromtimestamp(end, UTC),
        )
        .values("queue")
        .annotate(ok=Sum("succeeded"), failed=Sum("failed"))
    )
    return {r["queue"]: round(((r["ok"] or 0) + (r["failed"] or 0)) / RATE_WINDOW, 2) for r in rows}


LAST_SEEN_KEY = "emq:dashboard:last-seen"


def remember_last(doc: dict[str, Any], now: float) -> None:
    """Keep the broker's last answer (Django's cache), and give it with a failure:
    the cards of a page opened while the broker is down show the last figures seen."""
    from django.core.cache import cache

    keys = ("monitor", "dead_letters", "journal")
    try:
        if doc["ok"]:
            cache.set(
                LAST_SEEN_KEY,
                {"time": now, "address": doc["address"], **{k: doc[k] for k in keys}},
                None,
            )
        else:
            doc["last"] = cache.get(LAST_SEEN_KEY)
    except Exception:  # noqa: BLE001  (a cache that fails costs only the last figures)
        doc.setdefault("last", None)


def data(now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    url = monitor_url()
    doc: dict[str, Any] = {"address": url, "time": now, "poll_ms": POLL_MS}
    doc.update(broker_state(url, results_settings().dashboard_timeout))
    remember_last(doc, now)
    try:
        doc["series"] = series(now)
        doc["queue_rates"] = queue_rates(now)
        doc["history"] = True
    except DatabaseError as exc:
        doc["series"], doc["queue_rates"] = None, {}
        doc["history"] = f"the job history is unavailable: {exc}"
    return doc
