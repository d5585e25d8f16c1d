"""``EmqTaskBackend``: the Django Tasks API on emq job managers.

    TASKS = {"default": {"BACKEND": "emq_django.backends.EmqTaskBackend",
                         "QUEUES": ["default", "email"],
                         "OPTIONS": {"guarantee": True, "retries": 2}}}

``.enqueue()`` sends the task to the broker like ``@emq.task``'s ``apply_async``
(its ``queue_name`` is the emq queue, ``run_after`` the delay); job managers run it
when its module is among the task modules they import. Results and statuses come
from the job history (``emq_django.results``) and the ``TaskState`` table of this
app (``emq_django.backends``): put both in INSTALLED_APPS and set ``EMQ_RECORDER``.

Priority: ``supports_priority`` is True; a task's ``priority`` (-100..100, higher
first) travels to the broker, which dispatches each queue in priority order, with
aging (docs: Priority).
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import uuid
from collections import OrderedDict
from typing import Any

from django.core import checks
from django.utils import timezone

from emq_django.backends import state
from emq_django.backends.compat import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from emq_django.backends.options import NAMES, JobOptions, backend_defaults, check_values
from emq_django.backends.tasks import EmqTask
from emq_django.exceptions import JobsRefused
from emq_django.transaction import on_commit

EAGER_KEPT = 1000  # results of EMQ_EAGER runs kept for get_result(), per process


class EmqTaskBackend(BaseTaskBackend):
    task_class = EmqTask

    supports_defer = True  # run_after: the broker's run-after timer
    supports_async_task = True  # a coroutine runs to completion in the worker process
    supports_get_result = True  # from the history and TaskState, in any process
    supports_priority = True  # the broker's priority order (docs: Priority)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.defaults = backend_defaults(alias, self.options)
        # "QUEUES": [] lets a task name any emq queue
        if params.get("QUEUES") == []:
            self.queues = set()

    # ---- the Django Tasks API ---------------------------------------------------

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if isinstance(task, EmqTask):
            values = {name: getattr(task, name) for name in NAMES}
            try:
                check_values(task.module_path, values)
            except ValueError as exc:
                raise InvalidTaskError(str(exc)) from None
        state.remember(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Send ``task`` (after the transaction commits, with ``on_commit``). Raises
        ``InvalidTask``, ``TypeError`` for arguments JSON cannot carry, and what
        ``apply_async`` raises (``BrokerUnavailable``, ``QueueFull``, ...)."""
        self.validate_task(task)
        opts = self.job_options(task)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=_new_job_id(),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        send = functools.partial(self._send, task, result, opts)
        if opts.on_commit:
            on_commit(send)
        else:
            send()
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """Raises ``TaskResultDoesNotExist`` for a job no table knows (yet)."""
        eager = _eager_results.get(result_id)
        if eager is not None:
            return eager
        return state.load(result_id, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from django.apps import apps

        messages: list[checks.CheckMessage] = []
        for app, what in (
            ("emq_django.results", "finished tasks' results and statuses"),
            ("emq_django.backends", "READY and RUNNING statuses"),
        ):
            if not apps.is_installed(app):
                messages.append(
                    checks.Warning(
                        f"TASKS[{self.alias!r}] uses EmqTaskBackend but {app!r} is not in "
                        f"INSTALLED_APPS: get_result() cannot report {what}",
                        hint=f"add {app!r} to INSTALLED_APPS (and set EMQ_RECORDER)",
                        id="emq.W101",
                    )
                )
        return messages

    # ---- emq --------------------------------------------------------------------

    def job_options(self, task: Task) -> JobOptions:
        """The task's emq options (options.NAMES) over the backend's OPTIONS."""
        if not isinstance(task, EmqTask):
            return self.defaults
        return self.defaults.merged(**{name: getattr(task, name) for name in NAMES})

    def _send(self, task: Task, result: TaskResult, opts: JobOptions) -> None:
        from emq_django.conf import cached_settings

        object.__setattr__(result, "enqueued_at", timezone.now())
        if cached_settings().EAGER:
            self._run_eagerly(task, result)
            return
        from emq_django.backends.runner import job_for

        tracked = state.tracking()
        if tracked:
            state.save_ready(result, task.queue_name, opts.retries, task.run_after)
        try:
            job_for(task).apply_async(
                result.args,
                result.kwargs,
                queue=task.queue_name,
                retries=opts.retries,
                timeout=opts.timeout,
                soft_timeout=opts.soft_timeout,
                guarantee=opts.guarantee,
                reply=False,  # results are read from the history, not from a REPLY
                eta=_aware(task.run_after),
                job_id=result.id,
                priority=int(task.priority),  # validate_task: a whole number
            )
        except BaseException as exc:
            if tracked:
                state.forget(result.id)
                # earlier jobs the broker refused (sent without reply: JobsRefused)
                # never run: no READY row for ever
                if isinstance(exc, JobsRefused):
                    state.forget(*exc.job_ids)
            raise
        task_enqueued.send(type(self), task_result=result)

    def _run_eagerly(self, task: Task, result: TaskResult) -> None:
        """``EMQ_EAGER``: run here and now, as Django's ImmediateBackend does."""
        from emq_django.backends.runner import execute

        task_enqueued.send(type(self), task_result=result)
        execute(task, result)
        with _eager_lock:
            _eager_results[result.id] = result
            while len(_eager_results) > EAGER_KEPT:
                _eager_results.popitem(last=False)


_eager_results: OrderedDict[str, TaskResult] = OrderedDict()
_eager_lock = threading.Lock()


def _new_job_id() -> str:
    # not the client's counter: enqueue() may run on any thread, outside its lock
    return uuid.uuid4().hex


def _aware(when: dt.datetime | None) -> dt.datetime | None:
    if when is None or timezone.is_aware(when):
        return when
    return timezone.make_aware(when)  # USE_TZ = False: naive times are local


__all__ = ["EmqTaskBackend", "TaskResultDoesNotExist"]
