"""One "emq" section on the admin index: Dashboard, Jobs, Schedules, Metrics,
Dead letters and Authorized keys, in that order, instead of one section per emq app.

Installed on ``admin.site`` when the results app is ready (``install``): it wraps
the site's ``get_app_list`` (the index and the navigation sidebar), leaving each
app's own index page (``/admin/emq_results/``) as Django builds it.
"""

from __future__ import annotations

import types
from typing import Any

from django.contrib.admin import AdminSite
from django.urls import NoReverseMatch, reverse

EMQ_APPS = ("emq_results", "emq_scheduler", "emq_analytics", "emq_tasks", "emq_security")
# (app label, model) -> the name shown in the emq section, in order
SHOWN = {
    ("emq_results", "dashboard"): "Dashboard",
    ("emq_results", "jobresult"): "Jobs",
    ("emq_scheduler", "scheduledjob"): "Schedules",
    ("emq_analytics", "metricsdashboard"): "Metrics",
    ("emq_security", "authorizedkey"): "Authorized keys",  # after Dead letters
}
# the metric rows, the retry links and the schedule runs are reached from those pages
HIDDEN = {
    ("emq_analytics", "queuemetric"),
    ("emq_analytics", "taskmetric"),
    ("emq_analytics", "jobmanagermetric"),
    ("emq_analytics", "failuremetric"),
}


def _dead_letters_entry() -> dict[str, Any] | None:
    try:
        url = reverse("admin:emq_dead_letters")
    except NoReverseMatch:
        return None
    return {
        "name": "Dead letters",
        "object_name": "DeadLetters",
        "model": None,
        "perms": {"view": True},
        "admin_url": url,
        "add_url": None,
        "view_only": True,
    }


def group(app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``app_list`` with the emq apps' entries merged into one section named "emq"."""
    emq = [app for app in app_list if app.get("app_label") in EMQ_APPS]
    if not emq:
        return app_list
    shown: dict[str, dict[str, Any]] = {}
    rest: list[dict[str, Any]] = []
    for app in emq:
        for entry in app["models"]:
            key = (app["app_label"], entry["object_name"].lower())
            if key in SHOWN:
                shown[SHOWN[key]] = {**entry, "name": SHOWN[key]}
            elif key not in HIDDEN:
                rest.append(entry)
    models = [shown[name] for name in SHOWN.values() if name in shown]
    dead = _dead_letters_entry() if "Dashboard" in shown else None
    if dead is not None:
        models.insert(min(len(models), 4), dead)
    section = {
        "name": "emq",
        "app_label": "emq_results",
        "app_url": (shown.get("Dashboard") or (models + rest)[0])["admin_url"],
        "has_module_perms": True,
        "models": models + rest,
    }
    at = app_list.index(emq[0])
    others = [app for app in app_list if app not in emq]
    return [*others[:at], section, *others[at:]]


def install(site: AdminSite) -> None:
    """Make ``site.get_app_list`` group the emq apps (once per site)."""
    if getattr(site, "_emq_grouped", False):
        return
    original = site.get_app_list

    def get_app_list(self: AdminSite, request: Any, app_label: str | None = None) -> Any:
        app_list = original(request, app_label)
        return app_list if app_label is not None else group(app_list)

    site.get_app_list = types.MethodType(get_app_list, site)  # type: ignore[method-assign]
    site._emq_grouped = True  # type: ignore[attr-defined]
