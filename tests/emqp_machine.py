"""The broker core with its two eMQP ports and no sockets, for unit tests: eMQP
frames in (``on_frontend``/``on_backend``), frames out (``out``, as
``(socket, identity, frames)`` with ``FRONTEND``/``BACKEND``), a fake ``now``.

Anything else is read from the core (``counters``, ``queues``, ``inflight``) or
its lifecycle (``jobs``, ``delayed``, ``journal_ops``, ``dead``); ``peers`` and
``schedulers`` map identities to the peers the ports know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emq_django.broker.core import BrokerConfig, BrokerCore
from emq_django.broker.effects import Acknowledge, Answer, Refuse
from emq_django.broker.ports.emqp_clients import EmqpClientPort
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort
from emq_django.broker.state import Peer
from emq_django.broker.trace import JobTracer
from emq_django.ids import IdGenerator

FRONTEND = 0
BACKEND = 1
Out = list[tuple[int, bytes, list[bytes]]]
_TO_CLIENT = (Answer, Acknowledge, Refuse)
_OWN = {"core", "frontend", "backend", "_encoded", "_socket_of"}


class EmqpMachine:
    def __init__(
        self,
        config: BrokerConfig,
        now: float,
        id_prefix: bytes | None = b"b-",
        seed: int | None = None,
        trace: bool = False,
    ) -> None:
        self.core = BrokerCore(config, now, seed=seed, trace=trace)
        ids = IdGenerator(id_prefix)
        self.frontend = EmqpClientPort(self.core, ids=ids)
        self.backend = EmqpWorkerPort(self.core, ids=ids)
        self._encoded: Out = []
        self._socket_of = {self.frontend: FRONTEND, self.backend: BACKEND}

    # ---- in -------------------------------------------------------------------------

    def on_frontend(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        self.frontend.handle(identity, frames, now)

    def on_backend(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        self.backend.handle(identity, frames, now)

    def peer_unreachable(self, socket: int, identity: bytes, now: float) -> None:
        port = self.frontend if socket == FRONTEND else self.backend
        port.unroutable(identity, now)

    # ---- out ------------------------------------------------------------------------

    @property
    def out(self) -> Out:
        self._encode()
        return self._encoded

    def _encode(self) -> None:
        while self.core.out:
            batch, self.core.out = self.core.out, []
            for effect in batch:
                ref: Any = effect.client if type(effect) in _TO_CLIENT else effect.peer  # type: ignore[union-attr]
                frames = ref.port.encode(effect)
                if frames is not None:
                    self._encoded.append((self._socket_of[ref.port], ref.identity, frames))

    # ---- state ----------------------------------------------------------------------

    @property
    def peers(self) -> dict[bytes, Peer]:
        return {i: p for i, p in self.backend.peers.items() if not p.gone}

    @property
    def schedulers(self) -> dict[bytes, Peer]:
        return {i: p for i, p in self.frontend.schedulers.items() if not p.gone}

    @property
    def trace(self) -> list[str] | None:
        return None if self.core.tracer is None else self.core.tracer.lines

    def __getattr__(self, name: str) -> Any:
        core = self.__dict__["core"]
        if hasattr(core, name):
            return getattr(core, name)
        return getattr(core.life, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        elif name == "out":
            self._encode()
            self._encoded = list(value)
        elif name == "trace":  # a list: trace on
            tracer = JobTracer()
            tracer.wall_offset = self.core.wall_offset
            tracer.lines = value
            self.core.tracer = self.core.life.tracer = tracer
        elif not hasattr(self.core, name) and hasattr(self.core.life, name):
            setattr(self.core.life, name, value)  # journal_ops, spill_requests, ...
        else:
            setattr(self.core, name, value)
