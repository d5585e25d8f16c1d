"""Sending jobs only once the surrounding database transaction has committed.

``add.delay_on_commit(1, 2)``, ``@emq.task(on_commit=True)`` and the Django Tasks
backend's ``on_commit`` option send the job from ``transaction.on_commit``: after
the outermost ``atomic()`` block on the database commits, never if it rolls back,
and at once when no transaction is open. A job therefore never runs before the
rows it reads are visible, and never for data that was rolled back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.db import transaction

from emq_django.exceptions import ResultUnavailable
from emq_django.handles import Result

log = logging.getLogger(__name__)


def in_transaction(using: str | None = None) -> bool:
    return transaction.get_connection(using).in_atomic_block


def on_commit(send: Callable[[], Any], using: str | None = None) -> bool:
    """Call ``send`` when the transaction on ``using`` commits, or now when none is
    open; returns True when it was deferred. An exception ``send`` raises at commit
    time (``BrokerUnavailable``, ...) propagates from the ``atomic()`` block's exit,
    after the data has been committed."""
    if not in_transaction(using):
        send()
        return False
    transaction.on_commit(send, using=using)
    return True


def send_on_commit(
    apply_async: Callable[..., Result],
    task_name: str,
    call: tuple[Any, Any],
    job_id: str | None,
    options: dict[str, Any],
) -> DeferredResult:
    """``Task.apply_async(..., on_commit=True)`` in a transaction: the handle now,
    the job (``apply_async(*call, **options)`` under the handle's id) at commit."""
    import uuid

    deferred = DeferredResult(job_id or uuid.uuid4().hex, task_name, reply=options["reply"])

    def send() -> None:
        deferred.sent = apply_async(*call, job_id=deferred.id, on_commit=False, **options)

    on_commit(send)
    return deferred


class DeferredResult(Result):
    """The handle of a job that is sent when the transaction commits.

    ``.id`` is the job id it will have. ``get()`` raises ``ResultUnavailable``
    until the job has been sent (it never is if the transaction rolls back)."""

    def __init__(self, job_id: str, task_name: str, *, reply: bool = True) -> None:
        super().__init__(job_id, task_name, reply=reply)
        self.sent: Result | None = None

    def __repr__(self) -> str:
        state = "sent" if self.sent is not None else "waiting for the commit"
        return f"<DeferredResult {self.id} of {self.task_name}: {state}>"

    def get(self, timeout: float | None = 30.0) -> Any:
        if self.sent is None:
            raise ResultUnavailable(
                f"job {self.id} ({self.task_name}) is sent when its transaction commits, "
                "and it has not committed (or it rolled back)"
            )
        return self.sent.get(timeout)

    def stream(self, timeout: float | None = 30.0) -> Iterator[Any]:
        if self.sent is None:
            self.get(timeout)  # raises ResultUnavailable
        assert self.sent is not None
        return self.sent.stream(timeout)

    def ready(self) -> bool:
        return self.sent is not None and self.sent.ready()
