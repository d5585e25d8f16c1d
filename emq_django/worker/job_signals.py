"""A worker process's side of ``emq_django.signals``: started, succeeded, failed,
retrying, dead-lettered and partial_sent, around each attempt it runs.

Called only when a receiver listens (``signals.worker_listened``, read once per job
by the worker loop): the job's body is decoded again here for the receivers'
``args``/``kwargs``, which costs nothing when nobody listens.

Whether a failed attempt is retried or dead-lettered is the broker's decision
(broker/lifecycle.py); the worker process predicts it with the same pure rule
(``broker.retry.retry_limit``) from the attempt number and the job's ``retries``.
An attempt number counts the broker's deliveries, so a job given back unstarted or
redelivered after its worker died is retried one attempt sooner than predicted here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from emq_django import registry, signals
from emq_django.broker.retry import retry_limit
from emq_django.exceptions import Cancelled, ProtocolError
from emq_django.ids import split_attempt
from emq_django.protocol.body import decode_run_body
from emq_django.protocol.headers import Headers
from emq_django.worker.execution import Outcome


@dataclass(slots=True)
class JobView:
    """What the signals of one attempt carry, made once when it starts."""

    sender: Any
    fields: dict[str, Any]  # job_id, attempt, task, queue, args, kwargs
    attempt_id: bytes
    retries: int
    started: float


_current: JobView | None = None  # the attempt this process runs (one at a time)


def started(msgid: bytes, queue: str, h: Headers, body: bytes) -> JobView:
    """The attempt ``msgid`` starts: ``job_started``; returns what ``finished`` needs."""
    global _current
    job_id, attempt = split_attempt(msgid)
    name = h.task
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    try:
        spec = decode_run_body(body)
        args, kwargs, name = list(spec.args), dict(spec.kwargs), spec.task_name
    except ProtocolError:
        pass  # the job fails as refused; its signals say so with args None
    fields = {
        "job_id": job_id,
        "attempt": attempt,
        "task": name,
        "queue": queue,
        "args": args,
        "kwargs": kwargs,
    }
    view = JobView(registry.find(name) or name, fields, msgid, h.retry_count, time.monotonic())
    _current = view
    if signals.job_started.receivers:
        signals.send(signals.job_started, view.sender, **fields)
    return view


def finished(view: JobView, outcome: Outcome) -> None:
    """The attempt ended with ``outcome``: succeeded, or failed (then retrying or
    dead-lettered when the job's retries say so)."""
    global _current
    _current = None
    runtime = time.monotonic() - view.started
    fields = view.fields
    if not outcome.failed:
        if signals.job_succeeded.receivers:
            result = json.loads(outcome.body).get("value")
            signals.send(
                signals.job_succeeded, view.sender, result=result, runtime=runtime, **fields
            )
        return
    exc = outcome.exception
    error = outcome.error_type
    if signals.job_failed.receivers:
        signals.send(
            signals.job_failed, view.sender, exception=exc, error=error, runtime=runtime, **fields
        )
    if error == Cancelled.TYPE:
        return  # a cancelled job ends: neither retried nor dead-lettered
    requested = outcome.retry
    if fields["attempt"] <= retry_limit(view.retries, requested is not None):
        if signals.job_retrying.receivers:
            delay = requested if requested is not None and requested >= 0 else None
            signals.send(
                signals.job_retrying, view.sender, exception=exc, error=error, delay=delay, **fields
            )
    elif view.retries or requested is not None:
        if signals.job_dead_lettered.receivers:
            signals.send(
                signals.job_dead_lettered, view.sender, exception=exc, error=error, **fields
            )


def partial(attempt_id: bytes, body: bytes, index: int) -> None:
    """A partial result of the running attempt went out: ``partial_sent``."""
    view = _current
    if view is None or view.attempt_id != attempt_id:
        job_id, attempt = split_attempt(attempt_id)
        fields: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "task": "", "queue": ""}
        fields.update(args=None, kwargs=None)
        sender: Any = ""
    else:
        fields, sender = view.fields, view.sender
    value = json.loads(body).get("value")
    signals.send(signals.partial_sent, sender, value=value, index=index, **fields)
