"""The registry of ``@emq.task`` functions: the only callables a job manager runs."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from emq_django.exceptions import TaskNotFound

log = logging.getLogger(__name__)


class Task(Protocol):
    """What the registry and its readers need of an ``emq_django.task.Task`` (which
    imports this module: the registry does not import it back)."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def queue(self) -> str: ...

    @property
    def retries(self) -> int: ...

    @property
    def timeout(self) -> float: ...

    @property
    def guarantee(self) -> bool: ...

    def apply_async(self, *args: Any, **kwargs: Any) -> Any: ...


_tasks: dict[str, Task] = {}
# Called by ``autodiscover`` after the imports, with ``imports``: other kinds of
# task (the Django Tasks API's) register theirs here. Added by their app's
# ``ready()``, so that this module imports none of them.
_discoverers: list[Callable[[Iterable[str]], object]] = []


def add_discoverer(discover: Callable[[Iterable[str]], object]) -> None:
    if discover not in _discoverers:
        _discoverers.append(discover)


def register(task: Task) -> None:
    existing = _tasks.get(task.name)
    if existing is not None and existing.fn is not task.fn:
        log.warning("task %s registered twice; the later definition wins", task.name)
    _tasks[task.name] = task


def get(name: str) -> Task:
    """The task registered as ``name``; raises ``TaskNotFound``. Never imports anything."""
    try:
        return _tasks[name]
    except KeyError:
        raise TaskNotFound(
            f"{name!r} is not a registered task (decorate it with @emq.task "
            "and list its module in INSTALLED_APPS or EMQ_IMPORTS)"
        ) from None


def find(name: str) -> Task | None:
    return _tasks.get(name)


def names() -> list[str]:
    return sorted(_tasks)


def autodiscover(imports: Iterable[str] = ()) -> list[str]:
    """Import the ``tasks`` module of every installed app, then ``EMQ_IMPORTS``.

    Returns the registered task names. A module in ``imports`` that fails to import
    raises ``ImportError`` naming it: a job manager must not start half-configured.
    """
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"EMQ_IMPORTS names {module!r}, which cannot be imported: {exc}"
            ) from exc
    for discover in _discoverers:
        discover(imports)
    return names()
