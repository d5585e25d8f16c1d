"""What the admin's retry, cancel and dead-letter buttons do: the client API for a
retry, the broker's monitor channel (``CANCEL``, ``DEADLETTERS``) for the rest."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from emq_django import registry
from emq_django.client import get_client
from emq_django.conf import cached_settings
from emq_django.exceptions import JobRefused
from emq_django.monitor_client import command
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from emq_django.results.models import JobResult, RetryLink

CANCEL_STATES = ("cancelled", "stopping", "running", "unknown")


def autodiscover_once() -> None:
    """Register this project's tasks in the web process (the admin's choices, Retry)."""
    if not getattr(autodiscover_once, "done", False):
        registry.autodiscover(cached_settings().IMPORTS)
        autodiscover_once.done = True  # type: ignore[attr-defined]


def retry(row: JobResult) -> str:
    """Send the job again with its arguments, as a new job; returns the new id and
    remembers which job it repeats (``RetryLink``).

    Uses the registered task when this process knows it (its queue, retries and
    timeout); else sends the same body a client would, to the row's queue.
    Raises ``EmqError`` (``BrokerUnavailable``, ``QueueFull``, ...) as
    ``apply_async`` does, and ``ValueError`` for a row without a task name.
    """
    if not row.task:
        raise ValueError(f"job {row.id} has no task name (sent by a client without one)")
    args, kwargs = json.loads(row.args or "[]"), json.loads(row.kwargs or "{}")
    autodiscover_once()
    task = registry.find(row.task)
    if task is not None:
        new_id = task.apply_async(args, kwargs, queue=row.queue or None).id
    else:
        path, _, name = row.task.rpartition(".")
        headers = format_headers(reply_requested=True, task=row.task)
        body = encode_run_body(path, name, args, kwargs)
        new_id = get_client().send(row.queue or "default", headers, body, confirm=True)
    RetryLink.objects.create(job_id=new_id, original_id=row.id, created_at=timezone.now())
    return new_id


def _monitor(words: list[str]) -> dict[str, Any]:
    """One monitor command; raises ``BrokerUnavailable``, or ``JobRefused`` for an ERROR."""
    if any(not w or not w.isprintable() or " " in w for w in words):
        raise ValueError("job ids are printable and contain no spaces")
    return command(*words)


def cancel(job_ids: Iterable[str]) -> dict[str, list[str]]:
    """Ask the broker to cancel these jobs (one ``CANCEL`` command): the ids by what
    happened: ``cancelled`` (it had not started), ``stopping`` (it was running: its
    worker process is being killed and the job ends as cancelled), ``running`` (it runs
    on an EventMQ job manager, which cannot be told to stop it; it will not be
    retried), ``unknown`` (finished, or never seen). Raises ``BrokerUnavailable``."""
    ids = list(job_ids)
    if not ids:
        return {state: [] for state in CANCEL_STATES}
    doc = _monitor(["CANCEL", *ids])
    return {state: [str(i) for i in doc.get(state, [])] for state in CANCEL_STATES}


def dead_letters() -> list[dict[str, Any]]:
    """``DEADLETTERS LIST``: the broker's dead letters (raises ``BrokerUnavailable``)."""
    letters = _monitor(["DEADLETTERS", "LIST"]).get("dead_letters", [])
    return [letter for letter in letters if isinstance(letter, dict)]


def dead_letter_command(action: str, job_ids: list[str] | None) -> int:
    """``DEADLETTERS REQUEUE|PURGE ALL|<id>...``: how many were requeued or purged."""
    if action not in ("requeue", "purge"):
        raise ValueError(f"not a dead-letter action: {action!r}")
    doc = _monitor(["DEADLETTERS", action.upper(), *(job_ids or ["ALL"])])
    if "error" in doc:
        raise JobRefused(str(doc["error"]))
    return int(doc.get(action + "d", 0))


def why_not_cancelled(job_id: str) -> str:
    """Why a job the broker did not know (``unknown``) was not cancelled."""
    row = JobResult.objects.filter(pk=job_id).only("status").first()
    if row is not None and row.status not in ("running", "retrying"):
        return f"{job_id} has already finished ({row.status}): nothing to cancel"
    return f"{job_id}: the broker holds no waiting job with this id (running, or gone)"
