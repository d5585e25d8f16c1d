"""Settings of the results app, read when accessed, through the settings registry
(``emq_django.conf.read``: Django settings, else environment, else default)."""

from __future__ import annotations

from dataclasses import dataclass

from emq_django.conf import read


@dataclass(frozen=True, slots=True)
class ResultsSettings:
    retention: float  # seconds a JobResult row is kept after it finished
    prune_interval: float  # seconds between automatic prunes, per recording process
    show_args: bool  # show args/kwargs unmasked in the admin
    metrics_token: str  # bearer token for /emq/metrics ('' = staff login only)
    dashboard_timeout: float  # seconds the dashboard waits for the monitor channel
    max_buffer: int  # records a recorder keeps while the database is unreachable


def results_settings() -> ResultsSettings:
    """Raises ``ImproperlyConfigured`` for a bad value."""
    return ResultsSettings(
        retention=read("RESULTS_RETENTION"),
        prune_interval=read("RESULTS_PRUNE_INTERVAL"),
        show_args=read("RESULTS_SHOW_ARGS"),
        metrics_token=read("METRICS_TOKEN"),
        dashboard_timeout=read("DASHBOARD_TIMEOUT"),
        max_buffer=read("RESULTS_MAX_BUFFER"),
    )
