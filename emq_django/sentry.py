"""Failed jobs to Sentry: ``connect()`` once (in a worker's settings or AppConfig)
and every failed attempt's exception reaches Sentry, through the ``job_failed``
signal, with the job as tags: ``emq.job_id``, ``emq.attempt``, ``emq.task``,
``emq.queue`` and ``emq.outcome`` (retrying, dead_lettered, failed, cancelled).
An attempt that will be retried is a ``warning``, its last one an ``error``.

Needs ``sentry-sdk``, initialised by the application (``sentry_sdk.init``): emq
sets no DSN. docs/features/observability.md.
"""

from __future__ import annotations

from typing import Any

from emq_django import signals

_UID = "emq_django.sentry"


def report_failure(
    sender: Any,
    *,
    exception: BaseException | None,
    error: str,
    outcome: str,
    job_id: str,
    attempt: int,
    task: str,
    queue: str,
    **kwargs: Any,
) -> None:
    """A ``job_failed`` receiver: the attempt's exception (or its error's name,
    for an attempt failed around the task, e.g. a time limit) to Sentry."""
    import sentry_sdk

    with sentry_sdk.new_scope() as scope:
        scope.set_tag("emq.job_id", job_id)
        scope.set_tag("emq.attempt", str(attempt))
        scope.set_tag("emq.task", task)
        scope.set_tag("emq.queue", queue)
        scope.set_tag("emq.outcome", outcome)
        scope.level = "warning" if outcome == "retrying" else "error"
        if exception is not None:
            sentry_sdk.capture_exception(exception)
        else:
            sentry_sdk.capture_message(f"job {job_id} attempt {attempt} of {task} failed: {error}")


def connect() -> None:
    """Send every failed attempt to Sentry (idempotent)."""
    signals.job_failed.connect(report_failure, dispatch_uid=_UID)


def disconnect() -> None:
    signals.job_failed.disconnect(dispatch_uid=_UID)
