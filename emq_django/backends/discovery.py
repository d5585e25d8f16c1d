"""Which Django Tasks API tasks a job manager runs.

``registry.autodiscover`` imports the ``tasks`` module of every installed app and
the modules in ``EMQ_IMPORTS``; then ``register_django_tasks`` registers the
``Task`` objects found as attributes of those modules whose backend is an
``EmqTaskBackend``, under their function's module path. Nothing is imported here:
a job naming any other function is refused, as for ``@emq.task``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from emq_django import registry

log = logging.getLogger(__name__)


def task_modules(imports: Iterable[str]) -> list[str]:
    """The modules ``autodiscover`` imported: each app's ``tasks``, then ``imports``."""
    from django.apps import apps

    names = [f"{config.name}.tasks" for config in apps.get_app_configs()]
    return [name for name in [*names, *imports] if name in sys.modules]


def register_django_tasks(imports: Iterable[str] = ()) -> list[str]:
    """Register the EmqTaskBackend tasks of the imported task modules; returns their
    names. Does nothing when the Django Tasks API is not installed."""
    try:
        from emq_django.backends.compat import Task
    except ImportError:
        return []
    from emq_django.backends.runner import job_for

    found = []
    for module_name in task_modules(imports):
        for value in list(vars(sys.modules[module_name]).values()):
            if isinstance(value, Task) and _on_emq(value):
                registry.register(job_for(value))
                found.append(value.module_path)
    return sorted(set(found))


def _on_emq(task: object) -> bool:
    from emq_django.backends.backend import EmqTaskBackend

    try:
        backend = task.get_backend()  # type: ignore[attr-defined]
    except Exception as exc:  # an alias missing from TASKS: not ours to run
        log.warning("skipped task %r: its backend is not usable here: %s", task, exc)
        return False
    return isinstance(backend, EmqTaskBackend)
