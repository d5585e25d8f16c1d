"""What a worker process tells observers about each attempt it runs: the
``emq_django.signals`` (started, succeeded, failed, retrying, dead-lettered,
partial_sent) and the attempt's OpenTelemetry span (``emq_django.otel``).

Called only when someone observes (``signals.worker_listened`` or ``otel.active()``,
read once per job by the worker loop): the job's body is decoded again here for
the receivers' ``args``/``kwargs``, which costs nothing when nobody listens.

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

from emq_django import otel, registry, signals
from emq_django.broker.retry import retry_limit
from emq_django.exceptions import Cancelled, ProtocolError
from emq_django.ids import split_attempt
from emq_django.protocol.body import decode_run_body
from emq_django.protocol.headers import Headers
from emq_django.worker.execution import Outcome

SUCCEEDED, FAILED, RETRYING, DEAD_LETTERED, CANCELLED = (
    "succeeded",
    "failed",
    "retrying",
    "dead_lettered",
    "cancelled",
)


@dataclass(slots=True)
class Attempt:
    """What the observers of one attempt need, made once when it starts."""

    sender: Any
    fields: dict[str, Any]  # job_id, attempt, task, queue, args, kwargs
    attempt_id: bytes
    retries: int
    started: float
    span: otel.Consuming | None


_current: Attempt | None = None  # the attempt this process runs (one at a time)


def started(msgid: bytes, queue: str, h: Headers, body: bytes) -> Attempt:
    """The attempt ``msgid`` starts: ``job_started``, its span; returns what
    ``finished`` needs."""
    global _current
    job_id, attempt = split_attempt(msgid)
    name = h.task
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    if signals.worker_listened:
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
    span = otel.consuming(msgid, queue, h) if otel.active() else None
    sender = registry.find(name) or name
    now = time.monotonic()
    _current = Attempt(sender, fields, msgid, h.retry_count, now, span)
    if signals.job_started.receivers:
        signals.send(signals.job_started, sender, **fields)
    return _current


def fate(attempt: int, retries: int, outcome: Outcome) -> str:
    """What comes of an attempt that ended with ``outcome``, as the broker's retry
    policy decides it for a failure (not a death)."""
    if not outcome.failed:
        return SUCCEEDED
    if outcome.error_type == Cancelled.TYPE:
        return CANCELLED  # a cancelled job ends: neither retried nor dead-lettered
    requested = outcome.retry
    if attempt <= retry_limit(retries, requested is not None):
        return RETRYING
    if retries or requested is not None:
        return DEAD_LETTERED
    return FAILED


def finished(attempt: Attempt, outcome: Outcome) -> None:
    """The attempt ended with ``outcome``: succeeded, or failed (then retrying or
    dead-lettered when the job's retries say so)."""
    global _current
    _current = None
    runtime = time.monotonic() - attempt.started
    fields = attempt.fields
    what = fate(fields["attempt"], attempt.retries, outcome)
    if attempt.span is not None:
        otel.consumed(attempt.span, what, outcome.error_type, outcome.exception)
        if outcome.failed and what != CANCELLED and attempt.span.first:
            # the broker keeps it with the job if it retries it (whatever ``fate``
            # predicted): the retries' spans link to it
            outcome.span = otel.reference(attempt.span)
    if not signals.worker_listened:
        return
    sender = attempt.sender
    if what == SUCCEEDED:
        if signals.job_succeeded.receivers:
            result = json.loads(outcome.body).get("value")
            signals.send(signals.job_succeeded, sender, result=result, runtime=runtime, **fields)
        return
    exc, error = outcome.exception, outcome.error_type
    if signals.job_failed.receivers:
        signals.send(
            signals.job_failed,
            sender,
            exception=exc,
            error=error,
            outcome=what,
            runtime=runtime,
            **fields,
        )
    if what == RETRYING and signals.job_retrying.receivers:
        requested = outcome.retry
        delay = requested if requested is not None and requested >= 0 else None
        signals.send(
            signals.job_retrying, sender, exception=exc, error=error, delay=delay, **fields
        )
    elif what == DEAD_LETTERED and signals.job_dead_lettered.receivers:
        signals.send(signals.job_dead_lettered, sender, exception=exc, error=error, **fields)


def partial(attempt_id: bytes, body: bytes, index: int) -> None:
    """A partial result of the running attempt went out: ``partial_sent``, and an
    event on the attempt's span."""
    current = _current
    if current is not None and current.attempt_id == attempt_id:
        fields, sender = current.fields, current.sender
        if current.span is not None:
            otel.partial(current.span, index)
    else:
        job_id, attempt = split_attempt(attempt_id)
        fields = {"job_id": job_id, "attempt": attempt, "task": "", "queue": ""}
        fields.update(args=None, kwargs=None)
        sender = ""
    if signals.partial_sent.receivers:
        value = json.loads(body).get("value")
        signals.send(signals.partial_sent, sender, value=value, index=index, **fields)
