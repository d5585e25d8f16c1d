"""The Event BUS wire (micro-toolkit/event-bus-zeromq): frames in and out.

As the released bus (3.0.4) speaks it, which WIRE-NOTES record and which wins
over the protocol document where they differ:

- sequence numbers are ASCII decimal strings; the document's 8 bytes in network
  order are accepted on the way in (eight bytes that are not all digits);
- a multi-subtree spec is joined with ``,``; the document's ``;`` is accepted;
- the bus numbers events itself and ignores a PUB's sequence frame;
- timestamps are ISO-8601 (``Date.toISOString()``), UUIDs v4 strings, data
  MessagePack.

Commands (the ROUTER's identity frame not shown):

- snapshot, in: ``SYNCSTART, subtrees, sequence``; out: ``SYNC, topic, seq,
  producer, timestamp, uuid, data`` per kept event above ``sequence``, then
  ``SYNCEND, subtrees, current sequence``;
- publisher (PUB; subscribers filter on the topic frame): ``topic, seq,
  producer, timestamp, uuid, data``;
- collector, in: ``topic, seq (ignored), producer, timestamp, uuid, data``; an
  optional seventh frame, the data's content type, was sent by emq clients before
  2026-11-27 (raw bytes or JSON in the data frame) and is still accepted; without
  it the data is MessagePack. ``emq.publish`` now always sends six frames with
  MessagePack data, as the released bus reads them.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.eventbus_batches import (
    BATCH,
    BATCH_FIELDS,
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_PUBS_EVENTS,
    MAX_REASON,
    MAX_TS,
    PUBC,
    PUBNO,
    PUBOK,
    PUBS,
    PUBS_FIELDS,
    Confirmation,
    Pubs,
    confirmed_pubs,
    decode_batch,
    decode_batch_fields,
    decode_batch_id,
    decode_confirmation,
    decode_confirmed_pubs,
    decode_pubs,
    delivery_batch,
    pub_confirmed,
    pub_refused,
    pubs,
)
from emq_django.protocol.eventbus_data import (
    CONTENT_TYPES,
    MAX_FIELD,
    as_msgpack,
    as_raw,
    check_msgpack,
)
from emq_django.protocol.events import MAX_TOPIC_BYTES, MSGPACK, Event

SYNCSTART = b"SYNCSTART"
SYNC = b"SYNC"
SYNCEND = b"SYNCEND"
MAX_SUBTREES = 256
MAX_SPEC = 64 * 1024


# emq's own: a fourth SYNCSTART frame asking to be told of expired events; the
# answer then starts with ``SYNCEXPIRED, subtrees, first, last`` when retention
# deleted events in that range of a rule covering the subtrees (never sent to a
# client that did not ask: the released bus has no such command)
NOTIFY_EXPIRED = b"notify-expired"
SYNCEXPIRED = b"SYNCEXPIRED"


@dataclass(frozen=True, slots=True)
class SyncStart:
    spec: bytes  # as received: SYNCEND sends it back
    subtrees: tuple[str, ...]
    seq: int
    notify_expired: bool = False  # emq's client: tell it of expired events


@dataclass(frozen=True, slots=True)
class Pub:
    topic: str
    producer: str
    ts: float | None  # None: not given or not readable (the bus's clock is used)
    uuid: bytes  # 16 bytes, or b"" (the bus makes one)
    data: bytes
    content_type: str


# ---- numbers, times, ids ---------------------------------------------------------------


def encode_seq(seq: int) -> bytes:
    return b"%d" % seq


def decode_seq(raw: bytes) -> int:
    """ASCII decimal (the released bus), or 8 bytes in network order (the document);
    empty or ``null`` is 0."""
    if not raw or raw == b"null":
        return 0
    if raw.isdigit() and len(raw) <= 20:
        return int(raw)
    if len(raw) == 8:
        return int.from_bytes(raw, "big")
    raise ProtocolError(f"bad sequence number {raw[:32]!r}: expected ASCII decimal")


_second: list[Any] = [None, b""]  # the last whole second encoded, and its text (bytes)


def encode_ts(ts: float) -> bytes:
    """``Date.toISOString()``'s form: milliseconds and ``Z``. Every event goes out
    with one, so the text of the current second is kept (formatting a datetime
    was an eighth of the broker's time per event). A time outside 1970 .. 9999
    (an event kept before PUBs' times were checked) goes out clamped: a kept
    event is always servable."""
    if not 0.0 <= ts < MAX_TS:  # (NaN too)
        ts = MAX_TS - 1.0 if ts > 0 else 0.0
    frac, whole = math.modf(ts)  # rounded as datetime.fromtimestamp rounds
    micro = round(frac * 1_000_000)
    sec = int(whole)
    if micro >= 1_000_000 or micro < 0:
        carry, micro = divmod(micro, 1_000_000)
        sec += carry
    if _second[0] != sec:
        when = datetime.fromtimestamp(sec, UTC)
        _second[0], _second[1] = sec, when.strftime("%Y-%m-%dT%H:%M:%S.").encode()
    text: bytes = _second[1]
    return text + b"%03dZ" % (micro // 1000)


_decoded_second: list[Any] = [None, 0]  # the last "YYYY-MM-DDTHH:MM:SS" read, and its seconds


def decode_ts(raw: bytes) -> float | None:
    """Seconds since the epoch. The form every event carries (``encode_ts``'s, with
    milliseconds and ``Z``) is read with the text of its second kept, as
    ``encode_ts`` keeps it, and gives the float ``datetime.timestamp()`` gives."""
    if len(raw) == 24 and raw[23:24] == b"Z" and raw[19:20] == b"." and raw[20:23].isdigit():
        head = raw[:19]
        if _decoded_second[0] != head:
            whole = _iso_seconds(head)
            if whole is None:
                return None
            _decoded_second[0], _decoded_second[1] = head, whole
        sec: int = _decoded_second[1]
        return (sec * 1_000_000 + int(raw[20:23]) * 1000) / 1_000_000
    return _decode_ts(raw)


def _iso_seconds(head: bytes) -> int | None:
    try:
        when = datetime.fromisoformat(head.decode("ascii")).replace(tzinfo=UTC)
    except (UnicodeDecodeError, ValueError):
        return None
    return int(when.timestamp())


def _decode_ts(raw: bytes) -> float | None:
    if not raw or len(raw) > MAX_FIELD:
        return None
    try:
        text = raw.decode("ascii")
        if text.replace(".", "", 1).isdigit():
            return float(text)  # seconds since the epoch
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except (UnicodeDecodeError, ValueError, OverflowError):
        return None


def encode_uuid(raw: bytes) -> bytes:
    """The 8-4-4-4-12 form (``str(uuid.UUID(bytes=raw))``, without making a UUID)."""
    if len(raw) != 16:
        return b""
    h = raw.hex().encode()
    return b"%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def decode_uuid(raw: bytes) -> bytes:
    if not raw:
        return b""
    if len(raw) == 36 and raw[8:9] == raw[13:14] == raw[18:19] == raw[23:24] == b"-":
        try:  # the usual 8-4-4-4-12 form, without making a UUID
            return bytes.fromhex(raw.replace(b"-", b"").decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError(f"bad event UUID {raw[:40]!r}") from None
    try:
        return uuidlib.UUID(raw.decode("ascii")).bytes
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"bad event UUID {raw[:40]!r}") from None


# ---- snapshot --------------------------------------------------------------------------


def decode_syncstart(frames: Sequence[bytes]) -> SyncStart:
    if not frames or frames[0] != SYNCSTART:
        raise ProtocolError("expected SYNCSTART on the snapshot port")
    if len(frames) > 4 or (len(frames) == 4 and frames[3] != NOTIFY_EXPIRED):
        raise ProtocolError(f"SYNCSTART has {len(frames)} frames, expected 2 or 3")
    spec = frames[1] if len(frames) > 1 else b""
    if len(spec) > MAX_SPEC:
        raise ProtocolError(f"subtree spec of {len(spec)} bytes is too long")
    seq = decode_seq(frames[2]) if len(frames) > 2 else 0
    return SyncStart(spec, parse_subtrees(spec), seq, len(frames) == 4)


def parse_subtrees(spec: bytes) -> tuple[str, ...]:
    """``/a/,/b/`` (the released bus) or ``/a/;/b/`` (the document); empty: all."""
    try:
        text = spec.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("subtree spec is not UTF-8") from None
    parts = tuple(p for p in text.replace(";", ",").split(",") if p)
    if len(parts) > MAX_SUBTREES:
        raise ProtocolError(f"{len(parts)} subtrees; at most {MAX_SUBTREES}")
    return parts


def event_frames(event: Event, data: bytes) -> list[bytes]:
    """topic, seq, producer, timestamp, uuid, data: BROADCAST, and SYNC's tail."""
    return [
        event.topic.encode(),
        encode_seq(event.seq),
        event.producer.encode(),
        encode_ts(event.ts),
        encode_uuid(event.uuid),
        data,
    ]


def sync(event: Event, data: bytes) -> list[bytes]:
    return [SYNC, *event_frames(event, data)]


def syncexpired(spec: bytes, first: int, last: int) -> list[bytes]:
    return [SYNCEXPIRED, spec, encode_seq(first), encode_seq(last)]


def syncend(spec: bytes, seq: int) -> list[bytes]:
    return [SYNCEND, spec, encode_seq(seq)]


def broadcast(event: Event, data: bytes) -> list[bytes]:
    return event_frames(event, data)


# ---- collector -------------------------------------------------------------------------


def decode_pub(frames: Sequence[bytes]) -> Pub:
    """A producer's PUB (a leading empty delimiter, as a REQ-style peer sends, is
    skipped)."""
    if frames and not frames[0]:
        frames = frames[1:]
    if len(frames) not in (6, 7):
        raise ProtocolError(f"PUB has {len(frames)} frames, expected 6")
    topic_raw, _seq, producer, ts, uuid, data = frames[:6]
    if not topic_raw or len(topic_raw) > MAX_TOPIC_BYTES:
        raise ProtocolError(f"bad topic of {len(topic_raw)} bytes (1 to {MAX_TOPIC_BYTES})")
    if len(producer) > MAX_FIELD or len(uuid) > MAX_FIELD:
        raise ProtocolError("producer id or UUID too long")
    try:
        topic = topic_raw.decode("utf-8")
        producer_id = producer.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("topic or producer id is not UTF-8") from None
    ctype = MSGPACK
    if len(frames) == 7:
        ctype = frames[6].decode("ascii", "replace")
        if ctype not in CONTENT_TYPES:
            raise ProtocolError(f"unknown content type {ctype[:64]!r}")
    if ctype == MSGPACK:
        check_msgpack(data)
    when = decode_ts(ts)
    if when is not None and not 0.0 <= when < MAX_TS:  # it could not be sent again
        raise ProtocolError(f"event timestamp {bytes(ts[:32])!r} is outside 1970 .. 9999")
    return Pub(topic, producer_id, when, decode_uuid(uuid), bytes(data), ctype)


def pub(
    topic: str, producer: str, ts: float, uuid: bytes, data: bytes, content_type: str = ""
) -> list[bytes]:
    """A producer's PUB (for ``emq.publish``); ``content_type`` other than
    MessagePack adds our seventh frame."""
    return pub_frames(
        topic.encode(), producer.encode(), encode_ts(ts), encode_uuid(uuid), data, content_type
    )


_CTYPE_FRAMES = {c: c.encode() for c in CONTENT_TYPES}


def pub_frames(
    topic: bytes, producer: bytes, ts: bytes, uuid: bytes, data: bytes, content_type: str = ""
) -> list[bytes]:
    """``pub`` from fields already encoded (``emq.publish``: it keeps the UUID's text)."""
    if content_type and content_type != MSGPACK:
        ctype = _CTYPE_FRAMES.get(content_type) or content_type.encode()
        return [topic, b"", producer, ts, uuid, data, ctype]
    return [topic, b"", producer, ts, uuid, data]


# ---- client side (emq_django/pubsub.py) ------------------------------------------------


def syncstart(subtrees: Sequence[str], seq: int) -> list[bytes]:
    """emq's own SYNCSTART: it asks to be told of expired events."""
    return [SYNCSTART, ",".join(subtrees).encode(), encode_seq(seq), NOTIFY_EXPIRED]


def decode_event(frames: Sequence[bytes]) -> Event:
    """A BROADCAST (or a SYNC's frames after ``SYNC``); the data stays MessagePack."""
    if len(frames) != 6:
        raise ProtocolError(f"event has {len(frames)} frames, expected 6")
    topic, seq, producer, ts, event_uuid, data = frames
    try:
        return Event(
            decode_seq(seq),
            topic.decode("utf-8"),
            bytes(data),
            producer.decode("utf-8"),
            decode_uuid(event_uuid),
            decode_ts(ts) or 0.0,
            MSGPACK,
        )
    except UnicodeDecodeError:
        raise ProtocolError("topic or producer id is not UTF-8") from None


def decode_snapshot(frames: Sequence[bytes]) -> Event | int | tuple[int, int]:
    """A SYNC's event, a SYNCEND's sequence, or a SYNCEXPIRED's range."""
    if frames and frames[0] == SYNC:
        return decode_event(frames[1:])
    if len(frames) == 3 and frames[0] == SYNCEND:
        return decode_seq(frames[2])
    if len(frames) == 4 and frames[0] == SYNCEXPIRED:
        return decode_seq(frames[2]), decode_seq(frames[3])
    raise ProtocolError(
        f"expected SYNC or SYNCEND, not {bytes(frames[0][:16]) if frames else b''!r}"
    )


# the Event BUS frames above, and what eventbus_data.py and eventbus_batches.py hold
__all__ = [
    "BATCH",
    "BATCH_FIELDS",
    "CONTENT_TYPES",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_EVENTS",
    "MAX_FIELD",
    "MAX_PUBS_EVENTS",
    "MAX_REASON",
    "MAX_SPEC",
    "MAX_SUBTREES",
    "MAX_TS",
    "NOTIFY_EXPIRED",
    "PUBC",
    "PUBNO",
    "PUBOK",
    "PUBS",
    "PUBS_FIELDS",
    "SYNC",
    "SYNCEND",
    "SYNCEXPIRED",
    "SYNCSTART",
    "Confirmation",
    "Pub",
    "Pubs",
    "SyncStart",
    "as_msgpack",
    "as_raw",
    "broadcast",
    "check_msgpack",
    "confirmed_pubs",
    "decode_batch",
    "decode_batch_fields",
    "decode_batch_id",
    "decode_confirmation",
    "decode_confirmed_pubs",
    "decode_event",
    "decode_pub",
    "decode_pubs",
    "decode_seq",
    "decode_snapshot",
    "decode_syncstart",
    "decode_ts",
    "decode_uuid",
    "delivery_batch",
    "encode_seq",
    "encode_ts",
    "encode_uuid",
    "event_frames",
    "parse_subtrees",
    "pub",
    "pub_confirmed",
    "pub_frames",
    "pub_refused",
    "pubs",
    "sync",
    "syncend",
    "syncexpired",
    "syncstart",
]
