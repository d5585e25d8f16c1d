"""The client's view of which broker answers: its incarnation (a fresh one each
time a broker starts), and what a change means: the plain jobs the broker that
is gone had taken are lost (``JobLost``); the guaranteed jobs whose REPLY this
client waits for are sent again, under their ids, to the broker that took over
(restarted on the same journal, or a standby: issue 32's failover).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import zmq

from emq_django import wire
from emq_django.client.connection import Connection
from emq_django.protocol import batch as B

log = logging.getLogger(__name__)

MAX_KEPT_REPLIES = 100_000
_MARK = B.MARK
_monotonic = time.monotonic


class Incarnations(Connection):
    def _check_lost(self, msgid: bytes) -> None:
        """Raise ``JobLost`` if the plain job ``msgid``, sent before the broker's
        incarnation changed, had been acknowledged by then: the broker that took it
        is gone, and its successor never had it (one not acknowledged then may have
        reached the new one, or ``ack_timeout`` says it did not)."""
        from emq_django.exceptions import JobLost

        if msgid not in self._lost and (msgid in self._unacked_at_change or msgid in self._pending):
            return
        raise JobLost(
            JobLost.TYPE,
            f"job {msgid.decode(errors='replace')} was a plain job (not guaranteed) that "
            f"the broker at {self.url} had accepted (or was sent to it), and that broker "
            "has restarted since or another took over (a new incarnation): it kept the job "
            "in memory only, so the job is lost and may or may not have run. Send it again "
            "if it must run; jobs that must survive a broker restart or a failover are sent "
            "with guarantee=True",
        )

    def _ack_from(self, ack_id: bytes) -> None:
        """Our broker's ACK names its incarnation (``B.ack_id``): note a change."""
        incarnation = B.ack_incarnation(ack_id)
        if incarnation is not None and incarnation != self._incarnation:
            self._note_incarnation(incarnation)

    def _note_incarnation(self, incarnation: bytes) -> None:
        """The broker said which incarnation it is. Another than before: the plain
        jobs acknowledged until now are lost (``_check_lost``)."""
        if self._incarnation and incarnation != self._incarnation:
            self._settle()
            self._unacked_at_change = frozenset(self._pending)
            self.broker_changes += 1
            log.warning(
                "the broker at %s restarted or another took over (a new incarnation): the "
                "plain jobs it had accepted are lost, and their get() raises JobLost; the "
                "guaranteed ones awaited go on",
                self.url,
            )
            self._incarnation = incarnation
            self._ack_head = _MARK + incarnation
            self._broker_replaced()
            return
        self._incarnation = incarnation
        self._ack_head = _MARK + incarnation

    def _broker_replaced(self) -> None:
        """Another broker answers now (restarted, or a standby took over): send the
        guaranteed jobs whose REPLY we wait for again under their ids (it restored
        them from its journal, and now knows who waits for them; one it finished
        meanwhile is answered at once).

        With failover, a plain job not acknowledged yet went either to the broker
        that is gone (each connection has its own queue: nothing of it reaches the
        new one), or to the new one, which acknowledges it. At most once: none is
        sent again. Each gets a full ``ack_timeout`` from now; those still without an
        ACK then are lost (``_give_up_lost``: their ``get()`` raises ``JobLost``),
        where they would have made the wait raise ``BrokerUnavailable``."""
        if self._batch is not None:  # a batch under way: its jobs ACKed until now
            self._note_answers(self._batch)
        self._send_claims()
        if self._failover:
            # a connection still open to the broker that is gone (silent, not yet
            # dropped by the heartbeats) took its share of the claims: once it is
            # dropped, they are sent again (``_connection_lost``)
            self._claims_sent = True
            now = _monotonic()
            for msgid in [m for m in self._pending if m not in self._resending]:
                del self._pending[msgid]
                self._pending[msgid] = now  # (to the end: _pending is oldest first)

    def _send_claims(self) -> None:
        """Send the guaranteed jobs whose REPLY we wait for again, under their ids."""
        sock = self._sock
        if sock is not None:
            for frames in self._awaiting.values():
                try:
                    wire.send(sock, frames)
                except zmq.Again:
                    break  # no room now: the next change sends them (get() times out)

    def _connection_lost(self) -> None:
        """With failover, one of the socket's connections was dropped: its broker
        closed it, or went silent (paused, cut off) past the ZMTP heartbeat's
        timeout, perhaps after another broker took over and had been seen. Every
        job unacknowledged now may have gone on it, and nothing of that connection
        reaches another broker: the plain ones still unacknowledged ``ack_timeout``
        after they were sent are lost (``_give_up_lost``), as at a change of
        incarnation, rather than a sign that no broker is available; the waits for a
        guaranteed job's ACK send it again at once, with a full ``ack_timeout`` from
        now (``_connected``), as for a new connection; the replies claimed at the
        last change of broker are claimed again."""
        self._settle()
        pending = self._pending
        resending = self._resending
        kept = [m for m in self._unacked_at_change if m in pending]
        self._unacked_at_change = frozenset(kept).union(m for m in pending if m not in resending)
        self._connected += 1
        if self._claims_sent:  # the claims made at the last change: some may have been on it
            self._claims_sent = False
            self._send_claims()

    def _give_up_lost(self) -> bool:
        """With failover, after a wait for ACKs ran out: the plain jobs that were
        unacknowledged when the broker changed (or a connection was dropped) and
        still are went to a broker that is gone; they are lost (``JobLost``), not a
        sign that the broker serving now is unavailable. Returns whether there were
        any."""
        if not self._failover:
            return False
        if self._watch is not None:
            self._check_handshake()  # a connection dropped meanwhile: its jobs too
        if not self._unacked_at_change:
            return False
        gone = [
            m for m in self._pending if m in self._unacked_at_change and m not in self._resending
        ]
        for msgid in gone:
            del self._pending[msgid]
            self._lost[msgid] = None
        while len(self._lost) > MAX_KEPT_REPLIES:
            self._lost.popitem(last=False)
        if gone:
            log.warning(
                "%d plain jobs sent to the broker at %s before it was replaced were never "
                "acknowledged: lost (at most once), their get() raises JobLost",
                len(gone),
                self.url,
            )
        return bool(gone)

    if TYPE_CHECKING:  # defined by the layer above (inbox.py)

        def _settle(self) -> None: ...

        def _note_answers(self, batch: Any) -> None: ...
