"""System checks: ``manage.py check`` names bad EMQ_* settings, and each app or URL
include that a configured feature needs and the project lacks.

Registered by every emq app's ``ready()``, so that one installed without
``emq_django`` itself can say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any

from django.core.checks import CheckMessage, Error, Info, Warning, register
from django.core.exceptions import ImproperlyConfigured

DATABASE_RECORDER = "emq_django.results.recorder.DatabaseRecorder"
METRICS_INCLUDE = 'path("emq/", include("emq_django.results.urls"))'


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    from emq_django.conf import get_settings

    try:
        get_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="emq.E001")]
    return []


@register()
def check_plaintext_binds(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """A non-loopback bind without CURVE: the broker will refuse to start
    (``broker/exposure.py``). A warning, not an error, so that the commands that bind
    nothing (migrate, the job manager, ...) still run with these settings."""
    from emq_django.broker import exposure
    from emq_django.conf import get_settings

    try:
        settings = get_settings()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    bad = exposure.plaintext_exposed(settings, exposure.settings_binds(settings))
    if not bad:
        return []
    return [
        Warning(
            "The broker will not start: " + exposure.explain(bad) + ".",
            hint="emq_broker refuses these addresses until one of the three is done.",
            id="emq.W002",
        )
    ]


def _installed(name: str) -> bool:
    from django.apps import apps

    return apps.is_installed(name)


def _missing_app(name: str, needed_for: str, id: str) -> Error:
    return Error(
        f"{name!r} is not in INSTALLED_APPS, but {needed_for}.",
        hint=f"Add {name!r} to INSTALLED_APPS, then run manage.py migrate.",
        id=id,
    )


@register()
def check_apps(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The apps the configured features need (docs/getting-started.md, "Use it in your project")."""

    errors: list[CheckMessage] = []
    if not _installed("emq_django"):
        errors.append(
            _missing_app(
                "emq_django",
                "emq apps are installed: without it the emq_* commands (emq_broker, "
                "emq_jobmanager, emq_scheduler, emq_status) are unknown",
                "emq.E002",
            )
        )
    if _setting("RECORDER") == DATABASE_RECORDER:
        if not _installed("emq_django.results"):
            errors.append(
                _missing_app(
                    "emq_django.results",
                    f"EMQ_RECORDER is {DATABASE_RECORDER}, which writes the job history "
                    "to its table",
                    "emq.E003",
                )
            )
    if _curve_server() and not _installed("emq_django.security"):
        errors.append(
            _missing_app(
                "emq_django.security",
                "EMQ_CURVE_SECRET_KEY is set: the broker admits the keys of its "
                "AuthorizedKey table (manage.py emq_keys)",
                "emq.E005",
            )
        )
    if _periodic_declared() and not _installed("emq_django.scheduler"):
        errors.append(
            _missing_app(
                "emq_django.scheduler",
                "tasks declare @emq.periodic schedules, which are stored in its table "
                "(emq.schedule() and emq_scheduler need it too)",
                "emq.E004",
            )
        )
    return errors


def _curve_server() -> bool:
    return bool(_setting("CURVE_SECRET_KEY"))


# Each returns what the tasks modules declare for an app that may be missing (the
# scheduler's ``@emq.periodic``); registered by the emq app's ready() (apps.py), so
# that this module imports no app.
_periodic_probes: list[Callable[[], Sized]] = []


def add_periodic_probe(declared: Callable[[], Sized]) -> None:
    if declared not in _periodic_probes:
        _periodic_probes.append(declared)


def _periodic_declared() -> bool:
    """Whether any ``@emq.periodic`` is declared in the apps' ``tasks`` modules."""
    from django.utils.module_loading import autodiscover_modules

    if not _periodic_probes:
        return False
    try:
        autodiscover_modules("tasks")
    except Exception:  # a broken tasks module is the job manager's error to report
        pass
    return any(len(declared()) for declared in _periodic_probes)


@register(deploy=False)
def check_urls(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The Prometheus endpoint ``/emq/metrics`` needs the results URLs included."""
    from django.conf import settings
    from django.urls import NoReverseMatch, reverse

    if not _installed("emq_django.results") or not getattr(settings, "ROOT_URLCONF", None):
        return []
    try:
        reverse("emq_results:metrics")
        return []
    except NoReverseMatch:
        pass
    except Exception:  # a urls.py that does not import is Django's own check to report
        return []
    token = _setting("METRICS_TOKEN")
    reason = "EMQ_METRICS_TOKEN is set, but" if token else "emq_django.results is installed;"
    message = f"{reason} the Prometheus endpoint /emq/metrics is not routed."
    hint = f"Add {METRICS_INCLUDE} to your urls.py (from django.urls import include)."
    if token:
        return [Warning(message, hint=hint, id="emq.W001")]
    return [Info(message, hint=hint, id="emq.I001")]


def _setting(name: str) -> Any:
    """One setting through the registry; a bad value is check_settings' error, not this
    check's: it counts as unset here."""
    from emq_django.conf import read

    try:
        return read(name)
    except ImproperlyConfigured:
        return ""
