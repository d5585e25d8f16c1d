"""The checks ``Task`` makes at the call site of ``delay()``/``apply_async()``/
``@emq.task`` (what the broker would refuse raises here: ``TypeError``/``ValueError``),
and the run-after time of a ``countdown``/``eta``."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from emq_django.protocol.limits import (
    MAX_DELAY,
    MAX_TIMEOUT,
    check_count,
    check_job_id,
    check_queue_name,
    check_seconds,
)


def check_options(
    queue: Any, retries: Any, timeout: Any, guarantee: Any, reply: Any, job_id: Any
) -> None:
    """Refuse at the call site what the broker would refuse; ``TypeError``/``ValueError``."""
    if queue is not None:
        check_queue_name(queue)
    if retries is not None:
        check_count("retries", retries)
    if timeout is not None:
        check_seconds("timeout", timeout, MAX_TIMEOUT)
    for name, flag in (("guarantee", guarantee), ("reply", reply)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if job_id is not None:
        check_job_id(job_id)


def check_soft_timeout(soft_timeout: Any, timeout: Any) -> None:
    """A soft limit is seconds >= 0 (0: none), under the hard one when there is one;
    raises ``TypeError``/``ValueError``."""
    check_seconds("soft_timeout", soft_timeout, MAX_TIMEOUT)
    if soft_timeout and timeout and soft_timeout >= timeout:
        raise ValueError(
            f"soft_timeout ({soft_timeout:g} s) must be less than timeout ({timeout:g} s): "
            "the hard limit would kill the task before the soft one could raise"
        )


def check_size(body: bytes, limit: int, name: str) -> bytes:
    if len(body) > limit:
        raise ValueError(
            f"the arguments of {name} encode to {len(body)} bytes; the broker takes at most "
            f"{limit} (EMQ_MAX_BODY_BYTES): pass large data by reference (a path, a key)"
        )
    return body


def when_to_run(countdown: float | None, eta: dt.datetime | None) -> float:
    """The run-after time (Unix seconds), 0 for now. Raises ``ValueError`` for a
    negative, non-finite or more than ``MAX_DELAY`` (a year) away time."""
    if countdown is not None and eta is not None:
        raise ValueError("give countdown or eta, not both")
    if countdown is not None:
        check_seconds("countdown", countdown, MAX_DELAY)
        return time.time() + countdown if countdown else 0.0
    if eta is not None:
        if not isinstance(eta, dt.datetime):
            raise TypeError(f"eta must be a datetime, got {type(eta).__name__}")
        if eta.tzinfo is None:
            raise ValueError("eta must be timezone-aware (use django.utils.timezone.now())")
        when = eta.timestamp()
        if when - time.time() > MAX_DELAY:
            raise ValueError(
                f"eta {eta.isoformat()} is more than {MAX_DELAY / 86400:.0f} days ahead; "
                "use emq.schedule() for jobs that far out"
            )
        return max(when, 0.0)
    return 0.0
