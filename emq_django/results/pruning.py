"""Deleting history older than ``EMQ_RESULTS_RETENTION``, in small batches.

Batches keep each delete's write lock short, so that recording workers and the
admin are never held up for long.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from emq_django.results.models import JobResult, JobStat

BATCH = 5000
STATS_KEPT_AT_MOST = 86400.0  # the charts show an hour; a day is plenty


def prune(db: Any, retention: float, now: float | None = None) -> int:
    """Delete rows that finished more than ``retention`` s ago, through the Django
    connection wrapper ``db``; returns the number of JobResult rows deleted."""
    now = time.time() if now is None else now
    ops = db.ops
    results = ops.quote_name(JobResult._meta.db_table)
    stats = ops.quote_name(JobStat._meta.db_table)
    cutoff = ops.adapt_datetimefield_value(datetime.fromtimestamp(now - retention, UTC))
    stats_cutoff = ops.adapt_datetimefield_value(
        datetime.fromtimestamp(now - min(retention, STATS_KEPT_AT_MOST), UTC)
    )
    deleted = 0
    with db.cursor() as cursor:
        while True:
            cursor.execute(
                f"DELETE FROM {results} WHERE id IN "
                f"(SELECT id FROM {results} WHERE finished_at < %s LIMIT {BATCH})",
                [cutoff],
            )
            deleted += max(cursor.rowcount, 0)
            if cursor.rowcount < BATCH:
                break
        cursor.execute(f"DELETE FROM {stats} WHERE bucket < %s", [stats_cutoff])
    return deleted
