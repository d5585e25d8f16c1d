"""Unique jobs, the sending side (docs/features/unique-jobs.md; the broker's side is
broker/unique.py).

``apply_async(unique_key=...)``, or ``@emq.task(unique=True)`` (the key is the task's
name and a hash of its JSON arguments): the job goes with the header
``unique:<key>`` (and ``unique-for:<seconds>``) and waits for the broker's answer.
An ACK: a new job. An ERROR ``duplicate`` naming another job: that job holds the
key, and the caller gets its handle, with ``duplicate`` True.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from emq_django import signals
from emq_django.exceptions import DuplicateJob
from emq_django.handles import Result
from emq_django.protocol.headers import format_headers
from emq_django.protocol.limits import MAX_UNIQUE_FOR, check_seconds, check_unique_key

if TYPE_CHECKING:
    from emq_django.client import Client


class Task(Protocol):
    """What this module uses of ``task.Task`` (not imported: it imports this)."""

    name: str
    unique: bool
    unique_for: float

    def _sent(self, msgid: Any, queue: str, args: Any, kwargs: Any) -> None: ...

    def apply_async(
        self, args: Sequence[Any] = ..., kwargs: Mapping[str, Any] | None = ...
    ) -> Result: ...


def check_unique(unique: Any, unique_for: Any) -> tuple[bool, float]:
    """``@emq.task``'s ``unique`` and ``unique_for``; raises ``TypeError``/
    ``ValueError``."""
    if not isinstance(unique, bool):
        raise TypeError(f"unique must be True or False, got {unique!r}")
    return unique, check_seconds("unique_for", unique_for, MAX_UNIQUE_FOR)


def key_of(
    task_name: str,
    unique_key: str | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
) -> str:
    """The job's unique key: ``unique_key`` checked, else the task's name and the
    SHA-256 of its arguments as JSON (keys sorted: ``f(a=1, b=2)`` is
    ``f(b=2, a=1)``)."""
    if unique_key is not None:
        return check_unique_key(unique_key)
    spec = json.dumps([list(args), dict(kwargs or {})], sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(spec.encode()).hexdigest()
    return f"{task_name[: 200 - 65]}:{digest}"


def unique_of(
    task: Task,
    unique_key: str | None,
    unique_for: float | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
) -> tuple[str, float] | None:
    """``apply_async``'s unique key and ``unique_for`` (the task's by default), or
    None for a job that is not unique; raises ``TypeError``/``ValueError``."""
    if unique_key is None and unique_for is None and not task.unique:
        return None
    keep = task.unique_for if unique_for is None else check_unique(True, unique_for)[1]
    return key_of(task.name, unique_key, args, kwargs), keep


def with_key(headers: bytes, key: str, unique_for: float) -> bytes:
    """``headers`` with the ``unique`` (and ``unique-for``) header added."""
    more = format_headers(unique=key, unique_for=unique_for)
    return headers + b"," + more if headers else more


def send_unique(
    client: Client,
    queue: str,
    headers: bytes,
    body: bytes,
    task: Task,
    job_id: str | None,
    reply: bool,
    call: tuple[Sequence[Any], Mapping[str, Any] | None] = ((), None),
) -> Result:
    """Send a unique job and wait for the broker's answer: this job's handle, or
    the existing job's with ``duplicate`` True (``signals.job_sent`` for a new job
    only, with ``call``'s arguments). Raises what ``Client.send`` raises."""
    try:
        sent = client.send(queue, headers, body, confirm=True, job_id=job_id)
    except DuplicateJob as exc:
        result = Result(exc.existing_id, task.name, reply=reply, client=client)
        result.duplicate = True
        return result
    if signals.job_sent.receivers:
        task._sent(sent, queue, call[0], call[1])
    return Result(sent, task.name, reply=reply, client=client)


def apply_call(task: Task, call: Any) -> Result:
    """One call of a unique task's ``map()``: ``args``, or an ``(args, kwargs)`` pair
    (each job waits for the broker's answer: no pipelining)."""
    if (
        isinstance(call, tuple)
        and len(call) == 2
        and isinstance(call[1], Mapping)
        and isinstance(call[0], list | tuple)
    ):
        return task.apply_async(call[0], call[1])
    return task.apply_async(call)
