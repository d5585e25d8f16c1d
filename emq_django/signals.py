"""Django signals around every job, each sent in the process where its event happens.

Every signal is sent with these keyword arguments (``sender`` is the ``Task``, or the
task's name when this process has not registered it):

- ``job_id`` (str, without the attempt), ``attempt`` (int, 1 for the first),
  ``task`` (the task's name), ``queue`` (str), ``args`` (list) and ``kwargs``
  (dict; both ``None`` when the body did not decode).

and, per signal:

- ``job_sent`` (the client process, once the job has left; attempt 0):
  nothing more.
- ``job_started`` (the worker process, before the task is called).
- ``job_succeeded``: ``result`` (the value the task returned), ``runtime`` (s).
- ``job_failed`` (every failed attempt): ``exception`` (the exception, or ``None``
  when the attempt was failed around the task: a time limit, a cancel),
  ``error`` (its type's name), ``outcome`` (what comes of it: ``retrying``,
  ``dead_lettered``, ``failed``, ``cancelled``), ``runtime``.
- ``job_retrying`` (after ``job_failed``, when the job's retries allow another
  attempt): ``exception``, ``error``, ``delay`` (what ``emq.Retry`` asked, or
  ``None``: the backoff's).
- ``job_dead_lettered`` (after ``job_failed``, when it was the last attempt of
  a job that goes to the dead letters): ``exception``, ``error``.
- ``partial_sent`` (the worker process, for each streamed value): ``value``,
  ``index`` (1 for the first of the attempt).

A receiver that raises is logged (``emq_django.signals``) and never breaks the job. The
senders check ``signal.receivers`` first: nothing is built when nobody listens.
docs/features/observability.md.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

log = logging.getLogger(__name__)


class JobSignal(Signal):
    """A ``Signal`` that keeps ``worker_listened`` current as receivers come and go,
    so that the worker loop asks one module attribute per job, nothing more."""

    def connect(self, *args: Any, **kwargs: Any) -> None:
        super().connect(*args, **kwargs)
        _recount()

    def disconnect(self, *args: Any, **kwargs: Any) -> bool:
        done = super().disconnect(*args, **kwargs)
        _recount()
        return bool(done)


job_sent = JobSignal()
job_started = JobSignal()
job_succeeded = JobSignal()
job_failed = JobSignal()
job_retrying = JobSignal()
job_dead_lettered = JobSignal()
partial_sent = JobSignal()

WORKER_SIGNALS = (
    job_started,
    job_succeeded,
    job_failed,
    job_retrying,
    job_dead_lettered,
    partial_sent,
)

# Whether a receiver was connected to a worker-side signal (and not disconnected
# since). A weak receiver that was garbage collected still counts until the next
# connect or disconnect: then the worker builds a job's signal fields for nobody.
worker_listened = False


def _recount() -> None:
    global worker_listened
    worker_listened = any(s.receivers for s in WORKER_SIGNALS)


_NAMES = {
    id(job_sent): "job_sent",
    id(job_started): "job_started",
    id(job_succeeded): "job_succeeded",
    id(job_failed): "job_failed",
    id(job_retrying): "job_retrying",
    id(job_dead_lettered): "job_dead_lettered",
    id(partial_sent): "partial_sent",
}


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """``signal.send_robust``: a receiver that raises is logged, never raised."""
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, BaseException):
            log.error(
                "a receiver of emq_django.signals.%s raised: %s: %s (%r)",
                _NAMES.get(id(signal), "?"),
                type(response).__name__,
                response,
                receiver,
                exc_info=response,
                extra=_job_extra(kwargs),
            )


def _job_extra(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.get(k, "") for k in ("job_id", "attempt", "queue", "task")}
