"""What one publisher socket sent that the broker has not confirmed yet.

``emq.publish`` and ``emq.publish_many`` send confirmed publish batches
(``protocol/eventbus.py``): each has an id, increasing per socket, and the broker
answers once a loop turn has numbered its events and written them to the journal
(``PUBOK``: every batch up to an id; ``PUBNO``: batches refused, with the reason).
The batches are pipelined: a publisher waits only when more than ``WINDOW_EVENTS``
events (or ``WINDOW_BATCHES`` batches) are unconfirmed, and raises
``PublishUnconfirmed`` when no confirmation comes within its time-out. Refusals are
raised by the next publish (or ``wait``) of the thread that sent them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import zmq

from emq_django import wire
from emq_django.exceptions import ProtocolError, PublishUnconfirmed
from emq_django.protocol import eventbus

log = logging.getLogger(__name__)

WINDOW_EVENTS = 50_000  # unconfirmed events a publisher may have before it waits
WINDOW_BATCHES = 5_000  # unconfirmed batches (emq.publish: one event each)


class Unconfirmed:
    """The batches one socket sent and the broker has not answered, oldest first."""

    def __init__(self) -> None:
        self.batches: deque[tuple[int, int]] = deque()  # (batch id, events)
        self.events = 0  # events in them
        self.last_id = 0
        self.refused = 0  # events refused since last raised
        self.reason = ""  # the last refusal's

    def sent(self, events: int) -> int:
        """A batch of ``events`` is about to leave: its id."""
        self.last_id += 1
        self.batches.append((self.last_id, events))
        self.events += events
        return self.last_id

    def unsent(self, events: int) -> None:
        """The batch ``sent`` announced did not leave."""
        self.batches.pop()
        self.events -= events

    def full(self) -> bool:
        return self.events > WINDOW_EVENTS or len(self.batches) > WINDOW_BATCHES

    def read(self, sock: zmq.Socket[Any]) -> None:
        """Take the answers waiting on ``sock`` (never blocks)."""
        while True:
            try:
                frames = wire.recv(sock)
            except zmq.Again:
                return
            try:
                answer = eventbus.decode_confirmation(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed answer on the collector: %s", exc)
                continue
            self._answered(answer)

    def _answered(self, answer: eventbus.Confirmation) -> None:
        batches = self.batches
        while batches and batches[0][0] <= answer.last:
            batch_id, events = batches.popleft()
            self.events -= events
            if not answer.ok and batch_id >= answer.first:
                self.refused += events
                self.reason = answer.reason

    def raise_refused(self) -> None:
        """Raises ``PublishUnconfirmed`` for the events the broker refused since the
        last call."""
        if self.refused:
            refused, self.refused = self.refused, 0
            raise PublishUnconfirmed(refused, f"the broker refused them: {self.reason}")

    def wait(self, sock: zmq.Socket[Any], most: int, timeout: float) -> None:
        """Read answers until at most ``most`` events are unconfirmed. Raises
        ``PublishUnconfirmed`` for refused events, or when ``timeout`` seconds pass
        first (naming how many are still unconfirmed)."""
        deadline = time.monotonic() + timeout
        self.read(sock)
        while self.events > most:
            left = deadline - time.monotonic()
            if left <= 0:
                self.raise_refused()
                raise PublishUnconfirmed(
                    self.events,
                    f"no confirmation within {timeout:g} s (EMQ_BUS_CONFIRM_TIMEOUT): "
                    "the broker is down, paused or overloaded",
                )
            if sock.poll(max(int(left * 1000), 1), zmq.POLLIN):
                self.read(sock)
        self.raise_refused()
