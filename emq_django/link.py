"""A peer's connection to the broker: what every INFORMed peer does the same way.

Our job manager, its worker processes and the scheduler each hold one: a DEALER
that INFORMs on connect, sends HEARTBEAT when it has sent nothing for an
interval, treats any message from the broker as a sign of life, and connects
again (a fresh socket, so a fresh identity, and a fresh INFORM) when the broker
has been silent for ``liveness`` intervals or said KBYE.

With a failover list (``EMQ_WORKER_URL=tcp://a:47290,tcp://b:47290``: only the
active broker binds) the socket connects to every address (``transport``:
ZMQ_IMMEDIATE, ZMTP heartbeats that drop a paused broker's connection); when it
connects again, perhaps to another broker that does not know this peer, the link
takes a fresh socket and INFORMs again at once (``moved``), without waiting for
``liveness`` silent intervals. The INFORM of a worker process names the answers
it sent last and sends them again, so that the outcome of a job that ran across
a failover reaches the new broker (which restored the job from its journal).

A broker that refuses the link's handshake (its CURVE key, or a CURVE/plain-text
mismatch) never answers on that socket, and libzmq does not connect it again:
``poll()``, ``send()`` and ``tick()`` raise ``HandshakeRefused`` with the reason
as soon as libzmq reports it (``transport.HandshakeWatch``), and the owner decides
(a job manager logs it and exits, ``worker/jobmanager.py``).
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
from emq_django.transport import HandshakeWatch, SocketOptions

log = logging.getLogger(__name__)

# The exit code of a job manager, worker process or scheduler whose handshake the
# broker refused (EX_CONFIG in sysexits.h): a configuration fault (the key is not
# registered with the port's role, or the wrong server key) that no retry inside
# the process mends. A supervisor restarts it on failure (systemd Restart=on-failure,
# Docker's restart policies, supervisord up to startretries), each start a fresh
# handshake; systemd's RestartPreventExitStatus=78 stops that instead.
REFUSED_EXIT = 78


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
        more_meta: Callable[[], dict[str, Any]] | None = None,
        identity: Callable[[], bytes] | None = None,
        report: Callable[[], bytes] | None = None,
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
        self.more_meta = more_meta  # what each INFORM adds to ``meta`` (computed then)
        # a HEARTBEAT's sixth frame when it gives one (worker/memory.py), else b""
        self.report = report
        self.sock: zmq.Socket[Any] | None = None
        self.watch: HandshakeWatch | None = None  # the socket's handshakes
        self.last_recv = self.last_send = 0.0
        self.new_id = IdGenerator()
        self.identity = identity  # a fresh socket identity per connection; None: libzmq's
        self.connections = 0
        self.informed = False  # the INFORM went on this socket
        # several brokers (a failover list): a new connection means INFORM again
        self.failover = transport.is_failover(url)
        self.curve = curve  # CURVE keys; FROM_SETTINGS: EMQ_CURVE_* (security/keys.py)

    def connect(self) -> None:
        """A fresh socket and INFORM (again)."""
        self.close(linger=0)
        self.connections += 1
        curve = resolve(self.curve)
        options = SocketOptions(identity=self.identity() if self.identity else None, curve=curve)
        # the role the port admits, for a refusal's message: the peer type's
        self.sock, self.watch = transport.connect_watched(
            self.context, zmq.DEALER, self.url, options, role=self.peer_type
        )
        self.last_recv = time.monotonic()
        self.informed = False
        if not self.failover:
            self._inform()  # (queued until the broker is there)
        else:
            # nothing is queued for a broker not connected yet (ZMQ_IMMEDIATE): the
            # INFORM goes once a broker of the list is (``moved``), never blocking
            self.moved()

    def _inform(self) -> None:
        self.informed = True
        meta = {**self.meta, **self.more_meta()} if self.more_meta is not None else self.meta
        self.send(F.Inform(self.new_id(), self.queues, self.peer_type, meta).encode())
        if self.on_connect is not None:
            self.on_connect()

    def send(self, frames: list[bytes], nonblocking: bool = False) -> None:
        """Send one message; with ``nonblocking``, raises ``zmq.Again`` when it
        cannot be queued now."""
        assert self.sock is not None and self.watch is not None, "connect() first"
        if nonblocking:
            wire.send(self.sock, frames)
        else:  # waits while the socket cannot take it, never on a refused one
            self.watch.send(self.sock, frames)
        self.last_send = time.monotonic()

    def poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a message; True when one waits. Until a
        handshake has succeeded the watch is polled too: raises ``HandshakeRefused``."""
        sock, watch = self.sock, self.watch
        assert sock is not None and watch is not None
        ms = max(int(timeout * 1000), 0) + 1
        if watch.succeeded and not self.failover:
            return bool(sock.poll(ms))
        ready = dict(zmq.zmq_poll([(sock, zmq.POLLIN), (watch.pair, zmq.POLLIN)], ms))
        if watch.pair in ready:
            watch.check()
            if self.moved():
                return bool(self.sock is not None and wire.readable(self.sock))
        return sock in ready

    def moved(self) -> bool:
        """With a failover list: True when the socket had connected again (another
        broker, perhaps, which does not know this peer) and the link has connected
        afresh (``connect``: a new socket, INFORM, ``on_connect``). Never blocks."""
        watch = self.watch
        if not self.failover or watch is None:
            return False
        watch.check()
        if not self.informed:
            if watch.handshakes:  # the first broker of the list this socket reached
                self._inform()
            return False
        if watch.handshakes <= 1:
            return False
        log.info("connected again to a broker of %s; INFORMing it", self.url)
        self.connect()
        return True

    def check_handshake(self) -> None:
        """Raise ``HandshakeRefused`` if the broker refused the socket's handshake."""
        if self.watch is not None:
            self.watch.check()

    def messages(self) -> Iterator[F.Command]:
        """The commands waiting now, decoded; malformed ones are logged and dropped.
        Stops early when the caller connects again (the old socket is gone)."""
        sock = self.sock
        while sock is not None and sock is self.sock and wire.readable(sock):
            frames = wire.recv(sock)
            self.last_recv = time.monotonic()
            # several jobs in one REQUEST (the "batch" extension): one by one
            batch = F.split_batch(frames) if len(frames) > 7 else None
            for one in batch or (frames,):
                try:
                    yield decode(one)
                except ProtocolError as exc:
                    log.warning(
                        "dropped a malformed message from the broker at %s: %s", self.url, exc
                    )

    def tick(self) -> bool:
        """Heartbeat if due, connect again if the broker went silent. Returns True
        when it connected again."""
        if self.failover and self.moved():
            return True
        now = time.monotonic()
        if now - self.last_recv > self.interval:
            self.check_handshake()  # silent: did it refuse us? (it says nothing then)
        if now - self.last_recv > self.silence_limit and not self._waiting():
            log.info(
                "broker at %s silent for %.1f s; connecting again", self.url, now - self.last_recv
            )
            self.connect()
            return True
        if now - self.last_send >= self.interval and self.informed:
            extra = self.report() if self.report is not None else b""
            self.send(F.encode_heartbeat(self.new_id(), time.time(), extra))
        return False

    def _waiting(self) -> bool:
        """Messages wait in the socket: the broker spoke while we were busy (a long
        job) and is not silent; connecting again would drop them (jobs sent ahead to
        a worker process among them). Counts as hearing from it."""
        if self.sock is None or not wire.readable(self.sock):
            return False
        self.last_recv = time.monotonic()
        return True

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
        if self.watch is not None:  # first: HandshakeWatch.close
            self.watch.close()
        self.watch = None
        if self.sock is not None:
            self.sock.close(linger=linger)
        self.sock = None
