"""PZQ as typed frames (specs/pzq-sockets-and-formats.txt, WIRE-NOTES.md).

Three sockets, three wires; every frame list here excludes the ROUTER identity:

- ``receive`` (producers' DEALERs to our ROUTER): ``[msg id, (headers...), '',
  body parts...]``, answered ``[msg id, '1' | '0', '', text]``.
- ``send`` (consumers connect a ROUTER to our DEALER): we send ``[msg id, sent
  µs, ack time-out µs, '', body parts...]``; the consumer's ROUTER puts our
  identity in front (the "PZQ id" of the document). Its ack ``[PZQ id, msg id,
  '1' | '0']`` reaches our DEALER as ``[msg id, '1' | '0']``.
- ``monitor``: the request ``MONITOR``, answered with ``key: value`` lines.

``decode_produce`` and ``decode_ack`` raise ``ProtocolError`` (with the reason
and the frames) for anything else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from emq_django.exceptions import ProtocolError

OK = b"1"
FAILED = b"0"
MAX_MSG_ID = 255  # bytes; the id comes back in every answer and delivery
MONITOR = b"MONITOR"


@dataclass(frozen=True, slots=True)
class Produce:
    """A producer's message: to be stored, then delivered to a consumer."""

    msg_id: bytes
    headers: tuple[bytes, ...]  # protocol parts before the delimiter: ignored
    body: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ConsumerAck:
    """A consumer's answer to a delivery: ``ok`` (delete it) or not (send it again)."""

    msg_id: bytes
    ok: bool


def decode_produce(frames: Sequence[bytes]) -> Produce:
    """A producer's message; raises ``ProtocolError`` without an id, a delimiter
    or a body."""
    if not frames:
        raise ProtocolError("an empty message", frames)
    msg_id = frames[0]
    if not msg_id:
        raise ProtocolError("the message id (part 0) is empty", frames)
    if len(msg_id) > MAX_MSG_ID:
        raise ProtocolError(f"the message id is over {MAX_MSG_ID} bytes", frames)
    try:
        delimiter = frames.index(b"", 1)
    except ValueError:
        raise ProtocolError("no empty delimiter part before the body", frames) from None
    body = tuple(frames[delimiter + 1 :])
    if not body:
        raise ProtocolError("no body after the delimiter", frames)
    return Produce(msg_id, tuple(frames[1:delimiter]), body)


def decode_ack(frames: Sequence[bytes]) -> ConsumerAck:
    """A consumer's ack as our DEALER gets it, ``[msg id, '1' | '0', ...]``; raises
    ``ProtocolError`` for anything else."""
    if len(frames) < 2:
        raise ProtocolError("an ack has a message id and a value", frames)
    msg_id, value = frames[0], frames[1]
    if not msg_id:
        raise ProtocolError("the ack's message id is empty", frames)
    if value not in (OK, FAILED):
        raise ProtocolError(f"the ack value is {value[:20]!r}, not '1' or '0'", frames)
    return ConsumerAck(msg_id, value == OK)


def produce(msg_id: bytes, body: Sequence[bytes], headers: Sequence[bytes] = ()) -> list[bytes]:
    """A producer's message (what a producer sends; for tests and tools)."""
    return [msg_id, *headers, b"", *body]


def answer(msg_id: bytes, ok: bool, text: bytes = b"") -> list[bytes]:
    """Our answer to a producer: stored (``ok``), or not and why."""
    return [msg_id, OK if ok else FAILED, b"", text]


def delivery(msg_id: bytes, sent_us: int, timeout_us: int, body: Sequence[bytes]) -> list[bytes]:
    """A message for a consumer, as our DEALER sends it."""
    return [msg_id, b"%d" % sent_us, b"%d" % timeout_us, b"", *body]


def ack(msg_id: bytes, ok: bool) -> list[bytes]:
    """A consumer's ack, without the PZQ id its ROUTER routes by."""
    return [msg_id, OK if ok else FAILED]


def monitor_lines(values: Mapping[str, int]) -> bytes:
    """The MONITOR answer: one ``key: value`` line each."""
    return "\n".join(f"{key}: {value}" for key, value in values.items()).encode()


def parse_monitor(text: bytes) -> dict[str, str]:
    """A MONITOR answer's lines as a dict (split at the first colon)."""
    out: dict[str, str] = {}
    for line in text.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def pack_parts(parts: Sequence[bytes]) -> bytes:
    """Several body parts as one blob (a 4-byte big-endian length before each), so
    that a multipart message is stored whole in one journal row."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def unpack_parts(blob: bytes) -> list[bytes]:
    """``pack_parts`` undone; raises ``ProtocolError`` for a blob it did not make."""
    parts: list[bytes] = []
    i = 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ProtocolError("a packed body ends inside a length", [blob[:64]])
        n = int.from_bytes(blob[i : i + 4], "big")
        i += 4
        if i + n > len(blob):
            raise ProtocolError("a packed body ends inside a part", [blob[:64]])
        parts.append(blob[i : i + n])
        i += n
    return parts
