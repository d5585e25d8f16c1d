"""SCHEDULE and UNSCHEDULE as the broker forwards them, turned into schedules. Pure.

The 9-frame form (EventMQ 0.3.13) carries the interval (``-1`` for cron) and the
cron expression in frames of their own. The document's 7-frame form has neither:
the timing then comes from the headers (``interval:SECONDS`` or ``cron:EXPR``,
an expression without commas) or from the body's run object (``"interval_secs"``
or ``"cron"`` next to ``"path"``). Headers honoured: ``nohaste``, ``guarantee``,
``retry-count:N``, ``timeout:N``, EventMQ's ``run_count:N`` (stop after N runs)
and ``tz:ZONE`` (the cron expression's time zone; default ``TIME_ZONE``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.body import decode_run_body
from emq_django.scheduler.keys import schedule_key
from emq_django.scheduler.timing import Timing


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    name: str
    task: str
    timing: Timing
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    retries: int = 0
    timeout: float = 0.0
    guarantee: bool = False
    nohaste: bool = False
    max_runs: int | None = None


def unschedule_name(cmd: F.Schedule) -> str:
    """The schedule an UNSCHEDULE names; raises ``ProtocolError`` for a bad body."""
    body = decode_run_body(cmd.body)
    return schedule_key(
        body.path, body.callable, body.args, body.kwargs, body.class_args, body.class_kwargs
    )


def schedule_spec(cmd: F.Schedule, default_timezone: str = "UTC") -> ScheduleSpec:
    """The schedule a SCHEDULE asks for; raises ``ProtocolError`` saying what is wrong."""
    body = decode_run_body(cmd.body)
    h = cmd.headers
    timezone = h.get("tz") or h.get("timezone") or default_timezone
    try:
        timing = Timing(**_timing_fields(cmd), timezone=timezone)
    except ValueError as exc:
        raise ProtocolError(f"bad schedule timing: {exc}", [cmd.body[:200]]) from None
    max_runs = _count(h.get("run_count") or h.get("run-count"), cmd)
    return ScheduleSpec(
        name=schedule_key(
            body.path, body.callable, body.args, body.kwargs, body.class_args, body.class_kwargs
        ),
        task=body.task_name,
        timing=timing,
        args=body.args,
        kwargs=body.kwargs,
        queue=cmd.queue or "default",
        retries=h.retry_count,
        timeout=h.timeout,
        guarantee=h.guarantee,
        nohaste=h.nohaste,
        max_runs=max_runs if max_runs is not None and max_runs >= 0 else None,
    )


def _timing_fields(cmd: F.Schedule) -> dict[str, Any]:
    if cmd.interval is not None:  # 9 frames
        if cmd.interval >= 0:
            return {"interval": float(cmd.interval)}
        return {"cron": cmd.cron}
    interval = cmd.headers.get("interval") or cmd.headers.get("interval_secs")
    cron = cmd.headers.get("cron")
    if interval is None and cron is None:
        spec = json.loads(cmd.body)[1]  # decode_run_body has checked the shape
        interval, cron = spec.get("interval_secs"), spec.get("cron")
    if interval is not None:
        try:
            return {"interval": float(interval)}
        except (TypeError, ValueError):
            raise ProtocolError(
                f"interval {interval!r} is not a number", [cmd.body[:200]]
            ) from None
    if cron:
        return {"cron": str(cron)}
    raise ProtocolError(
        "a 7-frame SCHEDULE needs an 'interval:N' or 'cron:EXPR' header "
        "(or interval_secs/cron in the body)",
        [cmd.body[:200]],
    )


def _count(value: str | None, cmd: F.Schedule) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"run_count {value!r} is not an integer", [cmd.body[:200]]) from None
