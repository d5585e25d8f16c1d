"""The scheduler's settings, read when accessed through the settings registry
(``emq_django.conf``: Django settings, then the environment, then the default)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from emq_django.conf import get_settings
from emq_django.scheduler.timing import CATCH_UP_ONCE


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


# the command's options, by the registry's setting they override
_OPTIONS = {"catch_up": "scheduler_catch_up", "poll_interval": "scheduler_poll"}
_OPTIONS |= {"grace": "scheduler_grace", "broker_url": "broker_url"}


def load_config(**overrides: Any) -> SchedulerConfig:
    """The scheduler's config; ``overrides`` (command options) win when not None,
    checked as the settings they override are. Raises ``ImproperlyConfigured`` for a
    bad value."""
    emq = get_settings(**{_OPTIONS[k]: overrides.pop(k, None) for k in _OPTIONS})
    values: dict[str, Any] = {
        "broker_url": emq.BROKER_URL,
        "heartbeat_interval": emq.HEARTBEAT_INTERVAL,
        "heartbeat_liveness": emq.HEARTBEAT_LIVENESS,
        "ack_timeout": emq.ACK_TIMEOUT,
        "catch_up": emq.SCHEDULER_CATCH_UP,
        "poll_interval": emq.SCHEDULER_POLL,
        "grace": emq.SCHEDULER_GRACE,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return SchedulerConfig(**values)
