"""The database side of scheduling: store, plan, and claim due ticks exactly once.

Several schedulers may run at once. A due tick belongs to the scheduler whose
compare-and-set UPDATE moves ``next_run_at`` on from the value it read (``WHERE
next_run_at = <due>``): the others update no row. On PostgreSQL the due rows are
first locked with ``SELECT ... FOR UPDATE SKIP LOCKED``, so schedulers take
different rows instead of waiting on each other; on SQLite, which has no row
locks, each claim is its own transaction whose first statement is that UPDATE,
so SQLite's write lock serialises the claims. The jobs are sent, and the broker
has ACKed them, before the claim commits: a tick whose job the broker did not
take is rolled back and fired again later.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Min

from emq_django.exceptions import BrokerUnavailable
from emq_django.scheduler.models import SOURCE_API, ScheduledJob
from emq_django.scheduler.timing import (
    CATCH_UP_ONCE,
    DEFAULT_GRACE,
    Timing,
    first_run,
    on_due,
    tick_times,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
SendJob = Callable[[ScheduledJob, dt.datetime], None]  # raises BrokerUnavailable
LOCK_RETRIES = 20


@dataclass(frozen=True, slots=True)
class Fired:
    name: str
    due: dt.datetime
    runs: int
    missed: int


def _retry_locked(fn: Callable[[], T]) -> T:
    """Run ``fn`` again when SQLite says the database is locked (another scheduler
    wrote between our read and our write)."""
    for attempt in range(LOCK_RETRIES):
        try:
            return fn()
        except (OperationalError, IntegrityError) as exc:
            # IntegrityError: another scheduler created the same name just now
            retry = isinstance(exc, IntegrityError) or "locked" in str(exc)
            if not retry or attempt == LOCK_RETRIES - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")


# ---- storing ------------------------------------------------------------------


def upsert(
    *,
    name: str,
    task: str,
    timing: Timing,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue: str = "default",
    retries: int = 0,
    timeout: float = 0,
    guarantee: bool = False,
    nohaste: bool = False,
    max_runs: int | None = None,
    enabled: bool | None = True,
    source: str = SOURCE_API,
    now: dt.datetime | None = None,
) -> ScheduledJob:
    """Create or update the schedule ``name``. An unchanged timing keeps its next
    run, so that the same SCHEDULE stored by several schedulers, or a schedule
    declared again at every start, neither runs twice nor shifts; a new or
    changed one runs at once (an interval one without ``nohaste``) or at its next
    tick. ``enabled=None``
    enables a new schedule and leaves an existing one as it is (the admin's choice)."""
    values: dict[str, Any] = {
        "task": task,
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "queue": queue,
        "retries": retries,
        "timeout": timeout,
        "guarantee": guarantee,
        "interval_seconds": timing.interval,
        "cron": timing.cron,
        "timezone": timing.timezone,
        "nohaste": nohaste,
        "max_runs": max_runs,
        "source": source,
    }
    if enabled is not None:
        values["enabled"] = enabled

    def attempt() -> ScheduledJob:
        with transaction.atomic():
            job = ScheduledJob.objects.select_for_update().filter(name=name).first()
            if job is None:
                job = ScheduledJob(name=name)
            replan = job.pk is None or not job.enabled or job.timing_key != timing.key
            for field, value in values.items():
                setattr(job, field, value)
            if replan and job.enabled:
                job.next_run_at = first_run(timing, job.not_before(now or _now()), nohaste)
                job.timing_key = timing.key
            job.save()
            return job

    return _retry_locked(attempt)


def remove(name: str) -> int:
    """Delete the schedule ``name``; returns how many rows went (0 or 1)."""
    return _retry_locked(lambda: ScheduledJob.objects.filter(name=name).delete()[0])


# ---- planning -------------------------------------------------------------------


def reconcile(now: dt.datetime) -> int:
    """Plan the schedules whose timing changed behind ``save()`` (``QuerySet.update``,
    raw SQL) or that have no next run; returns how many were planned."""
    planned = 0
    rows = ScheduledJob.objects.filter(enabled=True).values_list(
        "pk",
        "name",
        "interval_seconds",
        "cron",
        "timezone",
        "timing_key",
        "next_run_at",
        "nohaste",
        "start_at",
    )
    for pk, name, interval, cron, tz, key, next_run, nohaste, start in rows:
        try:
            timing = Timing(
                interval=interval, cron="" if interval is not None else cron, timezone=tz
            )
        except ValueError as exc:
            _disable(pk, name, exc)
            continue
        if key == timing.key and next_run is not None:
            continue
        since = max(now, start) if start is not None else now
        new_next = (
            first_run(timing, since, nohaste) if next_run is None else timing.next_after(since)
        )
        planned += ScheduledJob.objects.filter(pk=pk, timing_key=key, next_run_at=next_run).update(
            next_run_at=new_next, timing_key=timing.key
        )
    return planned


def _disable(pk: int, name: str, exc: Exception) -> None:
    log.error("schedule %s has an invalid timing (%s); disabling it", name, exc)
    ScheduledJob.objects.filter(pk=pk).update(enabled=False)


def soonest() -> dt.datetime | None:
    """The earliest next run of an enabled schedule."""
    value: dt.datetime | None = ScheduledJob.objects.filter(enabled=True).aggregate(
        first=Min("next_run_at")
    )["first"]
    return value


# ---- firing ---------------------------------------------------------------------


def fire_due(
    now: dt.datetime,
    send: SendJob,
    policy: str = CATCH_UP_ONCE,
    grace: dt.timedelta = DEFAULT_GRACE,
    limit: int = 100,
) -> list[Fired]:
    """Claim and send the ticks due at ``now``. Stops at the first schedule whose
    job the broker does not take (it stays due). Returns what this scheduler fired."""
    due = ScheduledJob.objects.filter(enabled=True, next_run_at__lte=now).order_by("next_run_at")
    fired: list[Fired] = []
    if connection.features.has_select_for_update_skip_locked:
        with transaction.atomic():
            for job in due.select_for_update(skip_locked=True)[:limit]:
                try:
                    with transaction.atomic():
                        result = _fire_one(job, now, send, policy, grace)
                except BrokerUnavailable as exc:
                    log.warning("%s; the due schedules wait for it", exc)
                    break
                if result is not None:
                    fired.append(result)
        return fired
    for job in list(due[:limit]):
        try:
            with transaction.atomic():
                result = _fire_one(job, now, send, policy, grace)
        except BrokerUnavailable as exc:
            log.warning("%s; the due schedules wait for it", exc)
            break
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            continue  # another scheduler holds the write lock: it is firing this tick
        if result is not None:
            fired.append(result)
    return fired


def _fire_one(
    job: ScheduledJob, now: dt.datetime, send: SendJob, policy: str, grace: dt.timedelta
) -> Fired | None:
    assert job.next_run_at is not None
    try:
        timing = job.timing
    except ValueError as exc:
        _disable(job.pk, job.name, exc)
        return None
    if job.timing_key != timing.key:
        return None  # changed behind save(): reconcile() plans it first
    plan = on_due(timing, job.next_run_at, now, policy, grace)
    # each run stands for a tick of its own: its job id comes from it (keys.tick_id)
    ticks, enabled = _limit(job, tick_times(timing, job.next_run_at, plan.runs), plan.next_run)
    runs = len(ticks)
    claimed = ScheduledJob.objects.filter(
        pk=job.pk, enabled=True, next_run_at=job.next_run_at, timing_key=job.timing_key
    ).update(
        next_run_at=plan.next_run,
        last_run_at=now if runs else F("last_run_at"),
        run_count=F("run_count") + runs,
        enabled=enabled,
    )
    if not claimed:
        return None  # another scheduler fired this tick
    for due in ticks:
        send(job, due)
    if not enabled:
        log.info("schedule %s: %s; disabled", job.name, _why_over(job, now))
    if plan.missed:
        log.info(
            "schedule %s: %d ticks passed since %s while no scheduler ran; %d run(s) "
            "(catch-up policy %r)",
            job.name,
            plan.missed + plan.runs,
            job.next_run_at.isoformat(),
            runs,
            policy,
        )
    return Fired(job.name, job.next_run_at, runs, plan.missed)


def _limit(
    job: ScheduledJob, ticks: list[dt.datetime], next_run: dt.datetime
) -> tuple[list[dt.datetime], bool]:
    """The ticks to send and whether the schedule stays enabled after them: none
    after its expiry, one for a one-off, at most ``max_runs`` in all."""
    enabled = True
    if job.expires_at is not None:
        ticks = [t for t in ticks if t <= job.expires_at]
        enabled = next_run <= job.expires_at
    if job.one_off:
        ticks = ticks[:1]
        enabled = enabled and not ticks
    if job.max_runs is not None:
        ticks = ticks[: max(0, job.max_runs - job.run_count)]
        enabled = enabled and job.run_count + len(ticks) < job.max_runs
    return ticks, enabled


def _why_over(job: ScheduledJob, now: dt.datetime) -> str:
    if job.expires_at is not None and job.expires_at < now:
        return f"expired at {job.expires_at.isoformat()}"
    if job.one_off:
        return "a one-off, it has run"
    return f"it has run {job.max_runs} times (max_runs)"


def _now() -> dt.datetime:
    from django.utils import timezone

    return timezone.now()
