"""A worker process's partial results (streaming.py) as PARTIAL frames to the
broker, sent without blocking while the socket has room."""

from __future__ import annotations

import logging

import zmq

from emq_django import otel, signals
from emq_django.link import BrokerLink
from emq_django.protocol import frames as F
from emq_django.worker import observing

log = logging.getLogger(__name__)

# A PARTIAL the socket cannot queue now (the broker is not reading) waits this long
# for room, then is dropped (and logged): a stream must not hang its task.
PARTIAL_SEND_WAIT = 1.0


class PartialOut:
    """The PARTIALs of one worker process, on its link to the broker."""

    __slots__ = ("link", "dropped")

    def __init__(self, link: BrokerLink) -> None:
        self.link = link
        self.dropped = 0  # PARTIALs the socket had no room for

    def send(self, attempt_id: bytes, body: bytes, seq: int) -> None:
        """PARTIAL to the broker now, without blocking while the socket has room."""
        frames = F.Partial(self.link.new_id(), body, attempt_id, seq).encode()
        try:
            self.link.send(frames, nonblocking=True)
            return
        except zmq.Again:
            pass
        sock = self.link.sock
        if sock is not None and sock.poll(int(PARTIAL_SEND_WAIT * 1000), zmq.POLLOUT):
            try:
                self.link.send(frames, nonblocking=True)
                return
            except zmq.Again:
                pass
        self.dropped += 1
        log.warning(
            "job %s: dropped a partial result: the broker took none for %g s (%d dropped)",
            attempt_id.decode(errors="replace"),
            PARTIAL_SEND_WAIT,
            self.dropped,
        )


class PartialSender:
    """The sink of one attempt's partial results (streaming.py): PARTIAL frames."""

    __slots__ = ("out", "attempt_id", "count")

    def __init__(self, out: PartialOut, attempt_id: bytes) -> None:
        self.out = out
        self.attempt_id = attempt_id
        self.count = 0  # partials sent: the last one's sequence number

    def __call__(self, body: bytes) -> None:
        self.count += 1
        self.out.send(self.attempt_id, body, self.count)
        if signals.partial_sent.receivers or otel.api._TRACER_PROVIDER is not None:
            observing.partial(self.attempt_id, body, self.count)
