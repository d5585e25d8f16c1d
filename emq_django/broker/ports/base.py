"""What every port is: a codec and an adapter between one wire and the core.

A port decodes the messages its socket receives (``handle``) into calls on
``BrokerCore``, and owns its output: the server hands it each of the core's
effects (``post``) and the port turns them into frames (``encode``) and sends
them through its ``Outlet`` (the server's one send path, with its one error
policy), now or later: an outbox with its own batching and acknowledgement
state, emptied at the end of each batch of effects (``flush``). It touches no
socket: the server owns them, binding one per port with the options
``socket_options`` gives.

A port that needs several sockets (PZQ: producers, consumers, monitor) says so
with ``socket_specs`` (a name, a zmq kind, an address and options each); the
server then reads each socket through ``handler_for(name)``, and such a port
posts through ``post_routed``: ``encode_routed`` names the socket and gives the
whole message (identity included on a ROUTER).

A port with timers of its own (mc0: heartbeats and evictions per session) says
when with ``next_timer``; the server's poll loop wakes up then and sends what
``on_timer`` returns, in the same (socket name, whole message) form.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import zmq

from emq_django.broker.effects import Effect
from emq_django.broker.seam import Handler
from emq_django.broker.state import Peer, show_identity
from emq_django.broker.topics import Event
from emq_django.exceptions import ProtocolError
from emq_django.transport import SocketOptions

if TYPE_CHECKING:
    from emq_django.broker.core import BrokerCore

log = logging.getLogger(__name__)

ERROR_LOG_BUDGET = 100  # malformed messages logged per port, then every 10,000th

# what a paced send (``Port.pump``) returns: the message left, the peer's pipe is
# full (nothing of it left: try again later), or the peer is gone
SENT, FULL, GONE = 0, 1, 2
# a paced send: (socket spec name, whole frames, the identity first on a ROUTER)
PacedSend = Callable[[str, "list[bytes]"], int]


class Outlet(Protocol):
    """How a port sends: the server's one send path, never blocking. A peer that is
    not reading loses the message (counted as a dropped send); an unroutable one is
    reported to the port (``Port.unroutable``)."""

    def to_peer(self, identity: bytes, frames: list[bytes]) -> bool:
        """``frames`` to ``identity`` on the port's first socket; False: it is gone."""
        ...

    def to_socket(self, name: str, frames: list[bytes]) -> int:
        """The whole message on the socket named ``name`` (the identity first on a
        ROUTER): ``SENT``, ``FULL`` (nothing of it left) or ``GONE``; the caller
        decides what a full pipe or a gone peer means."""
        ...

    def clock(self) -> float:
        """The server's clock now."""
        ...


class _Unattached:
    """The outlet of a port no server runs (unit tests of its codec): sends fail."""

    def to_peer(self, identity: bytes, frames: list[bytes]) -> bool:
        raise RuntimeError("this port is not attached to a server")

    def to_socket(self, name: str, frames: list[bytes]) -> int:
        raise RuntimeError("this port is not attached to a server")

    def clock(self) -> float:
        raise RuntimeError("this port is not attached to a server")


NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class SocketSpec:
    """One socket a port owns. On a ROUTER the server passes the first frame as the
    identity; on any other kind the identity is ``b""`` and the frames are whole."""

    name: str
    kind: int
    address: str
    options: SocketOptions
    # the roles a key needs to connect (the socket's ZAP domain, security/zap.py);
    # empty: any enabled key
    roles: tuple[str, ...] = ()


class Port(ABC):
    """One protocol on one socket. ``name`` shows in logs and counters."""

    name = "port"
    # its clients get partial results whatever their request said (Majordomo)
    always_streams = False
    # its wire has an ACK for an accepted request: else the core makes no
    # Acknowledge effect for its clients (one object and one encode per job saved)
    acknowledges = True
    # the roles admitted on the port's socket (when the broker runs CURVE)
    roles: tuple[str, ...] = ()
    # its sockets (spec names) that bring events into the topic space: the server
    # reads them after the others in each round, since a round takes at most
    # TURN_EVENTS events and a socket read after that reads nothing (a flood of
    # events read first starved the job and monitor sockets for its whole length)
    event_sockets: tuple[str, ...] = ()
    # jobs beyond one per message that the messages read in this drain carried
    # (eMQP REQUESTS): the server counts them towards its per-socket CHUNK
    carried = 0
    # the class has a per-command rule (it overrides ``authorize``); set for each
    # subclass, so that the guard skips the call for one that has none
    authorizes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.authorizes = cls.authorize is not Port.authorize

    def __init__(self, core: BrokerCore, address: str = "") -> None:
        self.core = core
        self.address = address
        self._error_log_budget = ERROR_LOG_BUDGET
        self.outlet: Outlet = _Unattached()
        self.to_peer = self.outlet.to_peer  # the hot path's send, looked up once
        # the server's status document (for ports that show it: monitor, PZQ)
        self.status: Callable[[], dict[str, Any]] | None = None

    def attach(self, outlet: Outlet, status: Callable[[], dict[str, Any]]) -> None:
        """The server runs this port: it sends through ``outlet``; ``status`` gives
        the broker's status document."""
        self.outlet = outlet
        self.to_peer = outlet.to_peer
        self.status = status

    # ---- out: the port's outbox ------------------------------------------------------

    def post(self, to: Any, effect: Effect) -> None:
        """One of the core's effects for ``to`` (its ``ClientRef`` or ``Peer``, of
        this port): send what it means on this wire now, or hold it to go with
        others (then ``flush`` sends it). The hot path: one call per effect."""
        frames = self.encode(effect)
        if frames is not None:
            self.to_peer(to.identity, frames)

    def post_routed(self, to: Any, effect: Effect) -> None:
        """``post`` for a port with several sockets: ``encode_routed`` names the
        socket; a full pipe is the port's ``unsent``."""
        routed = self.encode_routed(effect)
        if routed is None:
            return
        name, frames = routed
        sent = self.outlet.to_socket(name, frames)
        if sent == FULL:
            self.unsent(effect, self.outlet.clock())
        elif sent == GONE:
            self.unroutable(frames[0], self.outlet.clock())

    def flush(self, last: bool = False) -> float:
        """The server's batch of effects is over: send what ``post`` held. ``last``:
        the broker is stopping, hold nothing. Returns when (server clock) the port
        wants ``flush`` again even if no effect comes (``NEVER``: not before one).
        Only a port that overrides it is asked."""
        return NEVER

    def local_request(self, request: bytes, now: float) -> bytes | None:
        """An answer to ``request`` asked in-process (the monitor channel's
        ``BrokerServer.monitor_reply``), or None: not this port's to answer."""
        return None

    def socket_options(self) -> SocketOptions:
        """ROUTER_MANDATORY: an unroutable peer raises instead of a silent drop."""
        return SocketOptions(router_mandatory=True)

    def configure(self, settings: Any) -> None:  # noqa: B027 (most ports need nothing)
        """Read what the port needs beyond its address from the settings."""

    def socket_specs(self) -> list[SocketSpec]:
        """The sockets to bind: one ROUTER on ``address`` unless overridden."""
        return [SocketSpec(self.name, zmq.ROUTER, self.address, self.socket_options(), self.roles)]

    def handler_for(self, socket: str) -> Handler:
        """What reads the socket named ``socket`` (of ``socket_specs``)."""
        return self.handle

    def encode_routed(self, effect: Effect) -> tuple[str, list[bytes]] | None:
        """A multi-socket port's ``encode`` (see ``post_routed``): the socket's name
        and the whole message (the identity first on a ROUTER), or None."""
        return None

    def unsent(self, effect: Effect, now: float) -> None:
        """The socket would have blocked on ``effect`` (multi-socket ports): it was
        not sent."""
        self.core.counters["unroutable"] += 1

    @abstractmethod
    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        """One message from ``identity``; returns frames to send straight back to it
        (a request-reply protocol's answer), or None."""

    @abstractmethod
    def encode(self, effect: Effect) -> list[bytes] | None:
        """The frames that carry ``effect`` on this wire (without the identity), or
        None when the effect means nothing here."""

    def next_timer(self) -> float | None:
        """When (server clock) the port next wants ``on_timer``, or None. The server's
        poll loop wakes up for it, so a port with sessions of its own (mc0's
        heartbeats and evictions) needs no thread and an idle broker still sleeps."""
        return None

    def on_timer(self, now: float) -> list[tuple[str, list[bytes]]]:
        """The port's timer is due: the (socket spec name, whole frames, the routing
        identity first on a ROUTER) to send. Called at or after ``next_timer``."""
        return []

    def pump(self, now: float, send: PacedSend) -> None:  # noqa: B027 (most ports need nothing)
        """Send what the port paces itself (a snapshot replay, a bounded part of it
        per loop turn), one message at a time through ``send``, which says whether
        it left (``SENT``), met the peer's full pipe (``FULL``) or a gone peer
        (``GONE``). Called every loop turn when ``next_timer`` is due."""

    # ---- topics (broker/topics.py) ---------------------------------------------

    def on_published(self, event: Event) -> list[tuple[str, list[bytes]]]:
        """The messages that carry ``event`` to this port's subscribers: each the
        name of one of its sockets and the whole frames (the identity first on a
        ROUTER). Every port is offered every event, whichever port it came in by."""
        return []

    def flush_published(self) -> list[tuple[str, list[bytes]]]:
        """Messages of events this port held back to send together (the Event BUS
        port's delivery batches), in ``on_published``'s form; the server asks after
        each round of sends."""
        return []

    def unsent_published(self, event: Event, frames: list[bytes]) -> None:
        """A subscriber's pipe was full: the event was not sent to it (it can fill
        the gap by the sequence)."""
        self.core.counters["unroutable"] += 1

    def subscriber_count(self) -> int:
        """Subscribers this port has now (for the monitor and the admin)."""
        return 0

    def topic_stats(self) -> dict[str, Any]:
        """Figures of this port's topic traffic for the monitor (optional)."""
        return {}

    def authorize(self, socket: str, roles: frozenset[str], frames: Sequence[bytes]) -> str | None:
        """Why a sender holding ``roles`` may not send ``frames`` on ``socket``, or
        None. Asked only when the broker runs CURVE, after the ZAP handler admitted
        the sender's key for one of the socket's roles: a port whose socket carries
        several roles checks the command here (the monitor: reading vs CANCEL)."""
        return None

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None:
        """What goes back for a message ``authorize`` refused (None: nothing)."""
        return None

    def known_peers(self) -> dict[bytes, Peer]:
        """The peers this port knows, by identity (its workers, its schedulers)."""
        return {}

    def revoke(self, identity: bytes, now: float) -> bool:
        """The key ``identity`` spoke with was revoked: forget that peer (its jobs
        go back to the queue as after a lost peer); True if there was one."""
        peer = self.known_peers().get(identity)
        if peer is None:
            return False
        self.core.peer_unreachable(peer, now)
        return True

    def narrow(self, identity: bytes, roles: frozenset[str], now: float) -> None:  # noqa: B027
        """The key ``identity`` spoke with now holds only ``roles`` (still one this
        port admits): take back what it may no longer have (mc0: its SUBs)."""

    def harmless(self, socket: str, frames: Sequence[bytes]) -> bool:
        """A message read even from a revoked key (or from none: libzmq's own, such
        as an XPUB's unsubscription when a peer goes)."""
        return False

    def unroutable(self, identity: bytes, now: float) -> None:
        """The socket could not route to ``identity``: that peer is gone."""
        peer = self.known_peers().get(identity)
        if peer is None:
            self.core.counters["unroutable"] += 1
        else:
            self.core.peer_unreachable(peer, now)

    def forget(self, peer: Peer) -> None:
        """The core dropped ``peer`` (its ``Forget`` effect): the identity is free."""
        peers = self.known_peers()
        if peers.get(peer.identity) is peer:
            del peers[peer.identity]

    def count_malformed(self, identity: bytes, exc: ProtocolError, answered: bool) -> None:
        """Count (and, within a budget, log) a message ``decode`` refused."""
        counters = self.core.counters
        counters["protocol_errors"] += 1
        if not answered:
            counters["dropped_malformed"] += 1
        n = counters["protocol_errors"]
        if self._error_log_budget > 0 or n % 10_000 == 0:
            self._error_log_budget -= 1
            log.warning(
                "%s a malformed message on the %s port from %s: %s (%d so far)",
                "refused" if answered else "dropped",
                self.name,
                show_identity(identity),
                exc,
                n,
            )
