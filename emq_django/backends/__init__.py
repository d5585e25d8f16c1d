"""The Django Tasks API backend for emq, and its ``emq_tasks`` app.

``TASKS = {"default": {"BACKEND": "emq_django.backends.EmqTaskBackend"}}``, and
``"emq_django.backends"`` in INSTALLED_APPS for READY/RUNNING statuses. The names
below are loaded on first use, so that the app (its model) does not need the
Django Tasks API to be importable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emq_django.backends.backend import EmqTaskBackend
    from emq_django.backends.tasks import EmqTask, emq_options

__all__ = ["EmqTask", "EmqTaskBackend", "emq_options"]


def __getattr__(name: str) -> Any:
    if name == "EmqTaskBackend":
        from emq_django.backends.backend import EmqTaskBackend

        return EmqTaskBackend
    if name in ("EmqTask", "emq_options"):
        from emq_django.backends import tasks

        return getattr(tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
