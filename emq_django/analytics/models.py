"""Metrics per minute, written by ``manage.py emq_analyze`` (latencies in ms).

``minute`` is the UTC minute in which the jobs finished. A batch replaces every
row of the dates it touched, recomputed from all the jobs of those dates.
"""

from __future__ import annotations

from django.db import models


class MinuteMetric(models.Model):
    minute = models.DateTimeField(db_index=True)
    jobs = models.PositiveIntegerField(help_text="jobs that finished in this minute")
    succeeded = models.PositiveIntegerField()
    failed = models.PositiveIntegerField(help_text="failed, timed out or dead-lettered")
    timed_out = models.PositiveIntegerField()
    retried = models.PositiveIntegerField(help_text="jobs that were retried at least once")
    throughput = models.FloatField(help_text="finished jobs per second")
    run_total_ms = models.FloatField(default=0.0)
    wait_p50_ms = models.FloatField(null=True)
    wait_p95_ms = models.FloatField(null=True)
    wait_p99_ms = models.FloatField(null=True)
    run_p50_ms = models.FloatField(null=True)
    run_p95_ms = models.FloatField(null=True)
    run_p99_ms = models.FloatField(null=True)
    e2e_p50_ms = models.FloatField(null=True)
    e2e_p95_ms = models.FloatField(null=True)
    e2e_p99_ms = models.FloatField(null=True)

    class Meta:
        abstract = True

    @property
    def failure_rate(self) -> float:
        return self.failed / self.jobs if self.jobs else 0.0


class QueueMetric(MinuteMetric):
    queue = models.CharField(max_length=255)

    class Meta:
        ordering = ["-minute", "queue"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute"], name="emq_queue_metric_unique")
        ]

    def __str__(self) -> str:
        return f"{self.queue} @ {self.minute:%Y-%m-%d %H:%M}"


class TaskMetric(MinuteMetric):
    queue = models.CharField(max_length=255)
    task = models.CharField(max_length=300, help_text='"" when the client sent no task name')

    class Meta:
        ordering = ["-minute", "queue", "task"]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "task", "minute"], name="emq_task_metric_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.task or '(unnamed)'} @ {self.minute:%Y-%m-%d %H:%M}"


class JobManagerMetric(models.Model):
    jm = models.CharField("job manager", max_length=300)
    minute = models.DateTimeField(db_index=True)
    attempts = models.PositiveIntegerField(help_text="attempts that finished in this minute")
    succeeded = models.PositiveIntegerField()
    failed = models.PositiveIntegerField()
    busy_ms = models.FloatField(help_text="run time of those attempts")
    utilisation = models.FloatField(help_text="mean busy worker processes (busy time / 60 s)")

    class Meta:
        ordering = ["-minute", "jm"]
        constraints = [
            models.UniqueConstraint(fields=["jm", "minute"], name="emq_jm_metric_unique")
        ]

    def __str__(self) -> str:
        return f"{self.jm} @ {self.minute:%Y-%m-%d %H:%M}"


class FailureMetric(models.Model):
    queue = models.CharField(max_length=255)
    task = models.CharField(max_length=300)
    error = models.CharField(max_length=300, help_text='exception type; "" when unknown')
    minute = models.DateTimeField(db_index=True)
    failures = models.PositiveIntegerField()

    class Meta:
        ordering = ["-minute", "queue", "task", "error"]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "task", "error", "minute"], name="emq_failure_metric_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.error or '?'} in {self.queue}/{self.task} @ {self.minute:%Y-%m-%d %H:%M}"


class MetricsDashboard(QueueMetric):
    """No table of its own: the admin's entry for the metrics page (charts)."""

    class Meta:
        proxy = True
        verbose_name = "metrics dashboard"
        verbose_name_plural = "metrics dashboard"
