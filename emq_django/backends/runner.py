"""Running a Django Tasks API task in a job manager's worker process.

``discovery`` registers a ``DjangoTaskJob`` for every task declared on an
``EmqTaskBackend``; the worker runs it like any ``@emq.task``. Its function wraps
the task's: it marks the job RUNNING, sends ``task_started``, calls the task (with a
``TaskContext`` when it takes one), and sends ``task_finished``. A failure is raised
again, so the REPLY, the retries and the history see it as they see any other.
"""

from __future__ import annotations

import functools
import os
import socket
import traceback
import uuid
from typing import Any

from django.utils import timezone

from emq_django.backends import state
from emq_django.backends.compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from emq_django.task import Task as EmqJob
from emq_django.worker.execution import current_job
from emq_django.worker.recording import split_attempt

_worker_id = ""


def worker_id() -> str:
    """``host:pid``: a worker process (computed after the job manager forked)."""
    global _worker_id
    if not _worker_id.endswith(f":{os.getpid()}"):
        _worker_id = f"{socket.gethostname()}:{os.getpid()}"
    return _worker_id


class DjangoTaskJob(EmqJob[..., Any]):
    """The registry's entry for a Django Tasks API task: named by its function's
    module path, as the backend names the jobs it sends."""

    def __init__(self, task: Task) -> None:
        super().__init__(
            task.func, queue=task.queue_name, retries=0, timeout=0, guarantee=False, reply=False
        )
        self.django_task = task
        self.fn = functools.partial(run_in_worker, task)

    def __repr__(self) -> str:
        return f"<Django task {self.name} backend={self.django_task.backend}>"


def run_in_worker(task: Task, *args: Any, **kwargs: Any) -> Any:
    """Run ``task`` as the job ``execute()`` is running; raises what the task raised."""
    attempt_id = current_job.get()
    job_id, attempt = split_attempt(attempt_id) if attempt_id else (uuid.uuid4().hex, 1)
    started = timezone.now()
    enqueued = None
    if state.tracking():
        enqueued = state.mark_running(job_id, attempt, worker_id(), started)
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=job_id,
        status=TaskResultStatus.READY,
        enqueued_at=enqueued,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=list(args),
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[worker_id()] * (attempt - 1),
    )
    error = execute(task, result)
    if error is not None:
        raise error
    return result.return_value


def execute(task: Task, result: TaskResult) -> BaseException | None:
    """Run ``task`` for ``result``, mutating it as the Django Tasks API backends do
    and sending ``task_started`` and ``task_finished``; returns the exception the
    task raised, if any."""
    sender = type(task.get_backend())
    now = timezone.now()
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    object.__setattr__(result, "started_at", now)
    object.__setattr__(result, "last_attempted_at", now)
    result.worker_ids.append(worker_id())
    task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        object.__setattr__(result, "_return_value", normalize_json(value))
    except Exception as exc:
        object.__setattr__(result, "finished_at", timezone.now())
        cls = type(exc)
        result.errors.append(
            TaskError(
                exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
        )
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        # inside the handler, as Django's backends do: receivers may log exc_info
        task_finished.send(sender=sender, task_result=result)
        return exc
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    task_finished.send(sender=sender, task_result=result)
    return None


def job_for(task: object) -> EmqJob:
    """The registry entry for ``task`` (made once per function, so that registering
    it again is a no-op)."""
    path = task.module_path  # type: ignore[attr-defined]
    job = _jobs.get(path)
    if job is None:
        job = _jobs[path] = DjangoTaskJob(task)  # type: ignore[arg-type]
    return job


_jobs: dict[str, EmqJob] = {}
