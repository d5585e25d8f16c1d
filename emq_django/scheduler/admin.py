"""The admin for ``ScheduledJob``: next and last run, an enabled toggle, run now."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from emq_django.exceptions import EmqError
from emq_django.scheduler.models import SOURCE_ADMIN, ScheduledJob

# the fields an admin edit may write; the run bookkeeping belongs to the scheduler
EDITABLE = (
    "name",
    "task",
    "args",
    "kwargs",
    "queue",
    "retries",
    "timeout",
    "guarantee",
    "interval_seconds",
    "cron",
    "timezone",
    "nohaste",
    "enabled",
    "max_runs",
)


@admin.register(ScheduledJob)
class ScheduledJobAdmin(admin.ModelAdmin):
    list_display = (
        "short_name",
        "task",
        "timing_display",
        "queue",
        "enabled",
        "next_run_at",
        "last_run_at",
        "run_count",
    )
    list_editable = ("enabled",)
    list_filter = ("enabled", "queue", "source")
    search_fields = ("name", "task")
    readonly_fields = (
        "next_run_at",
        "last_run_at",
        "run_count",
        "source",
        "created_at",
        "updated_at",
    )
    actions = ("run_now", "enable", "disable")
    fieldsets = (
        (None, {"fields": ("name", "task", "args", "kwargs", "queue", "enabled")}),
        ("When", {"fields": ("interval_seconds", "cron", "timezone", "nohaste", "max_runs")}),
        ("Job headers", {"fields": ("retries", "timeout", "guarantee")}),
        (
            "Runs",
            {
                "fields": (
                    "next_run_at",
                    "last_run_at",
                    "run_count",
                    "source",
                    "created_at",
                    "updated_at",
                )
            },
        ),
    )

    @admin.display(description="name", ordering="name")
    def short_name(self, obj: ScheduledJob) -> str:
        return obj.name[:12] + "…" if len(obj.name) == 40 else obj.name

    @admin.display(description="when")
    def timing_display(self, obj: ScheduledJob) -> str:
        try:
            return obj.timing.describe()
        except ValueError as exc:
            return f"invalid: {exc}"

    def save_model(self, request: HttpRequest, obj: ScheduledJob, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=EDITABLE)  # never write back a stale run count
        else:
            obj.source = SOURCE_ADMIN
            obj.save()

    @admin.action(description="Run the selected schedules now (once, besides their schedule)")
    def run_now(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        from emq_django.client import get_client
        from emq_django.protocol.body import encode_run_body
        from emq_django.protocol.headers import format_headers
        from emq_django.scheduler.keys import split_task_name

        sent = 0
        for job in queryset:
            path, callable_name = split_task_name(job.task)
            body = encode_run_body(path, callable_name, job.args or [], job.kwargs or {})
            headers = format_headers(
                guarantee=job.guarantee, retry_count=job.retries, timeout=job.timeout, task=job.task
            )
            try:
                get_client().send(job.queue, headers, body, confirm=True)
            except EmqError as exc:
                self.message_user(request, f"{job.name}: not sent: {exc}", messages.ERROR)
                continue
            ScheduledJob.objects.filter(pk=job.pk).update(
                last_run_at=timezone.now(), run_count=F("run_count") + 1
            )
            sent += 1
        if sent:
            self.message_user(request, f"Sent {sent} job(s) to the broker.", messages.SUCCESS)

    @admin.action(description="Enable the selected schedules")
    def enable(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        for job in queryset.filter(enabled=False):
            job.enabled = True
            job.save(update_fields=("enabled",))

    @admin.action(description="Disable the selected schedules")
    def disable(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        queryset.update(enabled=False)
