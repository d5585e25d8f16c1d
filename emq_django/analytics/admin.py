"""Admin: the metric rows, and a staff-only metrics page with charts per queue."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from emq_django.analytics import dashboard
from emq_django.analytics.charts import line_chart
from emq_django.analytics.models import (
    FailureMetric,
    JobManagerMetric,
    MetricsDashboard,
    QueueMetric,
    TaskMetric,
)
from emq_django.results.display import round_number

HOURS = (1, 6, 24, 24 * 7)


def rounded(field: str, description: str = "") -> Any:
    """A list column showing ``field`` rounded (1.62, not 1.6166666666666667)."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def show(self: Any, obj: Any) -> str:
        return round_number(getattr(obj, field))

    show.__name__ = f"{field}_rounded"
    return show


class ReadOnly(admin.ModelAdmin):
    date_hierarchy = "minute"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


_LATENCY = ("wait_p95_ms_rounded", "run_p95_ms_rounded", "e2e_p95_ms_rounded", "e2e_p99_ms_rounded")


class MinuteMetricAdmin(ReadOnly):
    throughput_rounded = rounded("throughput", "jobs/s")
    wait_p95_ms_rounded = rounded("wait_p95_ms", "wait p95 (ms)")
    run_p95_ms_rounded = rounded("run_p95_ms", "run p95 (ms)")
    e2e_p95_ms_rounded = rounded("e2e_p95_ms", "end-to-end p95 (ms)")
    e2e_p99_ms_rounded = rounded("e2e_p99_ms", "end-to-end p99 (ms)")


@admin.register(QueueMetric)
class QueueMetricAdmin(MinuteMetricAdmin):
    list_display = (
        "minute",
        "queue",
        "jobs",
        "succeeded",
        "failed",
        "retried",
        "throughput_rounded",
        *_LATENCY,
    )
    list_filter = ("queue",)


@admin.register(TaskMetric)
class TaskMetricAdmin(MinuteMetricAdmin):
    list_display = ("minute", "queue", "task", "jobs", "failed", "timed_out", "retried", *_LATENCY)
    list_filter = ("queue",)
    search_fields = ("task",)


@admin.register(JobManagerMetric)
class JobManagerMetricAdmin(ReadOnly):
    list_display = ("minute", "jm", "attempts", "succeeded", "failed", "busy", "busy_processes")
    busy = rounded("busy_ms", "busy (ms)")
    busy_processes = rounded("utilisation", "mean busy processes")
    list_filter = ("jm",)


@admin.register(FailureMetric)
class FailureMetricAdmin(ReadOnly):
    list_display = ("minute", "queue", "task", "error", "failures")
    list_filter = ("queue", "error")


@admin.register(MetricsDashboard)
class MetricsDashboardAdmin(admin.ModelAdmin):
    """Its change list is the metrics page; any staff user may see it."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            hours = float(request.GET.get("hours", "6"))
        except ValueError:
            hours = 6.0
        hours = min(max(hours, 0.25), 24 * 31)
        window = dashboard.Window.last(hours)
        series = dashboard.queue_series(window)
        charts = [
            ("Throughput (finished jobs/s)", line_chart(series["throughput"], *_w(window))),
            ("p95 end-to-end latency (ms)", line_chart(series["p95"], *_w(window), unit="")),
            ("Failure rate (%)", line_chart(series["failure_rate"], *_w(window), unit="%")),
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Metrics",
            "opts": self.model._meta,
            "window": window,
            "hours": hours,
            "hour_choices": HOURS,
            "charts": charts,
            "has_data": any(series["throughput"].values()),
            "slowest": dashboard.slowest_tasks(window),
            "utilisation": dashboard.utilisation(window),
            "failures": dashboard.failures(window),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "emq_analytics/dashboard.html", context)


def _w(window: dashboard.Window) -> tuple[Any, Any]:
    return window.start, window.chart_end
