"""A worker process's soft time limit: ``SIGALRM`` raises ``SoftTimeLimitExceeded``
inside the task that ran past it (the hard limit is its job manager's kill)."""

from __future__ import annotations

import logging
import signal
from typing import Any

from emq_django.exceptions import SoftTimeLimitExceeded
from emq_django.protocol.headers import Headers
from emq_django.protocol.limits import check_seconds
from emq_django.task import SOFT_TIMEOUT_HEADER
from emq_django.worker.execution import (
    CountingSink,
    Outcome,
    current_job,
    execute_counting,
    failure,
)

log = logging.getLogger(__name__)


class SoftLimit:
    """The soft limit armed, for which job; ``on_alarm`` is the SIGALRM handler."""

    def __init__(self) -> None:
        self._armed: tuple[float, bytes] = (0.0, b"")

    def on_alarm(self, signum: int, frame: Any) -> None:
        """SIGALRM, armed by ``execute``: raised inside the task, unless it has
        returned already (then its outcome stands)."""
        soft, msgid = self._armed
        if soft and current_job.get() == msgid:
            raise SoftTimeLimitExceeded(
                f"job {msgid.decode(errors='replace')} ran past its soft time limit of {soft:g} s"
            )

    def execute(self, body: bytes, msgid: bytes, h: Headers, sink: CountingSink) -> Outcome:
        """The job, with its soft time limit armed (``SIGALRM``, ``on_alarm``)."""
        try:
            soft = check_seconds("soft-timeout", float(h.get(SOFT_TIMEOUT_HEADER) or 0))
        except (TypeError, ValueError) as exc:
            log.warning("job %s: bad soft-timeout header: %s", msgid.decode(errors="replace"), exc)
            soft = 0.0  # the hard limit still holds
        self._armed = (soft, msgid)
        if soft:
            signal.setitimer(signal.ITIMER_REAL, soft)
        try:
            return execute_counting(body, msgid, sink)
        except SoftTimeLimitExceeded as exc:  # raised after the task, in our own code
            return failure(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._armed = (0.0, b"")
