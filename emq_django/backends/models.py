"""``TaskState``: what the job history (``emq_results.JobResult``) cannot say yet.

JobResult rows are written when a job has finished. A Django Tasks API result also
has the states before that: READY (enqueued, or waiting for a retry) and RUNNING.
The backend writes one row when it enqueues and the worker process updates it
when the job starts; the final state, return value and errors come from JobResult.
"""

from __future__ import annotations

from django.db import models


class TaskState(models.Model):
    READY = "READY"
    RUNNING = "RUNNING"

    id = models.CharField(max_length=255, primary_key=True, help_text="the job id")
    task = models.CharField(max_length=300, help_text="module path of the task function")
    backend = models.CharField(max_length=100, help_text="TASKS alias")
    queue = models.CharField(max_length=255)
    status = models.CharField(max_length=16, default=READY)
    args = models.TextField(default="[]", help_text="JSON")
    kwargs = models.TextField(default="{}", help_text="JSON")
    retries = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0, help_text="attempts started")
    worker = models.CharField(max_length=200, blank=True, help_text="host:pid, last attempt")
    enqueued_at = models.DateTimeField()
    run_after = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "task state"
        indexes = [models.Index(fields=["enqueued_at"], name="emq_taskstate_enqueued")]

    def __str__(self) -> str:
        return f"{self.id} {self.task} {self.status}"
