"""The job history's admin, and the dashboard as an admin page."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from emq_django.exceptions import EmqError
from emq_django.results import actions, dashboard
from emq_django.results.conf import results_settings
from emq_django.results.models import Dashboard, JobResult

MASK = "•••• (masked: set EMQ_RESULTS_SHOW_ARGS=true to show)"
LIST_DEFERRED = ("args", "kwargs", "result", "error", "traceback")


class DistinctValueFilter(admin.SimpleListFilter):
    """A filter over the distinct values of a column (read from its index)."""

    field = ""
    limit = 200

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = (
            JobResult.objects.order_by(self.field)
            .values_list(self.field, flat=True)
            .distinct()[: self.limit]
        )
        return [(v, v or "(none)") for v in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value is not None else queryset


class QueueFilter(DistinctValueFilter):
    title = "queue"
    parameter_name = "queue"
    field = "queue"


class TaskFilter(DistinctValueFilter):
    title = "task"
    parameter_name = "task"
    field = "task"


class FinishedFilter(admin.SimpleListFilter):
    title = "finished"
    parameter_name = "finished"
    WINDOWS = {
        "5m": ("in the last 5 minutes", dt.timedelta(minutes=5)),
        "1h": ("in the last hour", dt.timedelta(hours=1)),
        "24h": ("in the last 24 hours", dt.timedelta(hours=24)),
        "7d": ("in the last 7 days", dt.timedelta(days=7)),
        "older": ("more than 7 days ago", dt.timedelta(days=7)),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.WINDOWS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        window = self.WINDOWS.get(self.value() or "")
        if window is None:
            return queryset
        since = timezone.now() - window[1]
        if self.value() == "older":
            return queryset.filter(finished_at__lt=since)
        return queryset.filter(finished_at__gte=since)


@admin.register(JobResult)
class JobResultAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "status_badge",
        "attempts",
        "finished_at",
        "runtime_ms",
        "job_manager",
    )
    list_filter = ("status", QueueFilter, TaskFilter, FinishedFilter)
    search_fields = ("id",)
    search_help_text = "job id, or its beginning"
    ordering = ("-finished_at",)
    list_per_page = 50
    show_full_result_count = False  # no second COUNT(*) over the whole table
    date_hierarchy = None
    actions = ("retry_jobs", "cancel_jobs")
    readonly_fields = (
        "id",
        "task",
        "queue",
        "status",
        "shown_args",
        "shown_kwargs",
        "result",
        "error_type",
        "error",
        "shown_traceback",
        "attempts",
        "enqueued_at",
        "started_at",
        "finished_at",
        "runtime",
        "job_manager",
    )
    fields = readonly_fields
    change_list_template = "emq/jobresult_change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobResult]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match and (match.url_name or "").endswith("changelist"):
            qs = qs.defer(*LIST_DEFERRED)
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobResult], search_term: str
    ) -> tuple[QuerySet[JobResult], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # a range on the primary key: an index seek on every backend (LIKE is not)
        return queryset.filter(id__gte=term, id__lt=term + "\U0010ffff"), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: JobResult) -> str:
        return format_html('<span class="emq-status emq-{}">{}</span>', obj.status, obj.status)

    @admin.display(description="run (ms)", ordering="runtime")
    def runtime_ms(self, obj: JobResult) -> str:
        return f"{obj.runtime * 1000:.1f}"

    def _masked(self, value: str) -> str:
        return value if results_settings().show_args else MASK

    @admin.display(description="args")
    def shown_args(self, obj: JobResult) -> str:
        return self._masked(obj.args)

    @admin.display(description="kwargs")
    def shown_kwargs(self, obj: JobResult) -> str:
        return self._masked(obj.kwargs)

    @admin.display(description="traceback")
    def shown_traceback(self, obj: JobResult) -> str:
        return format_html("<pre>{}</pre>", obj.traceback) if obj.traceback else "-"

    @admin.action(description="Retry the selected jobs (send them again)")
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[JobResult]) -> None:
        sent, errors = [], []
        for row in queryset[:1000]:
            try:
                sent.append(f"{row.id} -> {actions.retry(row)}")
            except (EmqError, ValueError, TypeError) as exc:
                errors.append(f"{row.id}: {exc}")
        if sent:
            self.message_user(request, f"Sent again: {', '.join(sent)}", messages.SUCCESS)
        for error in errors:
            self.message_user(request, f"Not retried: {error}", messages.ERROR)

    @admin.action(description="Cancel the selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[JobResult]) -> None:
        ids = list(queryset.values_list("id", flat=True)[:1000])
        try:
            done, reason = actions.cancel(ids)
        except EmqError as exc:
            self.message_user(request, f"Not cancelled: {exc}", messages.ERROR)
            return
        if done:
            self.message_user(request, f"Cancelled: {', '.join(done)}", messages.SUCCESS)
        if reason:
            self.message_user(request, f"Not cancelled: {reason}", messages.WARNING)


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The live dashboard, listed on the admin index; staff only."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name="emq_results_dashboard_changelist"),
            path("data/", view(self.data_view), name="emq_dashboard_data"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        context = {
            **self.admin_site.each_context(request),
            "title": "emq dashboard",
            "monitor_url": dashboard.monitor_url(),
            "poll_ms": dashboard.POLL_MS,
        }
        return TemplateResponse(request, "emq/dashboard.html", context)

    def data_view(self, request: HttpRequest) -> JsonResponse:
        if not self.has_view_permission(request):
            return JsonResponse({"error": "staff only"}, status=403)
        return JsonResponse(dashboard.data())
