"""The job history's admin: a list that fits the page, and a job page with its
attempts, durations, links and Retry / Cancel buttons. The dashboard and dead
letters pages are in ``admin_pages``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from emq_django.exceptions import EmqError
from emq_django.results import actions, job_page, previews, workflow_page
from emq_django.results.admin_pages import DashboardAdmin  # noqa: F401  (registers it)
from emq_django.results.display import human_duration, short_time, status_label
from emq_django.results.models import JobResult
from emq_django.results.permissions import CANCEL_JOBS, RETRY_JOBS, allowed, refused

LIST_DEFERRED = ("args", "kwargs", "result", "error", "traceback")
FAILED_FINALLY = ("failed", "timed_out", "lost")
# every status a row can have (issue 12 adds retrying and cancelled), and the two
# that are not a status of their own: "retried" and "dead lettered"
STATUS_CHOICES = (
    ("succeeded", "succeeded"),
    ("failed", "failed"),
    ("timed_out", "timed out"),
    ("lost", "lost (worker died)"),
    ("retrying", "retrying (waits for its next attempt)"),
    ("cancelled", "cancelled"),
    ("retried", "retried (more than one attempt)"),
    ("dead_lettered", "dead lettered"),
)


class StatusFilter(admin.SimpleListFilter):
    """By status. "Retried" is any job that took more than one attempt; "dead
    lettered" is a failure after retries (the broker buries a job that used up its
    retries), as the rows store no retry count of their own."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> tuple[tuple[str, str], ...]:
        return STATUS_CHOICES

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value == "retried":
            return queryset.filter(Q(attempts__gt=1) | Q(status="retried"))
        if value == "dead_lettered":
            return queryset.filter(
                Q(status="dead_lettered") | Q(status__in=FAILED_FINALLY, attempts__gt=1)
            )
        return queryset.filter(status=value)


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


def job_link(job_id: str) -> SafeString:
    url = reverse("admin:emq_results_jobresult_change", args=[quote(job_id)])
    return format_html('<a href="{}">{}</a>', url, job_id)


def status_badge(status: str) -> SafeString:
    return format_html('<span class="emq-status emq-{}">{}</span>', status, status_label(status))


@admin.register(JobResult)
class JobResultAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "status_badge",
        "attempts",
        "finished",
        "run_time",
        "job_manager",
    )
    list_display_links = ("id",)
    list_filter = (StatusFilter, QueueFilter, TaskFilter, FinishedFilter)
    search_fields = ("id",)
    search_help_text = "job id, or its beginning"
    ordering = ("-finished_at",)
    list_per_page = 50
    show_full_result_count = False  # no second COUNT(*) over the whole table
    actions = ("retry_jobs", "cancel_jobs")
    change_list_template = "emq/jobresult_change_list.html"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # "Jobs", as the emq section names the list, not "Select job result to view"
        return super().changelist_view(request, {"title": "Jobs", **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobResult]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        if match and (match.url_name or "").endswith("changelist"):
            qs = previews.annotate(qs.defer(*LIST_DEFERRED))
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

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return allowed(request, RETRY_JOBS)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return allowed(request, CANCEL_JOBS)

    # ---- the list's columns ----------------------------------------------------------

    @admin.display(description="task", ordering="task")
    def task_name(self, obj: JobResult) -> str:
        short = obj.task.rsplit(".", 2)[-2:] if obj.task else ["-"]
        # the previews on a second line of the task's cell: the list keeps its width
        return format_html(
            '<span title="{}">{}</span><br><span class="emq-previews">{} → {}</span>',
            obj.task,
            ".".join(short),
            previews.arguments(obj),
            previews.result(obj),
        )

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: JobResult) -> str:
        return status_badge(obj.status)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: JobResult) -> str:
        return format_html(
            '<span title="{}">{}</span>', obj.finished_at.isoformat(), short_time(obj.finished_at)
        )

    @admin.display(description="run", ordering="runtime")
    def run_time(self, obj: JobResult) -> str:
        return human_duration(obj.runtime)

    # ---- the job page -----------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/retry/", view(self.retry_view), name="emq_job_retry"),
            path("<path:object_id>/cancel/", view(self.cancel_view), name="emq_job_cancel"),
            path("workflow/<str:workflow_id>/", view(self.workflow_view), name="emq_workflow"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            **job_page.context(unquote(object_id)),
        }
        context["can_retry"] = self.has_retry_permission(request)
        context["can_cancel"] = context["can_cancel"] and self.has_cancel_permission(request)
        return job_page.render(request, context)

    def workflow_view(self, request: HttpRequest, workflow_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        page = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            **workflow_page.context(workflow_id),
        }
        return workflow_page.render(request, page)

    def _job_url(self, job_id: str) -> str:
        return reverse("admin:emq_results_jobresult_change", args=[quote(job_id)])

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._retry)(request, unquote(object_id))

    def _retry(self, request: HttpRequest, job_id: str) -> HttpResponse:
        if not self.has_retry_permission(request):
            return refused("retry a job", RETRY_JOBS)
        row = JobResult.objects.filter(pk=job_id).first()
        if row is None:
            self.message_user(request, f"Job {job_id} is not in the history.", messages.ERROR)
            return HttpResponseRedirect(self._job_url(job_id))
        try:
            new_id = actions.retry(row)
        except (EmqError, ValueError, TypeError) as exc:
            self.message_user(request, f"Not retried: {exc}", messages.ERROR)
            return HttpResponseRedirect(self._job_url(job_id))
        self.message_user(
            request, format_html("Sent again as {}.", job_link(new_id)), messages.SUCCESS
        )
        return HttpResponseRedirect(self._job_url(new_id))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return require_POST(self._cancel)(request, unquote(object_id))

    def _cancel(self, request: HttpRequest, job_id: str) -> HttpResponse:
        if not self.has_cancel_permission(request):
            return refused("cancel a job", CANCEL_JOBS)
        self._report_cancel(request, [job_id])
        return HttpResponseRedirect(self._job_url(job_id))

    # ---- the list's actions -------------------------------------------------------

    @admin.action(description="Retry the selected jobs (send them again)", permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[JobResult]) -> None:
        sent: list[tuple[str, str]] = []
        errors = []
        for row in queryset[:1000]:
            try:
                sent.append((row.id, actions.retry(row)))
            except (EmqError, ValueError, TypeError) as exc:
                errors.append(f"{row.id}: {exc}")
        if sent:
            links = format_html_join(
                ", ", "{} &rarr; {}", ((job_link(old), job_link(new)) for old, new in sent)
            )
            self.message_user(request, format_html("Sent again: {}", links), messages.SUCCESS)
        for error in errors:
            self.message_user(request, f"Not retried: {error}", messages.ERROR)

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[JobResult]) -> None:
        self._report_cancel(request, list(queryset.values_list("id", flat=True)[:1000]))

    def _report_cancel(self, request: HttpRequest, ids: list[str]) -> None:
        try:
            states = actions.cancel(ids)
        except (EmqError, ValueError) as exc:
            self.message_user(request, f"Not cancelled: {exc}", messages.ERROR)
            return
        if states["cancelled"]:
            links = format_html_join(", ", "{}", ((job_link(i),) for i in states["cancelled"]))
            self.message_user(request, format_html("Cancelled: {}", links), messages.SUCCESS)
        if states["stopping"]:
            links = format_html_join(", ", "{}", ((job_link(i),) for i in states["stopping"]))
            self.message_user(
                request,
                format_html("Running, so its worker process is being stopped: {}", links),
                messages.SUCCESS,
            )
        if states["running"]:
            self.message_user(
                request,
                "Running on a job manager that cannot stop it; it will not be retried: "
                + ", ".join(states["running"]),
                messages.WARNING,
            )
        for job_id in states["unknown"]:
            self.message_user(
                request, "Not cancelled: " + actions.why_not_cancelled(job_id), messages.WARNING
            )
