"""The broker core driven with typed commands and a fake clock, no port, no socket.

``CoreHarness`` calls ``emq_django.broker.core.BrokerCore`` the way a port does
(``client_request``, ``worker_join``, ``worker_result``, ...) and hands back the
typed effects the core queued (``Deliver``, ``Acknowledge``, ``Answer``, ...): a
test about the core asserts on those, not on any protocol's bytes. The peers and
clients it makes belong to ``HarnessPort``, a port with the default traits and no
wire (what it would send is what the test reads).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypeVar

from emq_django.broker.core import BrokerConfig, BrokerCore
from emq_django.broker.effects import OK_READY, ClientRef, Effect, Forget, Outcome
from emq_django.broker.state import Peer
from emq_django.protocol.headers import parse_headers

BODY = b'["run", {"callable": "noop", "path": "pkg.tasks", "args": [1], "kwargs": {}}]'
E = TypeVar("E")
_OWN = frozenset({"now", "core", "port", "clients", "known"})  # the harness's, not the core's


class HarnessPort:
    """Stands where a protocol port stands: the core reads its traits only."""

    acknowledges = True  # a client's job is ACKed (Majordomo's is not)
    always_streams = False  # partials go only to a client that asked for them


class CoreHarness:
    """The core and the peers and clients it knows, by identity.

    State is read from the core (``counters``, ``queues``, ``inflight``, ...) or
    its lifecycle (``jobs``, ``delayed``, ``recent``, ``journal_ops``, ...):
    ``harness.counters`` is ``harness.core.counters``. ``journal=True`` collects
    the journal operations; ``trace=True`` keeps the trace lines (``trace``).
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        now: float = 0.0,
        *,
        wall_offset: float | None = None,
        journal: bool = False,
        trace: bool = False,
        seed: int | None = None,
    ) -> None:
        self.now = now
        self.core = BrokerCore(config or BrokerConfig(), now, seed=seed, trace=trace)
        if wall_offset is not None:
            self.core.wall_offset = wall_offset
        if journal:
            self.core.life.journal_ops = []
        self.port: Any = HarnessPort()
        self.clients: dict[bytes, ClientRef] = {}
        self.known: dict[bytes, Peer] = {}  # as a port knows them: until the core's Forget

    @property
    def peers(self) -> dict[bytes, Peer]:
        """The peers the core has not dropped, by identity."""
        return {i: p for i, p in self.known.items() if not p.gone}

    @property
    def trace(self) -> list[str] | None:
        return None if self.core.tracer is None else self.core.tracer.lines

    def __getattr__(self, name: str) -> Any:
        core = self.__dict__["core"]
        return getattr(core, name) if hasattr(core, name) else getattr(core.life, name)

    def __setattr__(self, name: str, value: Any) -> None:
        core = self.__dict__.get("core")
        if core is None or name in _OWN:
            object.__setattr__(self, name, value)
        elif hasattr(core, name):
            setattr(core, name, value)
        elif hasattr(core.life, name):
            setattr(core.life, name, value)  # journal_ops, spill_requests, ...
        else:
            object.__setattr__(self, name, value)

    # ---- the clock ------------------------------------------------------------------

    def at(self, now: float | None) -> float:
        """``now`` when given (the clock moves there), else the harness's clock."""
        if now is not None:
            self.now = now
        return self.now

    def tick(self, now: float, keep_alive: Iterable[bytes] = ()) -> list[Effect]:
        """The core's timer at ``now``; the peers in ``keep_alive`` heard just before."""
        for identity in keep_alive:
            self.heard(identity, now)
        self.core.on_timer(self.at(now))
        return self.take()

    # ---- commands -------------------------------------------------------------------

    def client(self, identity: bytes) -> ClientRef:
        ref = self.clients.get(identity)
        if ref is None:
            ref = self.clients[identity] = ClientRef(self.port, identity)
        return ref

    def request(
        self,
        client: bytes,
        msgid: bytes,
        queue: str = "default",
        headers: bytes = b"",
        body: bytes = BODY,
        now: float | None = None,
    ) -> list[Effect]:
        ref = self.client(client)
        self.core.client_request(ref, msgid, queue, parse_headers(headers), body, self.at(now))
        return self.take()

    def join(
        self,
        identity: bytes,
        queues: Iterable[tuple[int, str]] = ((10, "default"),),
        meta: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> list[Effect]:
        """A worker (``peer_type`` "worker") joins with ``queues`` as (weight, name)."""
        at = self.at(now)
        old = self.known.get(identity)
        if old is not None:  # what a port does with a second join under one identity
            self.core.worker_gone(old, at, "sent INFORM again")
        meta = json.loads(json.dumps(meta or {}))
        ranked = tuple(sorted(queues, key=lambda p: -p[0]))  # heaviest first, as ports give them
        peer = Peer(identity, "worker", ranked, at, meta, connected_at=at, port=self.port)
        self.known[identity] = peer
        self.core.worker_join(peer, at)
        return self.take()

    def heard(self, identity: bytes, now: float | None = None) -> Peer:
        """Anything from ``peer`` (a heartbeat): every port marks it seen."""
        peer = self.known[identity]
        peer.last_seen = self.at(now)
        return peer

    def ended(self, identity: bytes, pid: int, how: str, now: float | None = None) -> list[Effect]:
        """A job manager says its worker process ``pid`` ended (``how``)."""
        self.core.worker_ended(self.heard(identity, now), pid, how, self.now)
        return self.take()

    def unreachable(self, identity: bytes, now: float | None = None) -> list[Effect]:
        """The socket could not route to ``identity``: that peer is gone."""
        peer = self.peers.get(identity)
        if peer is None:
            self.core.counters["unroutable"] += 1
        else:
            self.core.peer_unreachable(peer, self.at(now))
        return self.take()

    def ready(self, identity: bytes, times: int = 1, now: float | None = None) -> list[Effect]:
        for _ in range(times):
            self.core.worker_ready(self.heard(identity, now), self.now)
        return self.take()

    def result(
        self,
        identity: bytes,
        attempt_id: bytes,
        outcome: Outcome = OK_READY,
        body: bytes = b"null",
        now: float | None = None,
    ) -> list[Effect]:
        self.core.worker_result(self.heard(identity, now), attempt_id, outcome, body, self.now)
        return self.take()

    # ---- effects --------------------------------------------------------------------

    def take(self) -> list[Effect]:
        """The effects the core queued since the last take."""
        out, self.core.out = self.core.out, []
        for effect in out:
            if isinstance(effect, Forget) and self.known.get(effect.peer.identity) is effect.peer:
                del self.known[effect.peer.identity]  # what Port.forget does
        return out


def failed(error: str = "", ready: bool = True, **kw: Any) -> Outcome:
    """A failed attempt's outcome (``retry=``, ``lost=``, ``requeue=`` as Outcome)."""
    return Outcome(True, ready, error, **kw)


def of_type(effects: Iterable[Any], kind: type[E]) -> list[E]:
    """The effects of one type, in order."""
    return [e for e in effects if isinstance(e, kind)]
