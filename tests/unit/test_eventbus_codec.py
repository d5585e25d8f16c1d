"""The Event BUS codec (protocol/eventbus.py): the released bus's forms and the
document's, and refusals of malformed frames."""

from __future__ import annotations

import json
import uuid

import msgpack
import pytest

from emq_django.broker.topics import MSGPACK, OCTETS, Event
from emq_django.exceptions import ProtocolError
from emq_django.protocol import eventbus

UUID = uuid.UUID("1b4e28ba-2fa1-41d2-883f-0016d3cca427")


def test_sequence_numbers_ascii_decimal_and_the_documents_eight_bytes() -> None:
    assert eventbus.encode_seq(42) == b"42"
    assert eventbus.decode_seq(b"42") == 42
    assert eventbus.decode_seq(b"12345678") == 12345678  # eight digits: decimal
    assert eventbus.decode_seq((300).to_bytes(8, "big")) == 300
    assert eventbus.decode_seq(b"") == eventbus.decode_seq(b"null") == 0
    with pytest.raises(ProtocolError):
        eventbus.decode_seq(b"-1")
    with pytest.raises(ProtocolError):
        eventbus.decode_seq(b"\xff" * 9)


def test_syncstart_subtrees_joined_by_comma_or_semicolon() -> None:
    start = eventbus.decode_syncstart([b"SYNCSTART", b"/a/,/b/;/c/", b"7"])
    assert start.subtrees == ("/a/", "/b/", "/c/") and start.seq == 7
    assert eventbus.decode_syncstart([b"SYNCSTART", b""]).subtrees == ()
    for bad in ([b"SYNC"], [], [b"SYNCSTART", b"", b"1", b"x"], [b"SYNCSTART", b"\xff", b"1"]):
        with pytest.raises(ProtocolError):
            eventbus.decode_syncstart(bad)


def test_event_frames_as_the_released_bus_sends_them() -> None:
    event = Event(5, "/orders/1", msgpack.packb({"a": 1}), "p1", UUID.bytes, 1700000000.5)
    frames = eventbus.broadcast(event, eventbus.as_msgpack(event))
    assert frames[:5] == [
        b"/orders/1",
        b"5",
        b"p1",
        b"2023-11-14T22:13:20.500Z",
        str(UUID).encode(),
    ]
    assert msgpack.unpackb(frames[5]) == {"a": 1}
    assert eventbus.sync(event, frames[5])[0] == b"SYNC"
    assert eventbus.syncend(b"/o/", 9) == [b"SYNCEND", b"/o/", b"9"]


def test_data_is_messagepack_on_the_bus_whatever_it_came_as() -> None:
    as_json = Event(1, "/t", json.dumps({"x": [1, 2]}).encode(), content_type="application/json")
    assert msgpack.unpackb(eventbus.as_msgpack(as_json)) == {"x": [1, 2]}
    raw = Event(2, "/t", b"\x00\x01", content_type="application/octet-stream")
    assert msgpack.unpackb(eventbus.as_msgpack(raw)) == b"\x00\x01"


def test_pub_decoded_and_checked() -> None:
    frames = eventbus.pub("/a/b", "prod", 1700000000.0, UUID.bytes, msgpack.packb([1]))
    message = eventbus.decode_pub(frames)
    assert (message.topic, message.producer, message.uuid) == ("/a/b", "prod", UUID.bytes)
    assert message.ts == pytest.approx(1700000000.0)
    assert message.content_type == "application/msgpack"
    assert eventbus.decode_pub([b"", *frames]).topic == "/a/b"  # a leading delimiter
    octets = eventbus.pub("/a", "", 0.0, b"", b"raw", "application/octet-stream")
    assert eventbus.decode_pub(octets).data == b"raw"
    node = [b"/a", b"null", b"p", b"not a date", b"", msgpack.packb(1)]
    assert eventbus.decode_pub(node).ts is None  # the broker's clock then


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"/a"],
        [b"", b"1", b"p", b"", b"", msgpack.packb(1)],  # empty topic
        [b"/a", b"", b"p", b"", b"not-a-uuid", msgpack.packb(1)],
        [b"/a", b"", b"p", b"", b"", b"\xc1"],  # not MessagePack
        [b"/a", b"", b"p", b"", b"", b"\x92\x01"],  # truncated MessagePack
        [b"\xff", b"", b"p", b"", b"", msgpack.packb(1)],  # topic not UTF-8
        [b"/a", b"", b"p", b"", b"", b"x", b"text/evil"],  # unknown content type
        [b"x" * 256, b"", b"p", b"", b"", msgpack.packb(1)],
    ],
)
def test_malformed_pub_refused(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        eventbus.decode_pub(frames)


# ---- emq's batch channels ------------------------------------------------------------


def test_delivery_batch_round_trip() -> None:
    flat = [7, "prod", 1.5, b"\x03" * 16, b"\x01", 8, "prod", 1.75, b"", b"\xa1s"]
    frames = eventbus.delivery_batch(b"/t/x", flat)
    assert frames[:2] == [b"/t/x", b"EMQB"]  # a SUB's prefix filter on the topic
    events = eventbus.decode_batch(frames)
    assert [(e.seq, e.topic, e.producer, e.ts, e.uuid, e.data) for e in events] == [
        (7, "/t/x", "prod", 1.5, b"\x03" * 16, b"\x01"),
        (8, "/t/x", "prod", 1.75, b"", b"\xa1s"),
    ]


def test_publish_batch_round_trip_and_never_taken_for_a_pub() -> None:
    uuid = b"\x04" * 16
    frames = eventbus.pubs(b"/t", OCTETS, b"me", [1.0, uuid, b"raw", 2.0, b"", b"\x00"])
    assert len(frames) == 5 and frames[0] == b"EMQPUBS"
    batch = eventbus.decode_pubs(frames)
    assert (batch.topic, batch.producer, batch.content_type) == ("/t", "me", OCTETS)
    assert batch.events == [(1.0, uuid, b"raw"), (2.0, b"", b"\x00")]
    with pytest.raises(ProtocolError):
        eventbus.decode_pub(frames)  # five frames: never a PUB


@pytest.mark.parametrize(
    "frames",
    [
        [b"EMQPUBS", b"/t", MSGPACK.encode(), b"p"],  # four frames
        [b"EMQPUBS", b"", MSGPACK.encode(), b"p", msgpack.packb([])],  # no topic
        [b"EMQPUBS", b"/t", b"text/plain", b"p", msgpack.packb([])],  # unknown type
        [b"EMQPUBS", b"/t", MSGPACK.encode(), b"p", b"\xc1"],  # not MessagePack
        [b"EMQPUBS", b"/t", MSGPACK.encode(), b"p", msgpack.packb([1.0, b""])],  # 2 fields
        [b"EMQPUBS", b"/t", MSGPACK.encode(), b"p", msgpack.packb([1.0, b"", b"\xc1"])],
        [b"EMQPUBS", b"/t", OCTETS.encode(), b"p", msgpack.packb([1.0, b"short", b"x"])],
        [b"EMQPUBS", b"/t", OCTETS.encode(), b"p", msgpack.packb(["1", b"", b"x"])],
        [b"EMQPUBS", b"/t", OCTETS.encode(), b"p", msgpack.packb([float("inf"), b"", b"x"])],
        [b"EMQPUBS", b"/t", OCTETS.encode(), b"p", msgpack.packb([-1.0, b"", b"x"])],
    ],
)
def test_malformed_publish_batch_refused(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        eventbus.decode_pubs(frames)
