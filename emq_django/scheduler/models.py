"""``ScheduledJob``: one schedule, its timing and its run bookkeeping."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from emq_django.scheduler.cron import CronError, parse_cron, zone
from emq_django.scheduler.keys import split_task_name, task_key
from emq_django.scheduler.timing import Timing, first_run

SOURCE_API = "api"
SOURCE_CODE = "code"
SOURCE_WIRE = "wire"
SOURCE_ADMIN = "admin"


def validate_cron(value: str) -> None:
    if value:
        try:
            parse_cron(value)
        except CronError as exc:
            raise ValidationError(str(exc), code="invalid_cron") from None


def validate_timezone(value: str) -> None:
    try:
        zone(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid_timezone") from None


def validate_task_name(value: str) -> None:
    try:
        split_task_name(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid_task") from None


class ScheduledJob(models.Model):
    name = models.CharField(
        max_length=200,
        unique=True,
        blank=True,
        help_text="Blank: the key EventMQ derives from the task and its arguments.",
    )
    task = models.CharField(
        max_length=255, validators=[validate_task_name], help_text="pkg.module.function"
    )
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=255, default="default")
    retries = models.PositiveIntegerField(default=0)
    timeout = models.FloatField(default=0, validators=[MinValueValidator(0)])
    guarantee = models.BooleanField(default=False)
    interval_seconds = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.001)]
    )
    cron = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_cron],
        help_text="minute hour day-of-month month day-of-week, e.g. */5 * * * *",
    )
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    nohaste = models.BooleanField(
        default=False,
        help_text="Interval: first run after one interval, not at once (a cron schedule "
        "always waits for its next match).",
    )
    enabled = models.BooleanField(default=True)
    max_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Disable after this many runs (EventMQ's run_count)."
    )
    # as django-celery-beat's start_time, expires and one_off
    start_at = models.DateTimeField(
        "start time", null=True, blank=True, help_text="No run before this time (blank: now)."
    )
    expires_at = models.DateTimeField(
        "expires", null=True, blank=True, help_text="No run after this time; then disabled."
    )
    one_off = models.BooleanField(
        "one-off", default=False, help_text="Run once, then disable the schedule."
    )
    last_run_at = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    run_count = models.PositiveIntegerField(default=0)
    # the timing next_run_at was planned for; a change makes the scheduler plan afresh
    timing_key = models.CharField(max_length=300, blank=True, editable=False)
    source = models.CharField(max_length=10, default=SOURCE_API, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "scheduled job"
        # the admin's "run now" sends a job: not implied by the view permission
        permissions = [("run_scheduledjob", "Can run a schedule now")]
        constraints = [
            models.CheckConstraint(
                condition=(Q(interval_seconds__isnull=False) & Q(cron=""))
                | (Q(interval_seconds__isnull=True) & ~Q(cron="")),
                name="emq_scheduledjob_interval_xor_cron",
                violation_error_message="Give an interval or a cron expression, not both.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name[:12] if len(self.name) == 40 else self.name}: {self.task}"

    @property
    def timing(self) -> Timing:
        """Raises ``ValueError`` (``CronError``) for an invalid timing."""
        interval = self.interval_seconds
        return Timing(
            interval=interval, cron=self.cron if interval is None else "", timezone=self.timezone
        )

    def clean(self) -> None:
        if self.interval_seconds is None and not self.cron:
            raise ValidationError("Give an interval in seconds or a cron expression.")
        if self.interval_seconds is not None and self.cron:
            raise ValidationError("Give an interval or a cron expression, not both.")
        if self.start_at and self.expires_at and self.expires_at <= self.start_at:
            raise ValidationError(
                {"expires_at": "The schedule would expire before it starts: make it later."}
            )
        if not self.name and self.task:
            self.name = self.default_name()

    def default_name(self) -> str:
        return task_key(self.task, self.args or [], self.kwargs or {})

    def plan(self, now: dt.datetime | None = None) -> None:
        """Set ``next_run_at`` for a new or changed timing: a new schedule runs at
        once (after one interval with ``nohaste``), a cron one at its next match; a
        changed one at its next tick."""
        now = self.not_before(now or timezone.now())
        timing = self.timing
        if self.next_run_at is None:
            self.next_run_at = first_run(timing, now, self.nohaste)
        else:
            self.next_run_at = timing.next_after(now)
        self.timing_key = timing.key

    def not_before(self, now: dt.datetime) -> dt.datetime:
        """When planning may start: now, or the start time when that is later."""
        return max(now, self.start_at) if self.start_at is not None else now

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.name:
            self.name = self.default_name()
        if self.enabled and (self.next_run_at is None or self.timing_key != self.timing.key):
            self.plan()
            fields = kwargs.get("update_fields")
            if fields is not None:
                kwargs["update_fields"] = {*fields, "next_run_at", "timing_key"}
        super().save(*args, **kwargs)


class ScheduleRun(models.Model):
    """One job a schedule sent (by the scheduler, or by the admin's run now).

    The job's outcome is its ``emq_results.JobResult`` row, found by ``job_id``; only
    the newest ``KEEP`` runs of each schedule are kept.
    """

    KEEP = 50

    schedule = models.ForeignKey(ScheduledJob, on_delete=models.CASCADE, related_name="runs")
    job_id = models.CharField(max_length=255, db_index=True)
    sent_at = models.DateTimeField()
    manual = models.BooleanField(default=False, help_text="sent by the admin's run now")
    due_at = models.DateTimeField(
        null=True, blank=True, help_text="the tick it was sent for (its job id comes from it)"
    )

    class Meta:
        ordering = ["-sent_at"]
        verbose_name = "schedule run"
        indexes = [models.Index(fields=["schedule", "-sent_at"], name="emq_schedrun_recent")]

    def __str__(self) -> str:
        return f"{self.job_id} at {self.sent_at:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def note(
        cls, schedule_id: int, job_id: str, manual: bool = False, due: dt.datetime | None = None
    ) -> None:
        """Remember a run (``due``: its tick; none for run now); every ``KEEP``-th run
        also drops the schedule's older ones."""
        run = cls.objects.create(
            schedule_id=schedule_id,
            job_id=job_id,
            sent_at=timezone.now(),
            manual=manual,
            due_at=due,
        )
        if run.pk % cls.KEEP == 0:
            old = cls.objects.filter(schedule_id=schedule_id).order_by("-sent_at")[cls.KEEP :]
            cls.objects.filter(pk__in=list(old.values_list("pk", flat=True))).delete()
