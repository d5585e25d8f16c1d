"""Settings of the results app, read when accessed (Django settings, else environment).

They live here rather than in ``emq_django.conf`` so that the app stays optional.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True, slots=True)
class ResultsSettings:
    retention: float  # seconds a JobResult row is kept after it finished
    prune_interval: float  # seconds between automatic prunes, per recording process
    show_args: bool  # show args/kwargs unmasked in the admin
    metrics_token: str  # bearer token for /emq/metrics ('' = staff login only)
    dashboard_timeout: float  # seconds the dashboard waits for the monitor channel
    max_buffer: int  # records a recorder keeps while the database is unreachable


DEFAULTS = {
    "EMQ_RESULTS_RETENTION": "604800",  # 7 days
    "EMQ_RESULTS_PRUNE_INTERVAL": "60",
    "EMQ_RESULTS_SHOW_ARGS": "false",
    "EMQ_METRICS_TOKEN": "",
    "EMQ_DASHBOARD_TIMEOUT": "0.75",
    "EMQ_RESULTS_MAX_BUFFER": "50000",
}


def _raw(name: str) -> str:
    from django.conf import settings

    if settings.configured and hasattr(settings, name):
        return str(getattr(settings, name))
    return os.environ.get(name, DEFAULTS[name])


def _number(name: str) -> float:
    try:
        value = float(_raw(name))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} needs a number of seconds: {exc}") from exc
    if value <= 0:
        raise ImproperlyConfigured(f"{name} must be > 0, got {value:g}")
    return value


def results_settings() -> ResultsSettings:
    return ResultsSettings(
        retention=_number("EMQ_RESULTS_RETENTION"),
        prune_interval=_number("EMQ_RESULTS_PRUNE_INTERVAL"),
        show_args=_raw("EMQ_RESULTS_SHOW_ARGS").strip().lower() in ("1", "true", "yes", "on"),
        metrics_token=_raw("EMQ_METRICS_TOKEN"),
        dashboard_timeout=_number("EMQ_DASHBOARD_TIMEOUT"),
        max_buffer=int(_number("EMQ_RESULTS_MAX_BUFFER")),
    )
