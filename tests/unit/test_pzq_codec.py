"""The PZQ codec (protocol/pzq.py), from the document's formats."""

from __future__ import annotations

import pytest

from emq_django.exceptions import ProtocolError
from emq_django.protocol import pzq


def test_producer_message_with_headers_and_parts() -> None:
    message = pzq.decode_produce([b"id1", b"h1", b"h2", b"", b"a", b"b"])
    assert message == pzq.Produce(b"id1", (b"h1", b"h2"), (b"a", b"b"))


@pytest.mark.parametrize(
    "frames",
    [[], [b""], [b"id"], [b"id", b"header"], [b"id", b""], [b"x" * 256, b"", b"body"]],
)
def test_malformed_producer_messages_raise_with_frames(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        pzq.decode_produce(frames)
    assert info.value.frames == frames and info.value.reason


def test_ack_and_nack() -> None:
    assert pzq.decode_ack([b"m", b"1"]) == pzq.ConsumerAck(b"m", True)
    assert pzq.decode_ack([b"m", b"0"]) == pzq.ConsumerAck(b"m", False)
    for bad in ([b"m"], [b"", b"1"], [b"m", b"OK"]):
        with pytest.raises(ProtocolError):
            pzq.decode_ack(bad)


def test_encoders_and_monitor_lines() -> None:
    assert pzq.answer(b"m", True) == [b"m", b"1", b"", b""]
    assert pzq.answer(b"m", False, b"why") == [b"m", b"0", b"", b"why"]
    assert pzq.delivery(b"m", 10, 5_000_000, [b"a"]) == [b"m", b"10", b"5000000", b"", b"a"]
    text = pzq.monitor_lines({"messages": 3, "syncs": 1})
    assert pzq.parse_monitor(text) == {"messages": "3", "syncs": "1"}


def test_packed_parts_round_trip() -> None:
    parts = [b"", b"a", b"\x00" * 70000]
    assert pzq.unpack_parts(pzq.pack_parts(parts)) == parts
    with pytest.raises(ProtocolError):
        pzq.unpack_parts(b"\x00\x00\x00\x05ab")
