"""Reading and writing a Django Tasks API job's state.

Before it finishes, a job's state is its ``TaskState`` row (this app: READY when
enqueued, RUNNING once a worker process started it); once an attempt finished,
the job history (``emq_results.JobResult``, written by the job managers' recorder)
has the outcome. ``load()`` merges the two into a ``TaskResult``.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import DatabaseError
from django.utils import timezone
from django.utils.module_loading import import_string

from emq_django.backends.compat import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from emq_django.logconfig import job_fields

log = logging.getLogger(__name__)

_known: dict[str, Task] = {}  # module path -> the Task declared there (validate_task)
_next_prune = 0.0


def tracking() -> bool:
    """True when ``emq_django.backends`` is installed: READY and RUNNING are stored."""
    return apps.ready and apps.is_installed("emq_django.backends")


def history() -> bool:
    return apps.ready and apps.is_installed("emq_django.results")


def remember(task: Task) -> None:
    """Note the first Task seen for its function, so results can name it."""
    _known.setdefault(task.module_path, task)


def find_task(path: str) -> Task | None:
    """The Task whose function is ``path``: one declared in this process, else the
    module attribute of that name (the path comes from our own tables)."""
    task = _known.get(path)
    if task is not None:
        return task
    try:
        found = import_string(path)
    except ImportError:
        return None
    if isinstance(found, Task):
        remember(found)
        return found
    return None


# ---- writing ---------------------------------------------------------------------


def save_ready(result: TaskResult, queue: str, retries: int, run_after: datetime | None) -> None:
    """The READY row, written on the caller's connection (in its transaction, if any)."""
    from emq_django.backends.models import TaskState

    TaskState.objects.create(
        id=result.id,
        task=result.task.module_path,
        backend=result.backend,
        queue=queue,
        status=TaskState.READY,
        args=json.dumps(result.args),
        kwargs=json.dumps(result.kwargs),
        retries=retries,
        enqueued_at=result.enqueued_at or timezone.now(),
        run_after=run_after,
    )
    _prune_now_and_then()


def forget(*job_ids: str) -> None:
    from emq_django.backends.models import TaskState

    TaskState.objects.filter(pk__in=job_ids).delete()


def mark_running(job_id: str, attempt: int, worker: str, started: datetime) -> datetime | None:
    """Set the job RUNNING (in the worker process); returns when it was enqueued.

    A database error is logged and ignored: the job runs all the same, and the
    history will have its outcome."""
    from emq_django.backends.models import TaskState

    try:
        TaskState.objects.filter(pk=job_id).update(
            status=TaskState.RUNNING, attempts=attempt, worker=worker, started_at=started
        )
        row = TaskState.objects.filter(pk=job_id).values_list("enqueued_at", flat=True).first()
    except DatabaseError as exc:
        log.warning("could not mark job %s RUNNING: %s", job_id, exc, extra=job_fields(job_id))
        return None
    return row


def _prune_now_and_then() -> None:
    """Delete rows older than the history's retention, at most once per prune interval
    per process (an indexed range delete)."""
    global _next_prune
    if time.monotonic() < _next_prune:
        return
    from emq_django.backends.models import TaskState
    from emq_django.results.conf import results_settings

    conf = results_settings()
    _next_prune = time.monotonic() + conf.prune_interval
    cutoff = timezone.now() - timedelta(seconds=conf.retention)
    TaskState.objects.filter(enqueued_at__lt=cutoff).delete()


# ---- reading ---------------------------------------------------------------------


def load(result_id: str, alias: str) -> TaskResult:
    """The TaskResult of job ``result_id``; raises ``TaskResultDoesNotExist``."""
    state = _state_row(result_id)
    job = _history_row(result_id)
    if state is None and job is None:
        raise TaskResultDoesNotExist(f"no job {result_id!r} in the task states or the history")
    path = state.task if state is not None else job.task
    task = find_task(path)
    if task is None:
        raise TaskResultDoesNotExist(
            f"job {result_id!r} ran {path!r}, which is not a Django Tasks API task here"
        )
    if job is not None and (state is None or job.attempts >= state.attempts):
        return _finished(task, result_id, alias, state, job)
    assert state is not None
    return _pending(task, result_id, alias, state)


def _state_row(job_id: str) -> Any:
    if not tracking():
        return None
    from emq_django.backends.models import TaskState

    return TaskState.objects.filter(pk=job_id).first()


def _history_row(job_id: str) -> Any:
    if not history():
        return None
    from emq_django.results.models import JobResult

    return JobResult.objects.filter(pk=job_id).first()


def _pending(task: Task, job_id: str, alias: str, state: Any) -> TaskResult:
    status = TaskResultStatus.RUNNING if state.status == state.RUNNING else TaskResultStatus.READY
    return TaskResult(
        task=task,
        id=job_id,
        status=status,
        enqueued_at=state.enqueued_at,
        started_at=state.started_at,
        finished_at=None,
        last_attempted_at=state.started_at,
        args=json.loads(state.args),
        kwargs=json.loads(state.kwargs),
        backend=state.backend or alias,
        errors=[],
        worker_ids=[state.worker] * state.attempts,
    )


def _finished(task: Task, job_id: str, alias: str, state: Any, job: Any) -> TaskResult:
    args, kwargs = job.decoded_args()
    if state is not None:
        args, kwargs = json.loads(state.args), json.loads(state.kwargs)
    errors = []
    if job.status == "succeeded":
        status = TaskResultStatus.SUCCESSFUL
    else:
        errors.append(TaskError(exception_class_path=_class_path(job), traceback=job.traceback))
        retries_left = job.status == "retrying" or (
            state is not None and job.attempts <= state.retries and job.status != "cancelled"
        )
        status = TaskResultStatus.READY if retries_left else TaskResultStatus.FAILED
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=job_id,
        status=status,
        enqueued_at=job.enqueued_at or (state.enqueued_at if state is not None else None),
        started_at=job.started_at,
        finished_at=job.finished_at if status != TaskResultStatus.READY else None,
        last_attempted_at=job.started_at,
        args=args,
        kwargs=kwargs,
        backend=state.backend if state is not None else alias,
        errors=errors,
        worker_ids=[job.job_manager] * job.attempts,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.value())
    return result


def _class_path(job: Any) -> str:
    """``TaskError.exception_class_path``: builtins are named bare in the history."""
    name = job.error_type or "Exception"
    return name if "." in name else f"builtins.{name}"
