"""The one exception hierarchy of emq-django."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def type_name(exc: BaseException) -> str:
    """How a remote error is named: ``ValueError`` for builtins, else ``pkg.mod.Error``."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class EmqError(Exception):
    """Base class of every error raised by emq-django."""


class ProtocolError(EmqError):
    """A message that does not follow the protocol.

    Carries the reason, the raw frames and a short ``code`` naming the kind of
    fault (``bad-header``, ``queue-name-too-long``, ...; see
    ``emq_django.protocol.limits``), so that the broker can answer the sender with
    an ERROR and count refusals by reason.
    """

    def __init__(self, reason: str, frames: Sequence[bytes] = (), code: str = "malformed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.frames = list(frames)
        self.code = code

    def __str__(self) -> str:
        shown = [bytes(f[:40]) for f in self.frames[:8]]
        return f"{self.reason} (frames: {shown!r})" if self.frames else self.reason


class BrokerUnavailable(EmqError):
    """The broker did not acknowledge in time."""


class HandshakeRefused(BrokerUnavailable):
    """The broker refused this process's connection in the ZeroMQ handshake, so it
    will never answer on it: ZAP refused its CURVE key (``kind`` ``auth``, ``code``
    the ZAP status: 400 refused, 500 the broker's key handler failed), one side
    speaks CURVE and the other plain text (``protocol``, ``code`` libzmq's ZMTP
    error), or the handshake failed again and again without a reason (``no-detail``:
    most likely ``EMQ_CURVE_SERVER_KEY`` is not the broker's public key). Raised as
    soon as libzmq reports it, not after a time-out; a ``BrokerUnavailable``, so code
    that handles an unreachable broker handles this too."""

    def __init__(self, message: str, url: str = "", kind: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.url = url
        self.kind = kind
        self.code = code


class BatchUnacknowledged(BrokerUnavailable):
    """``map()`` gave up waiting for the broker's ACKs (it crashed, or is away).

    ``job_ids`` are exactly the jobs that may not have arrived (sent but not
    acknowledged, or not sent yet); every other job of the batch was acknowledged.
    ``results`` are the handles of the whole batch, in order, under the ids the
    jobs were sent with. ``resend()`` sends the unacknowledged jobs again under
    the same ids (the broker drops the ones it already has, so nothing runs twice
    for it) and returns ``results``; it raises ``BatchUnacknowledged`` again, with
    the jobs still unacknowledged, if the broker is still away.
    """

    def __init__(
        self,
        message: str,
        job_ids: Sequence[str],
        results: Sequence[Any] = (),
        resend: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.job_ids = list(job_ids)
        self.results = list(results)
        self._resend = resend

    def resend(self) -> Any:
        if self._resend is None:
            raise RuntimeError("this batch cannot be resent from here")
        return self._resend()


class QueueFull(EmqError):
    """The broker refused a job because its queue is at its bound."""


class JobRefused(EmqError):
    """The broker refused a job, for the reason given."""


class DuplicateJob(JobRefused):
    """Not an error the caller sees: the broker holds the job's unique key for the
    job ``existing_id`` (the unique jobs' client turns it into that job's handle)."""

    def __init__(self, existing_id: str) -> None:
        super().__init__(f"duplicate of {existing_id}")
        self.existing_id = existing_id


class JobsRefused(JobRefused):
    """The broker refused jobs sent without ``reply`` (nobody reads their ``get()``):
    raised by the client's next ``delay()``, ``apply_async()``, ``map()`` or
    ``flush()``, whose own job, if any, was not sent. ``job_ids`` names the jobs
    refused (the first ``MAX_NAMED``; ``count`` is all of them), ``codes`` the
    broker's ERROR codes (``queue-full``: the queue is at ``EMQ_MAX_PENDING``)."""

    MAX_NAMED = 1000

    def __init__(
        self, refusals: list[tuple[str, str, str]], count: int, not_sent: bool = False
    ) -> None:
        self.refusals = refusals  # (job id, code, reason)
        self.count = count
        self.job_ids = [job_id for job_id, _, _ in refusals]
        self.codes = {code for _, code, _ in refusals}
        job_id, code, reason = refusals[0]
        text = (
            f"the broker refused {count} jobs sent without reply, first {job_id} ({code}: "
            f"{reason}); send them again later (the ids are in .job_ids)"
        )
        if not_sent:
            text += "; this call's job was not sent: call again"
        super().__init__(text)


class TaskNotFound(EmqError):
    """A message named a task that is not registered with ``@emq.task``."""


class TaskFailed(EmqError):
    """A task raised on the job manager; carries the remote error."""

    def __init__(self, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type = type_name
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        text = f"{self.type}: {self.message}"
        if self.traceback:
            text += "\n\nRemote traceback:\n" + self.traceback
        return text

    @staticmethod
    def from_remote(type_name: str, message: str, traceback: str = "") -> TaskFailed:
        """The error a failed job's ``get()`` raises: ``Cancelled``, ``WorkerLost`` or
        ``JobLost`` when the remote type names one of them, else ``TaskFailed``."""
        cls = _REMOTE_FAILURES.get(type_name, TaskFailed)
        return cls(type_name, message, traceback)


class Cancelled(TaskFailed):
    """The job was cancelled (``Client.cancel()``, the monitor's ``CANCEL``): raised
    by its ``get()``. A ``TaskFailed``: a job that was cancelled did not succeed."""

    TYPE = "emq_django.exceptions.Cancelled"


class JobLost(TaskFailed):
    """A plain job (not guaranteed) that the broker had accepted is gone with it: the
    client, connected again, found a broker that restarted (a new incarnation),
    which keeps no plain job of the one before, or (``EMQ_BROKER_URL`` listing
    several brokers) another broker that took over. Raised by its ``get()`` at once;
    a plain job that the broker that is gone had not acknowledged yet, once a full
    ``EMQ_ACK_TIMEOUT`` brought no ACK from the new one either. It may or may not
    have run, and is never sent again (at most once); send jobs that must survive a
    broker restart or a failover with ``guarantee=True``: those are sent again under
    their ids, and their ``get()`` returns their value."""

    TYPE = "emq_django.exceptions.JobLost"


class WorkerLost(TaskFailed):
    """The worker process running the job died mid-job (killed, crashed, out of
    memory), or the job manager that ran it went away: the attempt has failed
    (the job ran, its answer may be lost). It counts against ``retries``; a job that
    keeps killing its worker ends in the dead letters. Raised by its ``get()``."""

    TYPE = "emq_django.exceptions.WorkerLost"


_REMOTE_FAILURES: dict[str, type[TaskFailed]] = {
    cls.TYPE: cls for cls in (Cancelled, JobLost, WorkerLost)
}


class ResultTimeout(EmqError, TimeoutError):
    """No result arrived within the timeout given to ``Result.get()``."""


class PartialsLost(EmqError):
    """``Result.stream()`` found partial results missing: dropped over the client's
    bounds (a stream read too slowly, or too many jobs nobody streamed), or by a
    worker whose broker took none for a second. ``get()`` still gives the result."""


class ResultUnavailable(EmqError):
    """The job was sent without ``reply``, so no result will come back."""


class Retry(EmqError):  # noqa: N818 - the name users raise, as in Celery and Dramatiq
    """Raised by a task to ask for another attempt after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or f"retry requested (delay={delay})")
        self.delay = delay


class SoftTimeLimitExceeded(EmqError):  # noqa: N818 - Celery's name, which users know
    """Raised inside a task that runs past its ``soft_timeout``, so that it can clean
    up (catch it, tidy, re-raise or return); its hard ``timeout`` still kills."""

    TYPE = "emq_django.exceptions.SoftTimeLimitExceeded"


class PublishUnconfirmed(EmqError):
    """Events ``emq.publish`` / ``emq.publish_many`` sent that the broker did not
    confirm (numbered and kept): it refused them (``reason``), or no confirmation
    came in time (the broker down, paused or overloaded). ``count``: how many
    events. They may be lost: publish them again if they must arrive (a subscriber
    tells a repeated event by its UUID)."""

    def __init__(self, count: int, reason: str) -> None:
        super().__init__(f"{count} published events not confirmed by the broker: {reason}")
        self.count = count
        self.reason = reason


class EventsExpired(EmqError):
    """A subscriber asked for events that retention (``EMQ_TOPIC_RETENTION``) had
    deleted: events numbered ``first`` .. ``last`` of a retention rule covering its
    prefixes are gone (some may have been on other topics of that rule). The
    subscription goes on after ``last``: read on to get the next events."""

    def __init__(self, first: int, last: int) -> None:
        super().__init__(
            f"events {first}..{last} expired (EMQ_TOPIC_RETENTION) before this subscriber "
            f"read them; it goes on from {last + 1}"
        )
        self.first = first
        self.last = last


class JournalError(EmqError):
    """The broker's journal could not be opened or written (a full disk, a broken
    file, a database that refuses): guaranteed jobs must not vanish silently."""


class LeaseLost(JournalError):
    """This broker's lease of a shared PostgreSQL journal was taken by another broker
    (a higher epoch): its journal writes are refused (fencing), so it can no longer
    acknowledge guaranteed work, and it must step down to standby."""


class CronError(EmqError, ValueError):
    """A cron expression that cannot be parsed, or that never fires (a ``ValueError``
    too, as every bad timing is)."""
