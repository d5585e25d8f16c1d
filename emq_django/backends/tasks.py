"""``EmqTask``: the Django Tasks API ``Task`` with emq's options."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from emq_django.backends.compat import Task
from emq_django.backends.options import check_values

T = TypeVar("T", bound=Task)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EmqTask(Task):
    """What ``@task`` makes on an ``EmqTaskBackend``. ``None`` means: the backend's
    ``OPTIONS``, else emq's default (no guarantee, no retries, no time limit,
    sent at once)."""

    guarantee: bool | None = None
    retries: int | None = None
    timeout: float | None = None
    soft_timeout: float | None = None
    on_commit: bool | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        **emq_options: Any,
    ) -> EmqTask:
        """``Task.using()``, which also takes ``guarantee``, ``retries``, ``timeout``,
        ``soft_timeout`` and ``on_commit``. Raises ``ValueError`` for an unknown
        option or bad value."""
        # explicit base: zero-argument super() fails in a slots dataclass
        task: Any = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        if emq_options:
            check_values(f"{self.module_path}.using()", emq_options)
            task = dataclasses.replace(task, **emq_options)
        return task


def emq_options(**options: Any) -> Callable[[T], T]:
    """A decorator over ``@task`` that sets emq's options, on Django 5.2 and 6.0::

        @emq_options(guarantee=True, retries=3, timeout=60)
        @task
        def charge(order_id): ...

    Raises ``ValueError`` for an unknown option, ``TypeError`` when the task is not
    declared on an ``EmqTaskBackend``."""
    check_values("emq_options()", options)

    def apply(task: T) -> T:
        if not isinstance(task, EmqTask):
            raise TypeError(
                f"@emq_options needs a task on an EmqTaskBackend; {task!r} is a "
                f"{type(task).__name__} (check its backend= and TASKS)"
            )
        return task.using(**options)  # type: ignore[return-value]

    return apply
