"""``emq.schedule``, ``emq.unschedule`` and ``@emq.periodic``.

They write the ``ScheduledJob`` rows directly (this process shares the
scheduler's database); ``manage.py emq_scheduler`` sees a change within its poll
interval. EventMQ clients reach the same rows through the broker's SCHEDULE.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from emq_django.protocol.limits import MAX_TIMEOUT, check_count, check_seconds
from emq_django.scheduler.keys import split_task_name, task_key
from emq_django.scheduler.timing import Timing

if TYPE_CHECKING:
    from emq_django.scheduler.models import ScheduledJob
    from emq_django.task import Task

log = logging.getLogger(__name__)

Every = float | int | dt.timedelta


def _timing(every: Every | None, cron: str | None, timezone: str | None) -> Timing:
    """Raises ``ValueError`` (``CronError``) for a bad or ambiguous timing."""
    from django.utils import timezone as tz

    interval = every.total_seconds() if isinstance(every, dt.timedelta) else every
    zone = timezone or tz.get_default_timezone_name()
    return Timing(
        interval=None if interval is None else float(interval), cron=cron or "", timezone=zone
    )


def _task_name(task: Task[Any, Any] | str) -> str:
    name = task if isinstance(task, str) else task.name
    split_task_name(name)  # raises ValueError for a name without a module
    return name


def schedule(
    task: Task[Any, Any] | str,
    every: Every | None = None,
    cron: str | None = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    nohaste: bool = False,
    name: str | None = None,
    timezone: str | None = None,
    retries: int | None = None,
    timeout: float | None = None,
    guarantee: bool | None = None,
    max_runs: int | None = None,
) -> ScheduledJob:
    """Run ``task`` every ``every`` seconds (or timedelta) or at the times of the
    ``cron`` expression (in ``timezone``, default ``TIME_ZONE``). An interval
    schedule runs at once, or with ``nohaste`` first after one interval; a cron
    schedule first runs when its expression next matches. The
    name defaults to EventMQ's key for the call, so scheduling the same call
    again updates it. Queue, retries, timeout and guarantee default to the task's.
    Raises ``ValueError`` for a bad timing (``CronError`` for a bad expression)
    and ``TypeError`` for arguments JSON cannot carry."""
    from emq_django.scheduler.models import SOURCE_API

    return _store(
        task,
        every,
        cron,
        args=args,
        kwargs=kwargs,
        queue=queue,
        nohaste=nohaste,
        name=name,
        timezone=timezone,
        retries=retries,
        timeout=timeout,
        guarantee=guarantee,
        max_runs=max_runs,
        source=SOURCE_API,
    )


def _store(
    task: Task[Any, Any] | str,
    every: Every | None,
    cron: str | None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    nohaste: bool = False,
    name: str | None = None,
    timezone: str | None = None,
    retries: int | None = None,
    timeout: float | None = None,
    guarantee: bool | None = None,
    max_runs: int | None = None,
    source: str,
    enabled: bool | None = True,
) -> ScheduledJob:
    from emq_django.protocol.body import encode_run_body
    from emq_django.scheduler import store

    timing = _timing(every, cron, timezone)
    task_name = _task_name(task)
    path, callable_name = split_task_name(task_name)
    encode_run_body(path, callable_name, args, kwargs)  # JSON check, before storing
    options = _task_options(task)
    retries = options.get("retries", 0) if retries is None else retries
    timeout = options.get("timeout", 0) if timeout is None else timeout
    check_count("retries", retries)  # refused now, not at every run
    check_seconds("timeout", timeout, MAX_TIMEOUT)
    return store.upsert(
        name=name or task_key(task_name, list(args), dict(kwargs or {})),
        task=task_name,
        timing=timing,
        args=args,
        kwargs=kwargs,
        queue=queue or options.get("queue", "default"),
        retries=retries,
        timeout=timeout,
        guarantee=options.get("guarantee", False) if guarantee is None else guarantee,
        nohaste=nohaste,
        max_runs=max_runs,
        source=source,
        enabled=enabled,
    )


def unschedule(
    task: Task[Any, Any] | str | None = None,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> bool:
    """Remove the schedule of this call (or the one called ``name``); True if one went."""
    from emq_django.scheduler import store

    if name is None:
        if task is None:
            raise TypeError("unschedule() needs a task (with its args and kwargs) or a name")
        name = task_key(_task_name(task), list(args), dict(kwargs or {}))
    return store.remove(name) > 0


def _task_options(task: Task[Any, Any] | str) -> dict[str, Any]:
    from emq_django import registry

    found: registry.Task | None = registry.find(task) if isinstance(task, str) else task
    if found is None:
        return {}
    return {
        "queue": found.queue,
        "retries": found.retries,
        "timeout": found.timeout,
        "guarantee": found.guarantee,
    }


# ---- @emq.periodic ------------------------------------------------------------


@dataclass(frozen=True)
class Periodic:
    task: Task[Any, Any]
    every: Every | None = None
    cron: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


_declared: dict[str, Periodic] = {}  # task name -> declaration


def periodic(
    every: Every | None = None,
    cron: str | None = None,
    **options: Any,
) -> Callable[[Any], Any]:
    """Declare a schedule in code, stored when ``emq_scheduler`` starts::

        @emq.periodic(every=60)          # or cron="0 3 * * *", timezone="Europe/Berlin"
        @emq.task
        def cleanup(): ...

    Takes ``schedule()``'s keyword options. A plain function is made an
    ``@emq.task`` first. Raises ``ValueError`` for a bad timing, at import."""
    _timing(every, cron, options.get("timezone") or "UTC")  # fail at import, not at start

    def wrap(fn: Any) -> Any:
        from emq_django.task import Task, task

        t = fn if isinstance(fn, Task) else task(fn)
        _declared[t.name] = Periodic(t, every, cron, dict(options))
        return t

    return wrap


def declared() -> list[Periodic]:
    return list(_declared.values())


def sync_periodic() -> tuple[int, int]:
    """Store every ``@emq.periodic`` schedule and delete the code-declared ones no
    longer declared; returns (stored, removed). An unchanged one keeps its next run,
    and a stored one keeps its ``enabled``: the code declares a schedule, the admin
    decides whether it runs."""
    from emq_django.scheduler.models import SOURCE_CODE, ScheduledJob

    names = []
    for p in _declared.values():
        stored = _store(p.task, p.every, p.cron, **p.options, source=SOURCE_CODE, enabled=None)
        names.append(stored.name)
    removed, _ = ScheduledJob.objects.filter(source=SOURCE_CODE).exclude(name__in=names).delete()
    if removed:
        log.info("removed %d schedules no longer declared with @emq.periodic", removed)
    return len(names), removed
