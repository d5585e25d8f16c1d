"""A toy line protocol, served by the broker through one port module (this one).

The whole wire: a client (a DEALER) sends one frame ``RUN <queue> <body>``; the
broker answers ``OK <job id>`` once the job is taken, ``DONE <result>`` (or
``FAILED <result>``) when it has run, and ``ERR <code> <reason>`` when it is
refused. docs/architecture.md ("Adding a protocol") walks through it; the
registration is one line beside the broker's own ports (see
tests/integration/test_toy_protocol.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emq_django.broker.effects import Acknowledge, Answer, ClientRef, Effect, Refuse
from emq_django.broker.ports.base import Port
from emq_django.conf import EmqSettings
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol.headers import Headers, format_headers, parse_headers

# every job asks for its result, so that the client hears DONE
_HEADERS: Headers = parse_headers(format_headers(reply_requested=True))


class ToyLinePort(Port):
    name = "toy"

    def __init__(self, core: Any, address: str = "") -> None:
        super().__init__(core, address)
        self.new_id = IdGenerator()

    # ---- in: the wire's message -> a call on the core ----------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        try:
            verb, queue, body = _parse(frames)
        except ProtocolError as exc:
            self.count_malformed(identity, exc, answered=True)
            return [b"ERR malformed " + exc.reason.encode()]
        if verb != b"RUN":
            return [b"ERR unknown-verb " + verb]
        client = ClientRef(self, identity)
        self.core.client_request(
            client, self.new_id(), queue.decode(), _HEADERS, body, now, fresh=True
        )
        return None

    # ---- out: the core's effect -> the wire's frames -----------------------------------

    def encode(self, effect: Effect) -> list[bytes] | None:
        if type(effect) is Acknowledge:
            return [b"OK " + effect.msgid]
        if type(effect) is Answer and effect.final:
            word = b"FAILED " if effect.outcome.failed else b"DONE "
            return [word + effect.body]
        if type(effect) is Refuse:
            return [f"ERR {effect.code} {effect.reason}".encode()]
        return None  # partial results, heartbeats: nothing on this wire


def _parse(frames: Sequence[bytes]) -> tuple[bytes, bytes, bytes]:
    if len(frames) != 1:
        raise ProtocolError("one frame per message", list(frames))
    parts = frames[0].split(b" ", 2)
    if len(parts) != 3:
        raise ProtocolError("expected: <verb> <queue> <body>", list(frames))
    return parts[0], parts[1], parts[2]


@dataclass(frozen=True, slots=True)
class ToySettings(EmqSettings):
    """The port's setting: its bind address (empty: off)."""

    TOY_BIND: str = ""
