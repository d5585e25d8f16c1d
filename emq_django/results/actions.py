"""What the admin's retry and cancel actions do, through the client API."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from emq_django import registry
from emq_django.client import get_client
from emq_django.conf import cached_settings
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from emq_django.results.models import JobResult


def _autodiscover_once() -> None:
    if not getattr(_autodiscover_once, "done", False):
        registry.autodiscover(cached_settings().IMPORTS)
        _autodiscover_once.done = True  # type: ignore[attr-defined]


def retry(row: JobResult) -> str:
    """Send the job again with its arguments, as a new job; returns the new id.

    Uses the registered task when this process knows it (its queue, retries and
    timeout); else sends the same body a client would, to the row's queue.
    Raises ``EmqError`` (``BrokerUnavailable``, ``QueueFull``, ...) as
    ``apply_async`` does, and ``ValueError`` for a row without a task name.
    """
    if not row.task:
        raise ValueError(f"job {row.id} has no task name (sent by a client without one)")
    args, kwargs = json.loads(row.args or "[]"), json.loads(row.kwargs or "{}")
    _autodiscover_once()
    task = registry.find(row.task)
    if task is not None:
        return task.apply_async(args, kwargs, queue=row.queue or None).id
    path, _, name = row.task.rpartition(".")
    headers = format_headers(reply_requested=True, task=row.task)
    body = encode_run_body(path, name, args, kwargs)
    return get_client().send(row.queue or "default", headers, body, confirm=True)


def cancel(job_ids: Iterable[str]) -> tuple[list[str], str]:
    """Ask the broker to cancel these jobs: (cancelled ids, what happened to the others).

    The second part names every job that was not cancelled and why: a finished
    job's outcome from the job history, else that the broker holds no waiting job
    with that id. Raises ``BrokerUnavailable`` (``EmqError``) when the
    broker does not answer.
    """
    client: Any = get_client()
    done: list[str] = []
    not_done: list[str] = []
    for job_id in job_ids:
        outcome = client.cancel(job_id)
        if outcome is True or outcome == "cancelled":
            done.append(job_id)
        else:
            not_done.append(job_id)
    return done, "; ".join(_why_not(job_id) for job_id in not_done)


def _why_not(job_id: str) -> str:
    row = JobResult.objects.filter(pk=job_id).only("status").first()
    if row is not None and row.status not in ("running", "retrying"):
        return f"{job_id} has already finished ({row.status}): nothing to cancel"
    return f"{job_id}: the broker holds no waiting job with this id (running, or gone)"
