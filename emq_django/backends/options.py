"""emq's own options for Django Tasks API tasks: guarantee, retries, timeout,
soft_timeout, on_commit.

Each comes from the task (``EmqTask`` fields, set with ``task.using(retries=3)`` or
``@emq_options(retries=3)``; on Django 5.2 also ``@task(retries=3)``), else from the
backend's ``OPTIONS`` in ``TASKS``, else from emq's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

NAMES = ("guarantee", "retries", "timeout", "on_commit", "soft_timeout")


@dataclass(frozen=True, slots=True)
class JobOptions:
    guarantee: bool = False
    retries: int = 0
    timeout: float = 0.0
    on_commit: bool = False
    soft_timeout: float = 0.0  # under timeout: SoftTimeLimitExceeded inside the task

    def merged(self, **overrides: Any) -> JobOptions:
        """These options with every override that is not None."""
        values = {name: getattr(self, name) for name in NAMES}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return JobOptions(**values)


def check_values(where: str, values: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming ``where`` for an unknown option or a bad value."""
    unknown = sorted(set(values) - set(NAMES))
    if unknown:
        raise ValueError(f"{where}: unknown emq option(s) {unknown}; known: {list(NAMES)}")
    for name in ("retries", "timeout", "soft_timeout"):
        value = values.get(name)
        if value is not None and (isinstance(value, bool) or not value >= 0):
            raise ValueError(f"{where}: {name} must be a number >= 0, got {value!r}")
    for name in ("guarantee", "on_commit"):
        value = values.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be True or False, got {value!r}")


def backend_defaults(alias: str, options: dict[str, Any]) -> JobOptions:
    """The defaults from ``TASKS[alias]["OPTIONS"]``; raises ``ImproperlyConfigured``."""
    ours = {k.lower(): v for k, v in options.items()}
    try:
        check_values(f'TASKS["{alias}"]["OPTIONS"]', ours)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    return JobOptions().merged(**ours)
