"""Reading a finished job back from the history (``emq.result(id)`` after a restart)."""

from __future__ import annotations

import json
from typing import Any

from emq_django.exceptions import TaskFailed


def stored_outcome(job_id: str) -> tuple[bool, Any, TaskFailed | None, str]:
    """(found, value, error, task) for ``job_id`` from ``JobResult``."""
    from emq_django.results.models import JobResult

    row = (
        JobResult.objects.filter(pk=job_id)
        .only("status", "result", "error_type", "error", "traceback", "task")
        .first()
    )
    if row is None or row.status == "retrying":  # not final: another attempt comes
        return False, None, None, ""
    if row.failed:
        return (
            True,
            None,
            TaskFailed.from_remote(row.error_type or row.status, row.error, row.traceback),
            row.task,
        )
    return True, (json.loads(row.result) if row.result else None), None, row.task
