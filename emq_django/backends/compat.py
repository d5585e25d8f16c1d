"""The Django Tasks API, from wherever it is installed.

Django 6.0 ships it as ``django.tasks``; on Django 5.2 it comes from the
``django-tasks`` package (``pip install 'emq-django[tasks]'``) as ``django_tasks``.
Everything else in this package imports the API from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # django-stubs describes django.tasks; django_tasks has the same API
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE: str
else:
    try:  # Django >= 6.0
        from django.tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import InvalidTask as InvalidTaskError
        from django.tasks.exceptions import TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        SOURCE = "django.tasks"
    except ImportError:  # Django 5.2 + the django-tasks package
        try:
            from django_tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import (
                Task,
                TaskContext,
                TaskError,
                TaskResult,
                TaskResultStatus,
            )
            from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
        except ImportError as exc:
            raise ImportError(
                "emq_django.backends needs the Django Tasks API: Django >= 6.0, or on "
                "Django 5.2 the django-tasks package (pip install 'emq-django[tasks]')"
            ) from exc

        SOURCE = "django_tasks"


def normalize_json(obj: Any) -> Any:
    """Lists for tuples, str keys: what a value looks like after a JSON round trip."""
    try:
        from django.utils.json import normalize_json as normalize
    except ImportError:  # Django 5.2
        from django_tasks.utils import normalize_json as normalize
    return normalize(obj)


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
