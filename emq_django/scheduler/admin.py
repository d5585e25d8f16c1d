"""The admin for ``ScheduledJob``: next and last run, an enabled toggle, run now."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from emq_django.exceptions import EmqError
from emq_django.results.display import short_time, status_label
from emq_django.results.permissions import RUN_SCHEDULES, allowed, refused
from emq_django.scheduler.models import SOURCE_ADMIN, ScheduledJob, ScheduleRun

RECENT_RUNS = 20

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
    "start_at",
    "expires_at",
    "one_off",
)


class ScheduleForm(forms.ModelForm):
    """The task is a choice among the registered ones (as django-celery-beat's),
    plus the schedule's own when this process does not know it."""

    task = forms.ChoiceField(help_text="a function registered with @emq.task")

    class Meta:
        model = ScheduledJob
        fields = EDITABLE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from emq_django.registry import names
        from emq_django.results.actions import autodiscover_once

        autodiscover_once()
        choices = [(name, name) for name in names()]
        current = self.instance.task if self.instance.pk else ""
        if current and current not in names():
            choices.insert(0, (current, f"{current} (not registered in this web process)"))
        task_field = self.fields["task"]
        assert isinstance(task_field, forms.ChoiceField)
        task_field.choices = [("", "---------"), *choices]
        if not names():
            self.fields["task"].help_text = (
                "No task is registered in this web process: define them with @emq.task in "
                "an installed app's tasks.py, or list their modules in EMQ_IMPORTS."
            )


@admin.register(ScheduledJob)
class ScheduledJobAdmin(admin.ModelAdmin):
    list_display = (
        "short_name",
        "task",
        "timing_display",
        "queue",
        "enabled",
        "next_run_short",
        "last_run_short",
        "run_count",
    )
    list_editable = ("enabled",)
    form = ScheduleForm
    list_filter = ("enabled", "queue", "source")
    search_fields = ("name", "task")
    change_form_template = "emq/scheduledjob_change_form.html"
    change_list_template = "emq/scheduledjob_change_list.html"
    readonly_fields = (
        "next_run",
        "last_run",
        "recent_runs",
        "run_count",
        "source",
        "created",
        "updated",
    )
    actions = ("run_now", "enable", "disable")
    fieldsets = (
        (None, {"fields": ("name", "task", "args", "kwargs", "queue", "enabled")}),
        (
            "When",
            {
                "fields": (
                    "interval_seconds",
                    "cron",
                    "timezone",
                    "nohaste",
                    "start_at",
                    "expires_at",
                    "one_off",
                    "max_runs",
                )
            },
        ),
        ("Job headers", {"fields": ("retries", "timeout", "guarantee")}),
        (
            "Runs",
            {
                "fields": (
                    "next_run",
                    "last_run",
                    "recent_runs",
                    "run_count",
                    "source",
                    "created",
                    "updated",
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
        if change and "start_at" in form.changed_data and obj.enabled:
            obj.next_run_at = None  # planned afresh from the new start time
            obj.save(update_fields=(*EDITABLE, "next_run_at"))
        elif change:
            obj.save(update_fields=EDITABLE)  # never write back a stale run count
        else:
            obj.source = SOURCE_ADMIN
            obj.save()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # "Schedules", as the emq section names them, not "Select scheduled job to change"
        return super().changelist_view(request, {"title": "Schedules", **(extra_context or {})})

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        title = "Schedule" if object_id else "New schedule"
        context = {"title": title, "can_run": self.has_run_permission(request)}
        return super().changeform_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: ScheduledJob) -> str:
        return _to_second(obj.next_run_at)

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: ScheduledJob) -> str:
        return _to_second(obj.last_run_at)

    @admin.display(description="next run", ordering="next_run_at")
    def next_run_short(self, obj: ScheduledJob) -> str:
        return _short(obj.next_run_at)

    @admin.display(description="last run", ordering="last_run_at")
    def last_run_short(self, obj: ScheduledJob) -> str:
        return _short(obj.last_run_at)

    @admin.display(description="created at")
    def created(self, obj: ScheduledJob) -> str:
        return _to_second(obj.created_at)

    @admin.display(description="updated at")
    def updated(self, obj: ScheduledJob) -> str:
        return _to_second(obj.updated_at)

    @admin.display(description=f"last {RECENT_RUNS} runs")
    def recent_runs(self, obj: ScheduledJob) -> str:
        if obj.pk is None:
            return "-"
        runs = list(obj.runs.all()[:RECENT_RUNS])
        if not runs:
            return "none yet"
        outcome = _outcomes([r.job_id for r in runs])
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
            (
                (
                    _to_second(r.sent_at),
                    reverse("admin:emq_results_jobresult_change", args=[r.job_id]),
                    r.job_id,
                    _badge(outcome.get(r.job_id, ("sent", ""))[0]),
                    ("run now" if r.manual else "") + outcome.get(r.job_id, ("", ""))[1],
                )
                for r in runs
            ),
        )
        return format_html(
            '<table class="emq-table" id="emq-schedule-runs"><thead><tr><th>sent at</th>'
            "<th>job</th><th>outcome</th><th></th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # ---- run now ----------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(require_POST(self.run_now_view))
        return [path("<int:pk>/run-now/", view, name="emq_schedule_run_now"), *super().get_urls()]

    def has_run_permission(self, request: HttpRequest) -> bool:
        return allowed(request, RUN_SCHEDULES)

    def run_now_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not self.has_run_permission(request):
            return refused("run a schedule now", RUN_SCHEDULES)
        job = get_object_or_404(ScheduledJob, pk=pk)
        try:
            job_id = send_now(job)
        except EmqError as exc:
            self.message_user(request, f"{job.name}: not sent: {exc}", messages.ERROR)
        else:
            url = reverse("admin:emq_results_jobresult_change", args=[job_id])
            self.message_user(
                request, format_html('Sent job <a href="{}">{}</a>.', url, job_id), messages.SUCCESS
            )
        return HttpResponseRedirect(reverse("admin:emq_scheduler_scheduledjob_change", args=[pk]))

    @admin.action(
        description="Run the selected schedules now (once, besides their schedule)",
        permissions=["run"],
    )
    def run_now(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        sent = 0
        for job in queryset:
            try:
                send_now(job)
            except EmqError as exc:
                self.message_user(request, f"{job.name}: not sent: {exc}", messages.ERROR)
                continue
            sent += 1
        if sent:
            self.message_user(request, f"Sent {sent} job(s) to the broker.", messages.SUCCESS)

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        for job in queryset.filter(enabled=False):
            job.enabled = True
            job.save(update_fields=("enabled",))

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[ScheduledJob]) -> None:
        queryset.update(enabled=False)


def send_now(job: ScheduledJob) -> str:
    """Send the schedule's job once, now; returns its id. Raises ``EmqError``."""
    from emq_django.client import get_client
    from emq_django.protocol.body import encode_run_body
    from emq_django.protocol.headers import format_headers
    from emq_django.scheduler.keys import split_task_name

    path_, callable_name = split_task_name(job.task)
    body = encode_run_body(path_, callable_name, job.args or [], job.kwargs or {})
    headers = format_headers(
        guarantee=job.guarantee, retry_count=job.retries, timeout=job.timeout, task=job.task
    )
    job_id: str = get_client().send(job.queue, headers, body, confirm=True)
    ScheduledJob.objects.filter(pk=job.pk).update(
        last_run_at=timezone.now(), run_count=F("run_count") + 1
    )
    ScheduleRun.note(job.pk, job_id, manual=True)
    return job_id


def _to_second(value: Any) -> str:
    if value is None:
        return "-"
    return f"{timezone.localtime(value):%Y-%m-%d %H:%M:%S}"


def _short(value: Any) -> str:
    """For the list: to the second, the date only when not today (full in the title)."""
    if value is None:
        return "-"
    return format_html('<span title="{}">{}</span>', _to_second(value), short_time(value))


def _badge(status: str) -> str:
    return format_html('<span class="emq-status emq-{}">{}</span>', status, status_label(status))


def _outcomes(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (status, "run 1.2 ms") from the job history, when it is installed."""
    from django.apps import apps

    if not apps.is_installed("emq_django.results"):
        return {}
    from emq_django.results.display import human_duration
    from emq_django.results.models import JobResult

    rows = JobResult.objects.filter(pk__in=job_ids).only("status", "runtime")
    return {r.pk: (r.status, f"run {human_duration(r.runtime)}") for r in rows}
