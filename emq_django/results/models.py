"""The job history: one ``JobResult`` row per job (its last attempt), and
``JobStat`` counts per queue and 10-second bucket for the dashboard's charts.

Both are written in batches by ``recorder.DatabaseRecorder`` with raw upserts;
nothing here is saved through the ORM on the hot path.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models


class Status(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"  # the worker process died mid-job; its job manager answered
    RETRIED = "retried"  # reserved: retries (issue #3)
    DEAD_LETTERED = "dead_lettered"  # reserved: dead letters (issue #3)
    RETRYING = "retrying"  # the last attempt failed and the job will be tried again
    CANCELLED = "cancelled"  # cancelled while it ran (its worker process was killed)


# final failures; ``retrying`` is not final
FAILURES = (
    Status.FAILED,
    Status.TIMED_OUT,
    Status.LOST,
    Status.DEAD_LETTERED,
    Status.CANCELLED,
)


class JobResult(models.Model):
    id = models.CharField(max_length=255, primary_key=True, help_text="the client's job id")
    task = models.CharField(max_length=200, blank=True)
    queue = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    args = models.TextField(default="[]", help_text="JSON")
    kwargs = models.TextField(default="{}", help_text="JSON")
    result = models.TextField(blank=True, default="", help_text="JSON of the return value")
    error_type = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=1)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    runtime = models.FloatField(default=0.0, help_text="seconds, last attempt")
    job_manager = models.CharField(max_length=200, blank=True)
    partials = models.PositiveIntegerField(
        default=0, help_text="partial results the last attempt streamed (emq.partial, yield)"
    )

    class Meta:
        verbose_name = "job result"
        ordering = ["-finished_at"]
        # the admin's Retry and Cancel: each its own, not implied by the view permission
        permissions = [
            ("retry_jobresult", "Can retry jobs (send them again)"),
            ("cancel_jobresult", "Can cancel jobs at the broker"),
        ]
        indexes = [
            # the changelist's default order, the date filter and pruning
            models.Index(fields=["-finished_at"], name="emq_result_finished"),
            # each list filter, combined with the order
            models.Index(fields=["status", "-finished_at"], name="emq_result_status"),
            models.Index(fields=["queue", "-finished_at"], name="emq_result_queue"),
            models.Index(fields=["task", "-finished_at"], name="emq_result_task"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.task or '?'} {self.status}"

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def value(self) -> Any:
        """The return value (None for a failure)."""
        return json.loads(self.result) if self.result else None

    def decoded_args(self) -> tuple[list[Any], dict[str, Any]]:
        return json.loads(self.args or "[]"), json.loads(self.kwargs or "{}")


class RetryLink(models.Model):
    """A job sent again from the admin (Retry): the new job and the one it repeats."""

    job_id = models.CharField(max_length=255, primary_key=True, help_text="the new job")
    original_id = models.CharField(max_length=255, db_index=True, help_text="the job retried")
    created_at = models.DateTimeField(help_text="when it was sent again")

    class Meta:
        verbose_name = "retry link"

    def __str__(self) -> str:
        return f"{self.job_id} retries {self.original_id}"


class JobStat(models.Model):
    """Finished jobs per queue and 10-second bucket: the charts and the queue rates."""

    BUCKET_SECONDS = 10

    bucket = models.DateTimeField(help_text="start of the 10-second bucket, UTC")
    queue = models.CharField(max_length=255)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    run_sum = models.FloatField(default=0.0, help_text="seconds, summed over the jobs")
    run_max = models.FloatField(default=0.0)

    class Meta:
        verbose_name = "job statistic"
        constraints = [
            models.UniqueConstraint(fields=["bucket", "queue"], name="emq_stat_bucket_queue")
        ]

    def __str__(self) -> str:
        return f"{self.bucket:%H:%M:%S} {self.queue}: {self.succeeded}+{self.failed}"


class Dashboard(models.Model):
    """No table: puts the live dashboard on the admin index (``DashboardAdmin``)."""

    class Meta:
        managed = False
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()
        # the broker's dead letters: a staff login may look, these may act
        permissions = [
            ("requeue_deadletters", "Can requeue the broker's dead letters"),
            ("purge_deadletters", "Can purge the broker's dead letters (gone for good)"),
            ("pause_queues", "Can pause and resume the broker's queues"),
            ("drain_job_managers", "Can drain job managers and give them jobs again"),
            ("stop_job_managers", "Can stop job managers (they finish their jobs and exit)"),
            ("resize_job_managers", "Can change how many worker processes a job manager runs"),
            ("rate_limit_queues", "Can change the rate limits of the broker's queues"),
        ]
