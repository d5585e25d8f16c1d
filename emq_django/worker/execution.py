"""Running one job: look up the registered task, call it, encode the outcome."""

from __future__ import annotations

import logging
import traceback
from contextvars import ContextVar
from dataclasses import dataclass
from types import GeneratorType
from typing import Protocol

from django.db import close_old_connections
from django.db.backends.signals import connection_created

from emq_django import registry
from emq_django.exceptions import ProtocolError, Retry, type_name
from emq_django.logconfig import job_fields
from emq_django.protocol.body import RunBody, decode_run_body, encode_failure, encode_result
from emq_django.streaming import PartialSink, drain, partial_sink

log = logging.getLogger(__name__)

# The attempt id (``<job id>#<n>``) of the job this worker process is running, for
# code that must know it (the Django Tasks backend's TaskResult.id).
current_job: ContextVar[bytes] = ContextVar("emq_current_job", default=b"")


# A task that returns nothing (the common case): its REPLY body, encoded once.
_NONE_RESULT = encode_result(None)


class _Connections:
    """Whether this process has opened a database connection, ever.

    Until one is opened, closing "old" connections after a job has nothing to
    close (the job manager closes its own before it forks), and asking Django
    costs a few µs per job; from the first one on, every job ends with
    ``close_old_connections()`` as before.
    """

    opened = False

    @classmethod
    def on_created(cls, **kwargs: object) -> None:
        cls.opened = True


connection_created.connect(_Connections.on_created, dispatch_uid="emq_worker_connections")


def note_open_connections() -> None:
    """Count a connection opened before this module was imported (a worker
    process calls this once, when it starts)."""
    from django.db import connections

    if any(c.connection is not None for c in connections.all(initialized_only=True)):
        _Connections.opened = True


@dataclass(slots=True)  # not frozen: a frozen one costs several µs to build, per job
class Outcome:
    """What a job came to: the REPLY body, and what the trace and results need."""

    body: bytes
    failed: bool
    error_type: str = ""
    spec: RunBody | None = None
    retry: float | None = None  # emq.Retry: the delay it asked for, -1 for the backoff
    partials: int = 0  # partial results it sent (a generator's values, emq.partial())
    exception: BaseException | None = None  # what the task raised (signals.job_failed)
    # a failed attempt's span (W3C traceparent form), for its retries' links:
    # worker/observing.py sets it when the job has no ``first-attempt`` header yet
    span: bytes = b""

    def status(self, ready: bool) -> bytes:
        """The REPLY's status frame: ``ok``/``failed``, ``ready``, ``error:<type>``,
        ``retry[:<s>]``, ``span:<traceparent>``."""
        if not self.failed:
            return b"ok,ready" if ready else b"ok"
        status = b"failed,ready" if ready else b"failed"
        if self.error_type:
            status += b",error:" + self.error_type.replace(",", "_").encode()[:64]
        if self.retry is not None:
            status += b",retry" if self.retry < 0 else b",retry:%.3f" % self.retry
        if self.span:
            status += b",span:" + self.span
        return status


def failure(exc: BaseException, tb: str = "", spec: RunBody | None = None) -> Outcome:
    name = type_name(exc)
    return Outcome(encode_failure(name, str(exc), tb), True, name, spec, exception=exc)


class _Counted:
    """A partial sink that counts what went through it (the history's ``partials``)."""

    __slots__ = ("sink", "count")

    def __init__(self, sink: PartialSink | None) -> None:
        self.sink = sink
        self.count = 0

    def __call__(self, body: bytes) -> None:
        self.count += 1
        if self.sink is not None:
            self.sink(body)


class CountingSink(Protocol):
    """A partial sink that counts the partials it took (``count``, from 0)."""

    count: int

    def __call__(self, body: bytes) -> None: ...


def execute(body: bytes, job_id: bytes = b"", sink: PartialSink | None = None) -> Outcome:
    """Run the job in ``body``. Never raises: every failure is an ``Outcome``.
    ``sink`` gets each partial result as it is produced (streaming.py)."""
    return execute_counting(body, job_id, _Counted(sink))


def execute_counting(body: bytes, job_id: bytes, sink: CountingSink) -> Outcome:
    """``execute`` with a sink that counts for itself (a worker process's
    ``partial_sender.PartialSender``): no wrapper per job."""
    outcome = run_in_place(body, job_id, sink)
    # Closing after every job also closes "before" the next one: nothing runs between
    # jobs, and the job manager closes all connections before it forks.
    if _Connections.opened:
        close_old_connections()
    if sink.count:
        outcome.partials = sink.count  # a fresh Outcome per job: nothing shares it
    return outcome


def run_in_place(body: bytes, job_id: bytes, sink: CountingSink) -> Outcome:
    """Run the job in ``body`` and leave the database connections as they are
    (``emq_django.testing`` runs jobs inside a test's transaction, which closing
    them would break). Never raises: every failure is an ``Outcome``."""
    try:
        spec = decode_run_body(body)
    except ProtocolError as exc:
        log.warning(
            "refused job %s: %s",
            job_id.decode(errors="replace"),
            exc.reason,
            extra=job_fields(job_id),
        )
        name = "emq_django.exceptions.ProtocolError"
        return Outcome(encode_failure(name, exc.reason, ""), True, name)
    task = registry.find(spec.task_name)
    if task is None:
        log.warning(
            "refused job %s: %s is not a registered task; it was not imported",
            job_id.decode(errors="replace"),
            spec.task_name,
            extra=job_fields(job_id, task=spec.task_name),
        )
        name = "emq_django.exceptions.TaskNotFound"
        message = f"{spec.task_name!r} is not a registered task"
        return Outcome(encode_failure(name, message, ""), True, name, spec)
    token = current_job.set(job_id)
    sink_token = partial_sink.set(sink)
    try:
        value = task.fn(*spec.args, **spec.kwargs)
        if value is not None and type(value) is GeneratorType:  # streaming.run_task's rule
            value = drain(value)
    except Retry as exc:
        log.info(
            "job %s (%s) asked to be retried: %s",
            job_id.decode(errors="replace"),
            task.name,
            exc,
            extra=job_fields(job_id, task=task.name),
        )
        name = "emq_django.exceptions.Retry"
        delay = -1.0 if exc.delay is None else max(0.0, float(exc.delay))
        return Outcome(encode_failure(name, str(exc), ""), True, name, spec, delay, exception=exc)
    except Exception as exc:
        log.info(
            "job %s (%s) failed: %s: %s",
            job_id.decode(errors="replace"),
            task.name,
            type_name(exc),
            exc,
            extra=job_fields(job_id, task=task.name),
        )
        return failure(exc, traceback.format_exc(), spec)
    finally:
        partial_sink.reset(sink_token)
        current_job.reset(token)
    if value is None:
        return Outcome(_NONE_RESULT, False, "", spec)
    try:
        return Outcome(encode_result(value), False, "", spec)
    except (TypeError, ValueError) as exc:
        return failure(
            TypeError(f"the result of {task.name} is not JSON serializable: {exc}"), spec=spec
        )
