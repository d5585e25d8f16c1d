"""emq's own channels beside the Event BUS wire: several events per message
(delivery and publish batches) and the confirmed publish. Pure; see
protocol/eventbus.py for the bus's own frames."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from emq_django.exceptions import ProtocolError
from emq_django.protocol.eventbus_data import CONTENT_TYPES, MAX_FIELD, check_msgpack
from emq_django.protocol.events import MAX_TOPIC_BYTES, MSGPACK, Event

# ---- emq's own batch channels (not the Event BUS's wire) -------------------------------
#
# Two forms that carry several events in one ZeroMQ message, so that what a
# message costs (a send, libzmq's fan-out to every subscriber, a recv) is paid once
# per batch when events come in bursts; at a low rate a batch holds one event and
# leaves at once, as a BROADCAST does. The Event BUS's own sockets never carry them:
#
# - delivery (the broker's batch publisher, ``EMQ_BUS_BATCH_BIND``, an XPUB):
#   ``topic, "EMQB", packed`` where ``packed`` is one MessagePack array of
#   ``seq, producer, ts, uuid, data`` repeated per event (flat), every event of
#   the batch on ``topic`` and in sequence order (a run of consecutive events on
#   one topic: a subscriber's prefix filter on the first frame works as on the
#   bus). ``ts`` is a float (seconds), ``uuid`` 16 bytes, ``data`` MessagePack as
#   in a BROADCAST;
# - publish (on the collector, with ``emq.publish_many``): ``"EMQPUBS", topic,
#   content type, producer, packed`` where ``packed`` is one MessagePack array of
#   ``ts, uuid, data`` repeated per event. Five frames: never a PUB (six or seven).

BATCH = b"EMQB"
PUBS = b"EMQPUBS"
BATCH_FIELDS = 5  # seq, producer, ts, uuid, data
PUBS_FIELDS = 3  # ts, uuid, data
MAX_BATCH_EVENTS = 64  # events in one delivery batch
MAX_BATCH_BYTES = 256 * 1024  # data bytes in one delivery batch (a batch may pass it by one event)
MAX_PUBS_EVENTS = 10_000  # events in one publish batch
MAX_TS = 253402300800.0  # 10000-01-01: a producer's time must be before it
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def delivery_batch(topic: bytes, flat: list[Any]) -> list[bytes]:
    """A delivery batch of ``flat`` (``seq, producer, ts, uuid, data`` per event)."""
    return [topic, BATCH, _packb(flat)]


def decode_batch_fields(frames: Sequence[bytes]) -> tuple[str, list[Any]]:
    """A delivery batch's topic and flat fields (a whole number of events; the
    fields' types not checked: ``decode_batch`` does)."""
    if len(frames) != 3 or frames[1] != BATCH:
        raise ProtocolError("expected a delivery batch: topic, EMQB, events")
    try:
        topic = bytes(frames[0]).decode("utf-8")
        flat = msgpack.unpackb(frames[2], raw=False, use_list=True)
    except (UnicodeDecodeError, ValueError, msgpack.UnpackException, TypeError) as exc:
        raise ProtocolError(f"bad delivery batch: {exc}") from None
    if type(flat) is not list or len(flat) % BATCH_FIELDS:
        raise ProtocolError("bad delivery batch: not a list of 5 fields per event")
    return topic, flat


def decode_batch(frames: Sequence[bytes]) -> list[Event]:
    """A delivery batch's events, in order (the data stays MessagePack)."""
    topic, flat = decode_batch_fields(frames)
    events = []
    try:
        for i in range(0, len(flat), BATCH_FIELDS):
            seq, producer, ts, uuid, data = flat[i : i + BATCH_FIELDS]
            if (
                type(seq) is not int
                or type(producer) is not str
                or type(uuid) is not bytes
                or type(data) is not bytes
            ):
                raise TypeError("bad field types")
            events.append(Event(seq, topic, data, producer, uuid, float(ts), MSGPACK))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad delivery batch: {exc}") from None
    return events


def pubs(topic: bytes, content_type: str, producer: bytes, flat: list[Any]) -> list[bytes]:
    """A publish batch of ``flat`` (``ts, uuid, data`` per event)."""
    return [PUBS, topic, (content_type or MSGPACK).encode(), producer, _packb(flat)]


@dataclass(frozen=True, slots=True)
class Pubs:
    topic: str
    producer: str
    content_type: str
    events: list[tuple[float, bytes, bytes]]  # ts, uuid (16 bytes or b""), data


def decode_pubs(frames: Sequence[bytes]) -> Pubs:
    """A producer's publish batch; every event checked as a PUB's would be."""
    if len(frames) != 5 or frames[0] != PUBS:
        raise ProtocolError("expected a publish batch: EMQPUBS, topic, type, producer, events")
    _, topic_raw, ctype_raw, producer, packed = frames
    if not topic_raw or len(topic_raw) > MAX_TOPIC_BYTES:
        raise ProtocolError(f"bad topic of {len(topic_raw)} bytes (1 to {MAX_TOPIC_BYTES})")
    if len(producer) > MAX_FIELD:
        raise ProtocolError("producer id too long")
    ctype = bytes(ctype_raw).decode("ascii", "replace")
    if ctype not in CONTENT_TYPES:
        raise ProtocolError(f"unknown content type {ctype[:64]!r}")
    try:
        topic = bytes(topic_raw).decode("utf-8")
        producer_id = bytes(producer).decode("utf-8")
        flat = msgpack.unpackb(packed, raw=False, use_list=True)
    except (UnicodeDecodeError, ValueError, msgpack.UnpackException, TypeError) as exc:
        raise ProtocolError(f"bad publish batch: {exc}") from None
    if type(flat) is not list or len(flat) % PUBS_FIELDS:
        raise ProtocolError("bad publish batch: not a list of 3 fields per event")
    if len(flat) > MAX_PUBS_EVENTS * PUBS_FIELDS:
        raise ProtocolError(f"publish batch of more than {MAX_PUBS_EVENTS} events")
    events = []
    for i in range(0, len(flat), PUBS_FIELDS):
        ts, uuid, data = flat[i : i + PUBS_FIELDS]
        if type(ts) not in (float, int) or type(uuid) is not bytes or type(data) is not bytes:
            raise ProtocolError("bad publish batch: an event is not (ts, uuid, data)")
        if uuid and len(uuid) != 16:
            raise ProtocolError("bad publish batch: a UUID is not 16 bytes")
        if not 0 <= ts < MAX_TS:
            raise ProtocolError(f"bad publish batch: timestamp {ts!r} out of range")
        if ctype == MSGPACK:
            check_msgpack(data)
        events.append((float(ts), uuid, data))
    return Pubs(topic, producer_id, ctype, events)


# ---- emq's confirmed publish (``emq.publish``, ``emq.publish_many``) -------------------
#
# On the collector, beside the Event BUS PUB (never answered, as its document has
# it): ``PUBC, batch id, topic, content type, producer, packed`` is a publish batch
# (as ``pubs``) with an id, increasing per connection. The broker answers once per
# loop turn and connection, after the turn's events are numbered and written to the
# journal: ``PUBOK, id`` confirms every batch up to that id; ``PUBNO, first id,
# last id, reason`` refuses those batches (a malformed one, or a journal that failed
# to keep them). The first frames are not UTF-8, so never a PUB's topic.

PUBC = b"\xffEMQPUBC"
PUBOK = b"\xffEMQOK"
PUBNO = b"\xffEMQNO"
MAX_REASON = 512


def confirmed_pubs(
    batch_id: int, topic: bytes, content_type: str, producer: bytes, flat: list[Any]
) -> list[bytes]:
    """A publish batch of ``flat`` (``ts, uuid, data`` per event) to be confirmed."""
    return [
        PUBC,
        b"%d" % batch_id,
        topic,
        (content_type or MSGPACK).encode(),
        producer,
        _packb(flat),
    ]


def decode_batch_id(raw: bytes) -> int:
    if not raw.isdigit() or len(raw) > 20:
        raise ProtocolError(f"bad publish batch id {bytes(raw[:32])!r}: expected ASCII decimal")
    return int(raw)


def decode_confirmed_pubs(frames: Sequence[bytes]) -> tuple[int, Pubs]:
    """A publish batch to confirm: its id and its events (``decode_pubs``). Raises
    ``ProtocolError``; the id is read first, so a refusal can name it."""
    if len(frames) != 6 or frames[0] != PUBC:
        raise ProtocolError(
            "expected a confirmed publish batch: PUBC, id, topic, type, producer, events"
        )
    batch_id = decode_batch_id(frames[1])
    return batch_id, decode_pubs([PUBS, *frames[2:]])


def pub_confirmed(upto: int) -> list[bytes]:
    return [PUBOK, b"%d" % upto]


def pub_refused(first: int, last: int, reason: str) -> list[bytes]:
    return [PUBNO, b"%d" % first, b"%d" % last, reason.encode("utf-8", "replace")[:MAX_REASON]]


@dataclass(frozen=True, slots=True)
class Confirmation:
    ok: bool
    first: int  # PUBOK: 0 (every batch up to ``last``)
    last: int
    reason: str


def decode_confirmation(frames: Sequence[bytes]) -> Confirmation:
    if len(frames) == 2 and frames[0] == PUBOK:
        return Confirmation(True, 0, decode_batch_id(frames[1]), "")
    if len(frames) == 4 and frames[0] == PUBNO:
        reason = bytes(frames[3]).decode("utf-8", "replace")
        return Confirmation(False, decode_batch_id(frames[1]), decode_batch_id(frames[2]), reason)
    raise ProtocolError("expected a publish confirmation (PUBOK or PUBNO)", frames)
