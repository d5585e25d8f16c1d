"""A schedule's default name: the key EventMQ 0.3.13's scheduler derives; a
tick's job id.

``sha1`` of the call (path, callable, args, kwargs, class_args, class_kwargs) as
JSON with sorted keys and the default separators, so that scheduling the same
call twice, from our API or from an EventMQ client, names the same schedule.
Queue, headers and timing are not part of it (docs/eventmq-wire.md, section 4).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from emq_django.ids import ID_CHARS

TICK_SALT = "emq_django.scheduler.tick"


def schedule_key(
    path: str,
    callable_name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    class_args: Sequence[Any] = (),
    class_kwargs: Mapping[str, Any] | None = None,
) -> str:
    call = {
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "class_args": list(class_args),
        "class_kwargs": dict(class_kwargs or {}),
        "path": path,
        "callable": callable_name,
    }
    return hashlib.sha1(json.dumps(call, sort_keys=True).encode("utf-8")).hexdigest()


def task_key(
    task_name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> str:
    """``schedule_key`` for a registered task name ``pkg.mod.func``."""
    path, callable_name = split_task_name(task_name)
    return schedule_key(path, callable_name, args, kwargs)


def split_task_name(task_name: str) -> tuple[str, str]:
    """``pkg.mod.func`` -> (``pkg.mod``, ``func``), split at the last dot as EventMQ does;
    raises ``ValueError`` for a name without one."""
    path, dot, callable_name = task_name.rpartition(".")
    if not dot or not path or not callable_name:
        raise ValueError(
            f"a task name needs a module path: 'pkg.module.function', got {task_name!r}"
        )
    return path, callable_name


def tick_id(schedule_name: str, due: dt.datetime) -> bytes:
    """The job id of a schedule's tick: the same whoever sends it and however often,
    so that the broker takes a resent tick (an ACK lost, a second scheduler) as the
    same job. An HMAC with ``SECRET_KEY``, not a bare hash: job ids stay unguessable
    (an id reads a job's result), as ``emq_django.ids`` promises."""
    from django.utils.crypto import salted_hmac

    moment = due.astimezone(dt.UTC).isoformat()
    digest = salted_hmac(TICK_SALT, f"{schedule_name}|{moment}", algorithm="sha256")
    return digest.hexdigest()[:ID_CHARS].encode()
