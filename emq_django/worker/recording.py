"""The hook through which a job manager records finished jobs (results, history).

``EMQ_RECORDER`` names a class (dotted path) with ``record(JobRecord)`` and
``flush()``. It runs in the job manager's recorder process
(``recorder_process.py``), which the worker processes send their records to:
``record`` for every finished job, ``flush`` after each batch that arrived and
whenever the process is idle, so a recorder writes in batches and never costs
a database round trip per job.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from django.utils.module_loading import import_string

from emq_django.broker.retry import RETRY_REQUESTED_LIMIT, retry_limit
from emq_django.ids import split_attempt

__all__ = ["RETRY_REQUESTED_LIMIT", "load_recorder", "split_attempt"]

log = logging.getLogger(__name__)


class JobRecord(NamedTuple):
    """One finished attempt. A named tuple, not a dataclass: one is made per job,
    and a frozen dataclass costs several times as much to build."""

    job_id: str  # the client's msgid: Result.id
    attempt: int
    task: str  # registered name, '' when the body named none
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    started: float  # wall clock, seconds
    finished: float
    failed: bool
    error_type: str
    body: bytes  # the REPLY body: {"value": ...} or {"error": {...}}
    manager: str  # the job manager's name
    lost: bool = False  # the worker process died or was killed; the manager answered
    retry_count: int = 0  # the job's retry-count: a failure below it will be retried
    partials: int = 0  # partial results the attempt sent (streaming.py)


class JobRecorder(Protocol):
    """``record`` for every finished job, ``flush`` after each batch and when idle
    (a recorder may do periodic work there); ``flush`` writes everything recorded
    so far. A recorder may also define ``close()``, called once when the process
    ends (after the last flush)."""

    def record(self, record: JobRecord) -> None: ...

    def flush(self) -> None: ...


def close_recorder(recorder: JobRecorder | None) -> None:
    """Flush and close ``recorder`` at exit; its errors are logged, never raised."""
    if recorder is None:
        return
    try:
        recorder.flush()
        close = getattr(recorder, "close", None)
        if close is not None:
            close()
    except Exception:
        log.exception("the job recorder failed while closing")


CANCELLED = "emq_django.exceptions.Cancelled"
RETRY = "emq_django.exceptions.Retry"


def will_retry(record: JobRecord) -> bool:
    """Whether the broker tries a failed attempt again (its rule, as far as the
    record knows it: ``retry_count`` is the job's retries, or for a lost guaranteed
    job the larger number of deaths it survives)."""
    if not record.failed or record.error_type == CANCELLED:
        return False
    return record.attempt <= retry_limit(record.retry_count, record.error_type == RETRY)


def load_recorder(path: str) -> JobRecorder | None:
    """Instantiate ``EMQ_RECORDER``; raises ImportError naming it when it is wrong."""
    if not path:
        return None
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImportError(f"EMQ_RECORDER={path!r} cannot be imported: {exc}") from exc
    recorder: JobRecorder = cls()
    return recorder
