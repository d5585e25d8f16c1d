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
from emq_django.broker.effects import OK_READY, ClientRef, Effect, Outcome
from emq_django.broker.state import Peer
from emq_django.protocol.headers import parse_headers

BODY = b'["run", {"callable": "noop", "path": "pkg.tasks", "args": [1], "kwargs": {}}]'
E = TypeVar("E")


class HarnessPort:
    """Stands where a protocol port stands: the core reads its traits only."""

    acknowledges = True  # a client's job is ACKed (Majordomo's is not)
    always_streams = False  # partials go only to a client that asked for them


class CoreHarness:
    def __init__(self, config: BrokerConfig | None = None, now: float = 0.0, **kw: Any) -> None:
        self.now = now
        self.core = BrokerCore(config or BrokerConfig(), now, **kw)
        self.port: Any = HarnessPort()
        self.clients: dict[bytes, ClientRef] = {}
        self.peers: dict[bytes, Peer] = {}

    # ---- the clock ------------------------------------------------------------------

    def at(self, now: float | None) -> float:
        """``now`` when given (the clock moves there), else the harness's clock."""
        if now is not None:
            self.now = now
        return self.now

    def tick(self, now: float) -> list[Effect]:
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
        meta = json.loads(json.dumps(meta or {}))
        peer = Peer(identity, "worker", tuple(queues), at, meta, connected_at=at, port=self.port)
        self.peers[identity] = peer
        self.core.worker_join(peer, at)
        return self.take()

    def ready(self, identity: bytes, times: int = 1, now: float | None = None) -> list[Effect]:
        for _ in range(times):
            self.core.worker_ready(self.peers[identity], self.at(now))
        return self.take()

    def result(
        self,
        identity: bytes,
        attempt_id: bytes,
        outcome: Outcome = OK_READY,
        body: bytes = b"null",
        now: float | None = None,
    ) -> list[Effect]:
        self.core.worker_result(self.peers[identity], attempt_id, outcome, body, self.at(now))
        return self.take()

    # ---- effects --------------------------------------------------------------------

    def take(self) -> list[Effect]:
        """The effects the core queued since the last take."""
        out, self.core.out = self.core.out, []
        return out


def of_type(effects: Iterable[Any], kind: type[E]) -> list[E]:
    """The effects of one type, in order."""
    return [e for e in effects if isinstance(e, kind)]
