"""The client's connection: its socket, made through ``transport`` (CURVE, the
handshake watch), polls and sends that never block for ever, and the errors
that say the broker is unavailable or refused the handshake.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from emq_django import transport, wire
from emq_django.client.state import ClientState
from emq_django.exceptions import (
    BrokerUnavailable,
    HandshakeRefused,
)
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.security.keys import resolve
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

# The backend's calls with plain int flags (emq_django/wire.py says why); the
# REQUEST path below unrolls its seven frames onto them.
_send = wire._send
_recv = wire._recv
_SNDMORE = wire.SNDMORE
_NOBLOCK = wire.NOBLOCK
_MORE_NOBLOCK = _SNDMORE | _NOBLOCK
_POLLIN = wire._POLLIN
_ACK_ID_LENGTH = B.ACK_ID_LENGTH  # the msgid of our broker's ACK, naming its incarnation
_monotonic = time.monotonic
_PROTOCOL = F.PROTOCOL
_encode_request = F.encode_request
_ACK = F.ACK
_REPLY = F.REPLY
_MAX_ID = F.MAX_ID_LENGTH


class Connection(ClientState):
    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            context = self._context or zmq.Context.instance()
            # no high-water marks: the ACK window bounds what is queued
            curve = resolve(self.curve)
            options = SocketOptions(linger=1000, sndhwm=0, rcvhwm=0, curve=curve)
            self._sock, self._watch = transport.connect_watched(
                context, zmq.DEALER, self.url, options, role="client"
            )
            self._handshakes = self._disconnects = 0
        return self._sock

    def _reset(self) -> None:
        self._close_watch()  # (first: HandshakeWatch.close)
        if self._sock is not None:
            self._sock.close(linger=0)  # drop what was queued: the caller was told it failed
        self._sock = None
        self._pending.clear()
        self._sent.clear()
        self._resending.clear()
        self._sent_jobs = 0
        self._confirmed = False
        self._drain_at = 0
        self._buf = []  # never sent: the caller is told the broker is unavailable
        self._buf_jobs = self._buf_bytes = 0

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._flush_buffer()
                except BrokerUnavailable:
                    log.warning("closed with jobs unsent: the broker took nothing")
                self._close_watch()  # (first: HandshakeWatch.close)
                self._sock.close()
            self._sock = None
            flusher, self._flusher = self._flusher, None
            if flusher is not None:
                flusher.wake.set()  # it sees it is no longer this client's, and ends

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._watch = None

    # ---- handshakes ---------------------------------------------------------

    def _check_handshake(self) -> None:
        """Raise ``HandshakeRefused`` (the socket reset: the next call makes a fresh
        one) when the watch says the broker refused this socket's handshake."""
        watch = self._watch
        if watch is None:
            return
        try:
            watch.check()
        except HandshakeRefused:
            self._reset()
            raise
        if watch.handshakes > max(self._handshakes, 1) and self._sock is not None:
            # connected again: the same broker? (the first connection's says so in
            # its ACKs; a client waiting for a result sends nothing to be ACKed)
            self._ask_incarnation(self._sock)
            self._connected += 1  # the waits for an ACK send their job again now
        self._handshakes = watch.handshakes
        if watch.disconnects != self._disconnects:  # (counted with failover only)
            self._disconnects = watch.disconnects
            self._connection_lost()

    def _poll(self, sock: zmq.Socket[Any], timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a message on ``sock``; True when one waits.
        Until the broker has answered once, the handshake watch is polled too: a
        refused handshake raises ``HandshakeRefused`` as soon as libzmq reports it.
        With failover, always: a new connection (another broker) is seen at once."""
        watch = self._watch
        if watch is None or (self._confirmed and not self._failover):
            return bool(_zmq_poll([(sock, _POLLIN)], timeout_ms))
        ready = _zmq_poll([(sock, _POLLIN), (watch.pair, _POLLIN)], timeout_ms)
        # (a send that waited for room may have read the watch's events itself)
        if (ready and ready[-1][0] is watch.pair) or watch.handshakes != self._handshakes:
            self._check_handshake()
        return bool(ready) and ready[0][0] is sock

    def _send_frames(self, sock: zmq.Socket[Any], frames: list[bytes]) -> None:
        """Send one message, never blocking for ever on a socket the broker refused:
        raises ``HandshakeRefused`` then, and ``BrokerUnavailable`` when the socket
        takes nothing for ``ack_timeout``."""
        try:
            wire.send(sock, frames)
        except zmq.Again:
            self._send_blocked(sock, frames)

    def _send_blocked(self, sock: zmq.Socket[Any], frames: list[bytes]) -> None:
        """The socket took nothing now: wait for room, or for the watch to say why."""
        watch = self._watch
        assert watch is not None  # made with the socket
        try:
            sent = watch.send(sock, frames, int(self.ack_timeout * 1000))
        except HandshakeRefused:
            self._reset()
            raise
        if not sent:
            self._unavailable()

    def _ask_incarnation(self, sock: zmq.Socket[Any]) -> None:
        """Ask the broker for its incarnation (a HEARTBEAT, which it answers with one
        naming it): on each new connection."""
        try:
            wire.send(sock, F.encode_heartbeat(self._ids(), time.time()))
        except zmq.Again:
            pass  # full: the next connection asks again, or ACK timeouts say more

    def _unavailable(self) -> None:
        self._check_handshake()  # a refusal says why better than the time-out
        count = self._unacked()
        self._reset()
        raise BrokerUnavailable(
            f"the broker at {self.url} did not acknowledge within {self.ack_timeout:g} s "
            f"({count} message(s) unacknowledged); is `manage.py emq_broker` running there?"
        )

    if TYPE_CHECKING:  # defined by the layer above (incarnations.py)

        def _connection_lost(self) -> None: ...
