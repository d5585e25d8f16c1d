"""Majordomo with PARTIAL/FINAL as typed frames: the draft and majortomo's framing.

Two framings reach one port (specs/mdp-partial-final-protocol.txt and
specs/WIRE-NOTES.md), told apart by their first frame:

- ``MAJORTOMO`` (the released peer, PyPI ``majortomo`` 0.2.0): every message
  starts with an empty frame, then ``MDPC02``/``MDPW02`` and a one-byte command.
  A client's REQUEST is ``0x02 service body...``; replies to it are
  ``0x03``/``0x04`` (PARTIAL/FINAL) with the body and no service name and no
  request id, so a client has one request outstanding at a time. Workers beat
  with HEARTBEAT (``0x05``).
- ``DRAFT`` (the document): no empty frame; a client's REQUEST is
  ``0x01 service request-id body...`` and its replies are
  ``0x02``/``0x03`` (PARTIAL/FINAL) ``service request-id body...``, so one
  client may have many requests outstanding. Workers beat with ``PING`` and the
  broker answers ``PONG``.

Workers of either framing get ``REQUEST client-address '' [request-id] body...``
and echo the address in their PARTIAL/FINAL; the broker uses the address as
its own opaque token for the job (a worker never sees the real client).

Every frame list here excludes the ROUTER identity. ``decode()`` raises
``ProtocolError`` (with the reason and the frames) for anything else.

``decode`` runs twice per request in the broker (the client's REQUEST, the
worker's FINAL), so the messages are plain slot classes (a frozen dataclass's
``__init__`` sets each field through ``object.__setattr__``, several times the
cost), a worker's PARTIAL/FINAL in majortomo's framing is told apart first, and
service names already checked are remembered (their bytes map to their text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from emq_django.exceptions import ProtocolError
from emq_django.protocol.limits import REFUSED_BAD_QUEUE_NAME, REFUSED_QUEUE_NAME_TOO_LONG

CLIENT = b"MDPC02"
WORKER = b"MDPW02"

MAJORTOMO = "majortomo"
DRAFT = "draft"

# majortomo (and MDP/0.2) command bytes
READY = b"\x01"
REQUEST = b"\x02"
PARTIAL = b"\x03"
FINAL = b"\x04"
HEARTBEAT = b"\x05"
DISCONNECT = b"\x06"
# the draft's client commands are numbered from 1
DRAFT_CLIENT_REQUEST = b"\x01"
DRAFT_CLIENT_PARTIAL = b"\x02"
DRAFT_CLIENT_FINAL = b"\x03"
PING = b"PING"
PONG = b"PONG"

MAX_SERVICE_LENGTH = 255
MAX_ID_LENGTH = 255
MAX_KNOWN_SERVICES = 4096  # service names remembered once checked; others are checked each time
_known_services: dict[bytes, str] = {}


@dataclass(slots=True)
class ClientRequest:
    framing: str
    service: str
    request_id: bytes  # b"" in majortomo's framing, which has none
    body: tuple[bytes, ...]


@dataclass(slots=True)
class WorkerReady:
    framing: str
    service: str


@dataclass(slots=True)
class WorkerReply:
    framing: str
    final: bool
    address: bytes  # the token the broker gave with the REQUEST
    request_id: bytes  # b"" in majortomo's framing
    body: tuple[bytes, ...]


@dataclass(slots=True)
class WorkerHeartbeat:
    framing: str  # DRAFT: a PING, to be answered with a PONG


@dataclass(slots=True)
class WorkerDisconnect:
    framing: str


class BadRequest(ProtocolError):
    """A client's REQUEST for a service name no queue can have: the broker answers
    it with a FINAL carrying the reason (``client_refusal``), so the client is not
    left waiting. ``service`` is the name's raw frame, as the draft echoes it."""

    def __init__(
        self,
        reason: str,
        frames: Sequence[bytes],
        code: str,
        framing: str,
        service: bytes,
        request_id: bytes,
    ) -> None:
        super().__init__(reason, frames, code)
        self.framing = framing
        self.service = bytes(service)
        self.request_id = request_id


Message: TypeAlias = ClientRequest | WorkerReady | WorkerReply | WorkerHeartbeat | WorkerDisconnect


def decode(frames: Sequence[bytes]) -> Message:
    """The message in ``frames``; raises ``ProtocolError`` naming what is wrong."""
    if len(frames) < 2:
        raise ProtocolError(f"a Majordomo message has at least 2 frames, got {len(frames)}", frames)
    if frames[0] == b"":
        return _decode_majortomo(frames)
    return _decode_draft(frames)


def _decode_majortomo(frames: Sequence[bytes]) -> Message:
    n = len(frames)
    if n < 3:
        raise ProtocolError("a Majordomo message has a header and a command", frames)
    header, command = frames[1], frames[2]
    if header == WORKER:
        if (command == FINAL or command == PARTIAL) and n >= 5 and frames[4] == b"":
            # the hot path: '' MDPW02 FINAL address '' body...
            address = frames[3]
            if 0 < len(address) <= MAX_ID_LENGTH:
                return WorkerReply(MAJORTOMO, command == FINAL, address, b"", tuple(frames[5:]))
        return _decode_worker(MAJORTOMO, command, frames[3:], frames)
    if header == CLIENT:
        if command != REQUEST:
            raise ProtocolError(f"unknown client command {command!r}", frames)
        if n < 4:
            raise ProtocolError("a REQUEST names its service", frames)
        service = _known_services.get(frames[3]) or _request_service(
            MAJORTOMO, frames[3], b"", frames
        )
        return ClientRequest(MAJORTOMO, service, b"", tuple(frames[4:]))
    raise ProtocolError(f"unknown protocol header {bytes(header[:16])!r}", frames)


def _decode_draft(frames: Sequence[bytes]) -> Message:
    header, command, rest = frames[0], frames[1], frames[2:]
    if header == CLIENT:
        if command != DRAFT_CLIENT_REQUEST:
            raise ProtocolError(f"unknown client command {command!r}", frames)
        if len(rest) < 2:
            raise ProtocolError("a REQUEST has a service and a request id", frames)
        request_id = _id(rest[1], frames)
        service = _known_services.get(rest[0]) or _request_service(
            DRAFT, rest[0], request_id, frames
        )
        return ClientRequest(DRAFT, service, request_id, tuple(rest[2:]))
    if header != WORKER:
        raise ProtocolError(f"unknown protocol header {bytes(header[:16])!r}", frames)
    if command == PING:
        return WorkerHeartbeat(DRAFT)
    return _decode_worker(DRAFT, command, rest, frames)


def _decode_worker(
    framing: str, command: bytes, rest: Sequence[bytes], frames: Sequence[bytes]
) -> Message:
    if command == READY:
        if len(rest) != 1:
            raise ProtocolError("a READY names exactly one service", frames)
        return WorkerReady(framing, _service(rest[0], frames))
    if command in (PARTIAL, FINAL):
        return _decode_reply(framing, command == FINAL, rest, frames)
    if command == HEARTBEAT:
        return WorkerHeartbeat(framing)
    if command == DISCONNECT:
        return WorkerDisconnect(framing)
    raise ProtocolError(f"unknown worker command {command!r}", frames)


def _decode_reply(
    framing: str, final: bool, rest: Sequence[bytes], frames: Sequence[bytes]
) -> WorkerReply:
    # address, '' [, request id], body...
    if len(rest) < 2 or rest[1] != b"":
        raise ProtocolError("a reply has a client address and an empty frame", frames)
    address = _id(rest[0], frames)
    if framing == DRAFT:
        if len(rest) < 3:
            raise ProtocolError("a reply has a request id after the empty frame", frames)
        return WorkerReply(framing, final, address, _id(rest[2], frames), tuple(rest[3:]))
    return WorkerReply(framing, final, address, b"", tuple(rest[2:]))


def _service(raw: bytes, frames: Sequence[bytes]) -> str:
    """A service name, checked as a queue name is (``limits.check_queue_name``: emq's
    client and ``--queues`` take no other); raises ``ProtocolError`` with the
    refusal's code."""
    if not raw or len(raw) > MAX_SERVICE_LENGTH:
        code = REFUSED_QUEUE_NAME_TOO_LONG if raw else REFUSED_BAD_QUEUE_NAME
        raise ProtocolError(f"a service name has 1 to {MAX_SERVICE_LENGTH} bytes", frames, code)
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(
            "a service name is UTF-8 text", frames, REFUSED_BAD_QUEUE_NAME
        ) from None
    if not name.isprintable() or any(c.isspace() or c in ",:" for c in name):
        raise ProtocolError(
            "a service name is printable text without spaces, ',' or ':'",
            frames,
            REFUSED_BAD_QUEUE_NAME,
        )
    if len(_known_services) < MAX_KNOWN_SERVICES:
        _known_services[bytes(raw)] = name
    return name


def _request_service(framing: str, raw: bytes, request_id: bytes, frames: Sequence[bytes]) -> str:
    """A REQUEST's service name; raises ``BadRequest`` (answerable) for a bad one."""
    try:
        return _service(raw, frames)
    except ProtocolError as exc:
        raise BadRequest(exc.reason, frames, exc.code, framing, raw, request_id) from None


def _id(raw: bytes, frames: Sequence[bytes]) -> bytes:
    if not raw or len(raw) > MAX_ID_LENGTH:
        raise ProtocolError(f"an id or address has 1 to {MAX_ID_LENGTH} bytes", frames)
    return bytes(raw)


# ---- what the broker sends ----------------------------------------------------


def client_reply(
    framing: str, final: bool, service: str, request_id: bytes, body: Sequence[bytes]
) -> list[bytes]:
    """A PARTIAL or FINAL to a client, in the framing its REQUEST came in."""
    if framing == MAJORTOMO:
        return [b"", CLIENT, FINAL if final else PARTIAL, *body]
    command = DRAFT_CLIENT_FINAL if final else DRAFT_CLIENT_PARTIAL
    return [CLIENT, command, service.encode(), request_id, *body]


def client_refusal(exc: BadRequest, body: bytes) -> list[bytes]:
    """The FINAL that answers a REQUEST ``decode`` refused (``BadRequest``)."""
    if exc.framing == MAJORTOMO:
        return [b"", CLIENT, FINAL, body]
    return [CLIENT, DRAFT_CLIENT_FINAL, exc.service, exc.request_id, body]


def worker_request(
    framing: str, address: bytes, request_id: bytes, body: Sequence[bytes]
) -> list[bytes]:
    """A REQUEST to a worker; it echoes ``address`` (and ``request_id``) back."""
    if framing == MAJORTOMO:
        return [b"", WORKER, REQUEST, address, b"", *body]
    return [WORKER, REQUEST, address, b"", request_id, *body]


def worker_heartbeat(framing: str) -> list[bytes]:
    """majortomo: a HEARTBEAT; the draft: the PONG that answers a PING."""
    if framing == MAJORTOMO:
        return [b"", WORKER, HEARTBEAT]
    return [WORKER, PONG]


def worker_disconnect(framing: str) -> list[bytes]:
    if framing == MAJORTOMO:
        return [b"", WORKER, DISCONNECT]
    return [WORKER, DISCONNECT]
