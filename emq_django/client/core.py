"""The client: one DEALER socket per process, created lazily, safe across fork
and threads.

Every REQUEST carries a msgid and the broker ACKs it. A guaranteed job waits for
its ACK. Other jobs are pipelined: the client keeps up to ``EMQ_ACK_WINDOW``
unacknowledged messages and checks their ACKs as it goes, as publisher confirms
do, so that a burst of ``delay()`` calls does not pay a round trip each. The very
first message on a socket always waits, so a missing broker is reported at once.

A broker that refuses the socket's handshake (ZAP refusing its CURVE key, or a
CURVE/plain-text mismatch) never answers it, and libzmq never connects it again:
the socket's monitor events (``transport.HandshakeWatch``) say so, and the wait
raises ``HandshakeRefused`` with the reason at once, not ``BrokerUnavailable``
after ``ack_timeout``. No send blocks on such a socket (it may have no connection
left to queue on).
"""

from __future__ import annotations

import logging

from emq_django.client.batches import Batches
from emq_django.exceptions import (
    JobRefused,
)

log = logging.getLogger(__name__)


class Client(Batches):
    """A connection to the broker's frontend (eMQP): see the module's docstring."""

    def cancel(self, job_id: str) -> bool:
        """Cancel a job; True if it was cancelled or is being stopped. A job that
        has not started is removed; a running one has its worker process killed (its
        ``get()`` raises ``Cancelled``). Only a job running on an EventMQ job manager
        cannot be stopped (False; it will not be retried). Asks the broker's monitor
        channel (``EMQ_MONITOR_URL``); raises ``BrokerUnavailable``."""
        import json

        from emq_django.conf import cached_settings
        from emq_django.monitor_client import query

        if not job_id or not job_id.isprintable() or " " in job_id:
            raise ValueError(f"not a job id: {job_id!r}")
        self._sent_before(job_id.encode())
        settings = cached_settings()
        answer = query(settings.MONITOR_URL, b"CANCEL " + job_id.encode(), settings.MONITOR_TIMEOUT)
        if answer.startswith(b"ERROR"):
            raise JobRefused(answer.decode(errors="replace"))
        states = json.loads(answer)
        return job_id in states["cancelled"] or job_id in states.get("stopping", ())

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the broker has answered everything sent so far; raises
        ``BrokerUnavailable``, and ``JobsRefused`` for ``noreply`` jobs it refused."""
        with self._lock:
            if self._sock is not None:
                self._wait_below(1, timeout)
            if self._refused:
                self._raise_refused()

    def _sent_before(self, msgid: bytes) -> None:
        """Make sure the broker has job ``msgid`` if this client sent it (a cancel
        goes by the monitor channel, another connection, and must not overtake
        it): send the buffer, then wait for the job's ACK if it has none yet."""
        with self._lock:
            if self._sock is not None:
                self._flush_buffer()
                self._settle()
                if msgid in self._pending:
                    self._wait_ack(msgid)
