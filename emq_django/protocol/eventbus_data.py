"""An event's data on the Event BUS wire: MessagePack, and the content types
emq also carries (JSON, raw bytes). Pure."""

from __future__ import annotations

import json

import msgpack

from emq_django.exceptions import ProtocolError
from emq_django.protocol.events import JSON, MSGPACK, Event

MAX_FIELD = 1024  # producer, timestamp, uuid, content type
CONTENT_TYPES = (MSGPACK, JSON, "application/octet-stream")


def as_msgpack(event: Event) -> bytes:
    """The event's data as the bus carries it (MessagePack): kept as is when it is
    MessagePack, converted from JSON, else raw bytes packed as a ``bin``."""
    ctype = event.content_type
    if ctype == MSGPACK or not ctype:
        return event.data
    if ctype == JSON:
        try:
            return bytes(msgpack.packb(json.loads(event.data)))
        except (ValueError, TypeError, OverflowError):
            pass
    return bytes(msgpack.packb(event.data, use_bin_type=True))


_BIN_OR_STR = frozenset(b"\xc4\xc5\xc6\xd9\xda\xdb") | frozenset(range(0xA0, 0xC0))


def as_raw(event: Event) -> bytes:
    """The event's data as bytes for a wire of opaque bodies (mc0): MessagePack
    data that is one ``bin`` or string (``emq.publish`` of bytes or text) is
    unwrapped; anything else stays as it was published."""
    data = event.data
    if event.content_type not in (MSGPACK, "") or not data or data[0] not in _BIN_OR_STR:
        return data
    try:
        value = msgpack.unpackb(data, raw=True)
    except (ValueError, msgpack.UnpackException):
        return data
    return value if type(value) is bytes else data


def check_msgpack(data: bytes) -> None:
    try:
        msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise ProtocolError(f"event data is not MessagePack: {exc}") from None
