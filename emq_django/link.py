"""A peer's connection to the broker: what every INFORMed peer does the same way.

Our job manager, its worker processes and the scheduler each hold one: a DEALER
that INFORMs on connect, sends HEARTBEAT when it has sent nothing for an
interval, treats any message from the broker as a sign of life, and connects
again (a fresh socket, so a fresh identity, and a fresh INFORM) when the broker
has been silent for ``liveness`` intervals or said KBYE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from emq_django import transport, wire
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import frames as F
from emq_django.protocol.frames import decode
from emq_django.security.keys import FROM_SETTINGS, CurveKeys, resolve
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)


class BrokerLink:
    def __init__(
        self,
        context: zmq.Context[Any],
        url: str,
        queues: tuple[tuple[int, str], ...],
        peer_type: str,
        meta: dict[str, Any],
        *,
        heartbeat_interval: float,
        heartbeat_liveness: int,
        on_connect: Callable[[], None] | None = None,
        identity: Callable[[], bytes] | None = None,
        curve: CurveKeys | None | str = FROM_SETTINGS,
    ) -> None:
        self.context = context
        self.url = url
        self.queues = queues
        self.peer_type = peer_type
        self.meta = meta
        self.interval = heartbeat_interval
        self.silence_limit = heartbeat_interval * heartbeat_liveness
        self.on_connect = on_connect  # e.g. a worker sending its READYs again
        self.sock: zmq.Socket[Any] | None = None
        self.last_recv = self.last_send = 0.0
        self.new_id = IdGenerator()
        self.identity = identity  # a fresh socket identity per connection; None: libzmq's
        self.connections = 0
        self.curve = curve  # CURVE keys; FROM_SETTINGS: EMQ_CURVE_* (security/keys.py)

    def connect(self) -> None:
        """A fresh socket and INFORM (again)."""
        self.close(linger=0)
        self.connections += 1
        curve = resolve(self.curve)
        options = SocketOptions(identity=self.identity() if self.identity else None, curve=curve)
        self.sock = transport.connect(self.context, zmq.DEALER, self.url, options)
        self.last_recv = time.monotonic()
        self.send(F.Inform(self.new_id(), self.queues, self.peer_type, self.meta).encode())
        if self.on_connect is not None:
            self.on_connect()

    def send(self, frames: list[bytes], nonblocking: bool = False) -> None:
        """Send one message; with ``nonblocking``, raises ``zmq.Again`` when it
        cannot be queued now."""
        assert self.sock is not None, "connect() first"
        wire.send(self.sock, frames, nonblocking=nonblocking)
        self.last_send = time.monotonic()

    def poll(self, timeout: float) -> bool:
        assert self.sock is not None
        return bool(self.sock.poll(max(int(timeout * 1000), 0) + 1))

    def messages(self) -> Iterator[F.Command]:
        """The commands waiting now, decoded; malformed ones are logged and dropped.
        Stops early when the caller connects again (the old socket is gone)."""
        sock = self.sock
        while sock is not None and sock is self.sock and wire.readable(sock):
            frames = wire.recv(sock)
            self.last_recv = time.monotonic()
            try:
                yield decode(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed message from the broker at %s: %s", self.url, exc)

    def tick(self) -> bool:
        """Heartbeat if due, connect again if the broker went silent. Returns True
        when it connected again."""
        now = time.monotonic()
        if now - self.last_recv > self.silence_limit:
            log.info(
                "broker at %s silent for %.1f s; connecting again", self.url, now - self.last_recv
            )
            self.connect()
            return True
        if now - self.last_send >= self.interval:
            self.send(F.encode_heartbeat(self.new_id(), time.time()))
        return False

    def goodbye(self, wait: float) -> Iterator[F.Command]:
        """DISCONNECT, then the commands that arrive until the broker's KBYE (or
        ``wait`` seconds): work it had already sent must still be done."""
        self.send(F.encode_disconnect(self.new_id()))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.poll(0.1):
            for cmd in self.messages():
                if type(cmd) is F.Kbye:
                    return
                yield cmd

    def close(self, linger: int = 0) -> None:
        if self.sock is not None:
            self.sock.close(linger=linger)
        self.sock = None
