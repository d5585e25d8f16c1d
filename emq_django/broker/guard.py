"""The server's per-message check when the broker runs CURVE.

The ZAP handler admits a connection once; the guard looks at every message: the
User-Id libzmq attached to it (the key's name) must still be an enabled key (a
revoked key's messages are dropped and counted, ``dropped_revoked``), and the
port must allow the command for that key's roles (``Port.authorize``; refused
ones are counted, ``refused_forbidden``, and answered where the protocol has a
way to). It remembers which key each peer identity spoke with, so that when a key
is revoked its job managers, Majordomo workers and schedulers are dropped at once
(``revoke``): their in-flight jobs go back to the queue as after a lost peer.

"Dropped", for a revoked key: its live connections stay open at the TCP level (a
ROUTER cannot close one peer), but nothing it sends is read any more, nothing is
delivered to it, and it cannot connect again (the ZAP handler refuses the key).
A PUB socket cannot skip one of its peers: the server binds those of the roles
taken away again (``BrokerServer``), which cuts every subscriber off; the others
connect again, the revoked key cannot.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from emq_django import wire
from emq_django.broker.seam import Handler
from emq_django.broker.state import Peer, show_identity
from emq_django.security.allow import AllowList
from emq_django.security.roles import domain_roles, zap_domain

log = logging.getLogger(__name__)

LOG_BUDGET = 100
COUNTERS = ("dropped_revoked", "refused_forbidden", "peers_revoked", "publishers_rebound")
MAX_OWNERS = 100_000  # identities remembered per port; then cut to the known peers


class Port(Protocol):
    """What the guard needs of a port (``broker/ports/base.py``'s ``Port`` is one;
    the guard sits below the ports' layer and does not import it)."""

    @property
    def name(self) -> str: ...

    @property
    def roles(self) -> tuple[str, ...]: ...

    @property
    def authorizes(self) -> bool: ...

    def authorize(
        self, socket: str, roles: frozenset[str], frames: Sequence[bytes]
    ) -> str | None: ...

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None: ...

    def harmless(self, socket: str, frames: Sequence[bytes]) -> bool: ...

    def narrow(self, identity: bytes, roles: frozenset[str], now: float) -> None: ...

    def revoke(self, identity: bytes, now: float) -> bool: ...

    def known_peers(self) -> dict[bytes, Peer]: ...


class Guard:
    def __init__(self, allow: AllowList) -> None:
        self.allow = allow
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self.version = allow.version
        self.user = ""
        self.roles: frozenset[str] | None = None
        self.owners: dict[Port, dict[bytes, str]] = {}
        self._log_budget = LOG_BUDGET

    def recv(self, sock: zmq.Socket[Any]) -> list[bytes]:
        """``wire.recv`` that also notes the sender's key name and its roles now."""
        frames, user = wire.recv_user(sock)
        self.user = user
        self.roles = self.allow.roles(user)
        return frames

    def wrap(self, port: Port, socket: str, handle: Handler) -> Handler:
        """``handle``, behind the checks (for messages read with ``recv``)."""
        owners = self.owners.setdefault(port, {})
        allow = self.allow
        # a port whose socket admits one role (the ZAP domain checked it) has no
        # per-command rule: skip the call
        authorize = port.authorize if port.authorizes else None

        def guarded(identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
            roles, user = self.roles, self.user
            if roles is None:
                if port.harmless(socket, frames):  # (an XPUB's own unsubscriptions)
                    return handle(identity, frames, now)
                self._count("dropped_revoked", "dropped a message from revoked key %r", user)
                return None
            reason = None if authorize is None else authorize(socket, roles, frames)
            if reason is not None:
                self._count(
                    "refused_forbidden",
                    "refused a message from key %r on the %s port: %s",
                    user,
                    port.name,
                    reason,
                )
                return port.forbidden(identity, frames, reason)
            if owners.get(identity) != user:
                if len(owners) >= MAX_OWNERS:
                    self._trim(port, owners)
                owners[identity] = user
            allow.seen.add(user)  # (the reloader swaps the set)
            return handle(identity, frames, now)

        return guarded

    def revoke(self, ports: Sequence[Port], core: Any, now: float) -> int:
        """Drop every peer whose key lost its access since the last call (a key
        that lost some of its roles keeps what the rest allow: ``Port.narrow``);
        returns how many were dropped."""
        self.version = self.allow.version
        dropped = 0
        for port in ports:
            owners = self.owners.get(port, {})
            admitted = domain_roles(zap_domain(port.roles))
            for identity, user in list(owners.items()):
                roles = self.allow.roles(user)
                if roles is not None and (admitted is None or roles & admitted):
                    port.narrow(identity, roles, now)
                    continue
                del owners[identity]
                if port.revoke(identity, now):
                    log.warning(
                        "key %r revoked: dropping its peer %s on the %s port",
                        user,
                        show_identity(identity),
                        port.name,
                    )
                    dropped += 1
        self.counters["peers_revoked"] += dropped
        return dropped

    def _trim(self, port: Port, owners: dict[bytes, str]) -> None:
        known = port.known_peers()
        for identity in [i for i in owners if i not in known]:
            del owners[identity]

    def _count(self, counter: str, message: str, *args: object) -> None:
        self.counters[counter] += 1
        n = self.counters[counter]
        if self._log_budget > 0 or n % 10_000 == 0:
            self._log_budget -= 1
            log.warning(message + " (%d so far)", *args, n)
