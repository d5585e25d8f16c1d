"""Admin pages without a table: the live dashboard, the topics and the broker's
dead letters, and the one "emq" section of the admin index that lists them with
the rest."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from emq_django.exceptions import EmqError
from emq_django.results import actions, dashboard, live_pages, topics_page
from emq_django.results.models import Dashboard
from emq_django.results.permissions import PURGE_DEAD, REQUEUE_DEAD, allowed, refused

DEAD_ACTIONS = {
    "requeue": (REQUEUE_DEAD, "requeue dead letters"),
    "purge": (PURGE_DEAD, "purge dead letters"),
}


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The live dashboard, the topics and the dead letters; staff only."""

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
            path("topics/", view(self.topics_view), name="emq_topics"),
            path("topics/data/", view(self.topics_data_view), name="emq_topics_data"),
            path("deadletters/", view(self.dead_letters_view), name="emq_dead_letters"),
            path(
                "deadletters/do/",
                view(require_POST(self.dead_letters_action)),
                name="emq_dead_letters_action",
            ),
            # the live views (issue 35): a queue's jobs, a job manager
            path("queue/<path:name>/", view(self.live_queue_view), name="emq_live_queue"),
            path(
                "queue-action/<path:name>/",
                view(require_POST(self.live_queue_action)),
                name="emq_live_queue_action",
            ),
            path(
                "jobmanager/<path:name>/",
                view(self.live_job_manager_view),
                name="emq_live_job_manager",
            ),
            path(
                "jobmanager-action/<path:name>/",
                view(require_POST(self.live_job_manager_action)),
                name="emq_live_job_manager_action",
            ),
        ]

    def live_queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        return live_pages.queue_view(self, request, name)

    def live_queue_action(self, request: HttpRequest, name: str) -> HttpResponse:
        return live_pages.queue_action(self, request, name)

    def live_job_manager_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        return live_pages.job_manager_view(self, request, name)

    def live_job_manager_action(self, request: HttpRequest, name: str) -> HttpResponse:
        return live_pages.job_manager_action(self, request, name)

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

    def topics_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        context = {
            **self.admin_site.each_context(request),
            "title": "Topics",
            "monitor_url": dashboard.monitor_url(),
            "poll_ms": dashboard.POLL_MS,
            "topic": request.GET.get("topic", ""),
            "latest_n": topics_page.LATEST,
        }
        return TemplateResponse(request, "emq/topics.html", context)

    def topics_data_view(self, request: HttpRequest) -> JsonResponse:
        if not self.has_view_permission(request):
            return JsonResponse({"error": "staff only"}, status=403)
        return JsonResponse(topics_page.data(request.GET.get("topic", "")))

    def dead_letters_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        letters: list[dict[str, Any]] = []
        error = ""
        try:
            letters = actions.dead_letters()
        except EmqError as exc:
            error = str(exc)
        can = {action: allowed(request, perm) for action, (perm, _) in DEAD_ACTIONS.items()}
        context = {
            **self.admin_site.each_context(request),
            "title": "Dead letters",
            "letters": letters,
            "error": error,
            "can_requeue": can["requeue"],
            "can_purge": can["purge"],
            "all_actions": [
                (a, label)
                for a, label in (("requeue", "Requeue ALL"), ("purge", "Purge ALL"))
                if can[a]
            ],
            "monitor_url": dashboard.monitor_url(),
        }
        return TemplateResponse(request, "emq/dead_letters.html", context)

    def dead_letters_action(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        if action not in DEAD_ACTIONS:
            return HttpResponseBadRequest(
                f"Not done: {action!r} is not a dead-letter action; use requeue or purge."
            )
        perm, what = DEAD_ACTIONS[action]
        if not allowed(request, perm):
            return refused(what, perm)
        every = request.POST.get("all") == "1"
        ids = request.POST.getlist("job_id")
        back = HttpResponseRedirect(reverse("admin:emq_dead_letters"))
        if not every and not ids:
            self.message_user(request, "Select dead letters first, or use the ALL button.")
            return back
        if action == "purge" and request.POST.get("confirmed") != "yes":
            return self._confirm_purge(request, every, ids)
        try:
            count = actions.dead_letter_command(action, None if every else ids)
        except (EmqError, ValueError) as exc:
            self.message_user(request, f"Not done: {exc}", messages.ERROR)
            return back
        self.message_user(
            request, f"{action.capitalize()}d {count} dead letters.", messages.SUCCESS
        )
        return back

    def _confirm_purge(self, request: HttpRequest, every: bool, ids: list[str]) -> HttpResponse:
        """Ask first, as Django's delete action does: what would be gone for good."""
        try:
            letters = actions.dead_letters()
        except EmqError as exc:
            self.message_user(request, f"Not purged: {exc}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:emq_dead_letters"))
        if not every:
            chosen = set(ids)
            letters = [d for d in letters if str(d.get("id")) in chosen]
        context = {
            **self.admin_site.each_context(request),
            "title": "Are you sure?",
            "letters": letters,
            "every": every,
            "ids": ids,
            "guaranteed": sum(1 for d in letters if d.get("guaranteed")),
        }
        return TemplateResponse(request, "emq/dead_letters_confirm.html", context)
