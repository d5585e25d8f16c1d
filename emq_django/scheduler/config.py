"""The scheduler's settings, read when accessed through the settings registry
(``emq_django.conf``: Django settings, then the environment, then the default)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from emq_django.conf import get_settings, read
from emq_django.scheduler.timing import CATCH_UP_ONCE, CATCH_UP_POLICIES


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    broker_url: str = "tcp://127.0.0.1:47291"
    heartbeat_interval: float = 1.0
    heartbeat_liveness: int = 3
    ack_timeout: float = 5.0
    catch_up: str = CATCH_UP_ONCE  # EMQ_SCHEDULER_CATCH_UP: once | none | all
    poll_interval: float = 0.5  # EMQ_SCHEDULER_POLL: how soon admin/ORM changes are seen
    grace: float = 1.0  # EMQ_SCHEDULER_GRACE: seconds late before a tick counts as missed
    sync_periodic: bool = True

    @property
    def grace_delta(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.grace)


def load_config(**overrides: Any) -> SchedulerConfig:
    """The scheduler's config; ``overrides`` (command options) win when not None.
    Raises ``ImproperlyConfigured`` for a bad value."""
    emq = get_settings(broker_url=overrides.pop("broker_url", None))
    values: dict[str, Any] = {
        "broker_url": emq.BROKER_URL,
        "heartbeat_interval": emq.HEARTBEAT_INTERVAL,
        "heartbeat_liveness": emq.HEARTBEAT_LIVENESS,
        "ack_timeout": emq.ACK_TIMEOUT,
        "catch_up": read("SCHEDULER_CATCH_UP"),
        "poll_interval": read("SCHEDULER_POLL"),
        "grace": read("SCHEDULER_GRACE"),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        values["poll_interval"] = float(values["poll_interval"])
        values["grace"] = float(values["grace"])
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"EMQ_SCHEDULER_POLL/GRACE must be numbers: {exc}") from exc
    config = SchedulerConfig(**values)
    if config.catch_up not in CATCH_UP_POLICIES:
        raise ImproperlyConfigured(
            f"EMQ_SCHEDULER_CATCH_UP={config.catch_up!r}; use one of {', '.join(CATCH_UP_POLICIES)}"
        )
    if not 0 < config.poll_interval <= 2:
        raise ImproperlyConfigured("EMQ_SCHEDULER_POLL must be in (0, 2] seconds")
    if config.grace < 0:
        raise ImproperlyConfigured("EMQ_SCHEDULER_GRACE must be >= 0 seconds")
    return config
