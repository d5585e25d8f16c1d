"""The one exception hierarchy of emq-django."""

from __future__ import annotations

from collections.abc import Sequence


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

    Carries the reason and the raw frames, so that the caller can log and count
    the drop.
    """

    def __init__(self, reason: str, frames: Sequence[bytes] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.frames = list(frames)

    def __str__(self) -> str:
        shown = [bytes(f[:40]) for f in self.frames[:8]]
        return f"{self.reason} (frames: {shown!r})" if self.frames else self.reason


class BrokerUnavailable(EmqError):
    """The broker did not acknowledge in time."""


class QueueFull(EmqError):
    """The broker refused a job because its queue is at its bound."""


class JobRefused(EmqError):
    """The broker refused a job, for the reason given."""


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


class Cancelled(TaskFailed):
    """The job was cancelled (``Client.cancel()``, the monitor's ``CANCEL``): raised
    by its ``get()``. A ``TaskFailed``: a job that was cancelled did not succeed."""

    TYPE = "emq_django.exceptions.Cancelled"


class ResultTimeout(EmqError, TimeoutError):
    """No result arrived within the timeout given to ``Result.get()``."""


class ResultUnavailable(EmqError):
    """The job was sent without ``reply``, so no result will come back."""


class Retry(EmqError):  # noqa: N818 - the name users raise, as in Celery and Dramatiq
    """Raised by a task to ask for another attempt after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        super().__init__(reason or f"retry requested (delay={delay})")
        self.delay = delay
