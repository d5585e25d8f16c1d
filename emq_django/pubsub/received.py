"""An event as a subscriber gets it (``Received``), decoded from the broker's ``Event``."""

from __future__ import annotations

from typing import Any

import msgpack

from emq_django.protocol import eventbus
from emq_django.protocol.events import Event


class Received:
    """One event as a subscriber gets it: ``seq``, ``topic``, ``data`` (the
    MessagePack data, unpacked), ``producer``, ``uuid`` (its text, made when first
    read), ``ts`` (the producer's wall-clock time) and ``raw`` (the MessagePack
    data as received). Read-only by convention; one is made per event and per
    subscriber, so it is a plain slotted object."""

    __slots__ = ("seq", "topic", "data", "producer", "ts", "raw", "_uuid")

    def __init__(
        self, seq: int, topic: str, data: Any, producer: str, uuid: bytes, ts: float, raw: bytes
    ) -> None:
        self.seq = seq
        self.topic = topic
        self.data = data
        self.producer = producer
        self._uuid = uuid  # 16 bytes (anything else reads as "")
        self.ts = ts
        self.raw = raw

    @property
    def uuid(self) -> str:
        return eventbus.encode_uuid(self._uuid).decode()  # str(UUID), without making one

    def _key(self) -> tuple[Any, ...]:
        return (self.seq, self.topic, self.data, self.producer, self._uuid, self.ts, self.raw)

    def __eq__(self, other: object) -> bool:
        return type(other) is Received and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Received(seq={self.seq!r}, topic={self.topic!r}, data={self.data!r}, "
            f"producer={self.producer!r}, uuid={self.uuid!r}, ts={self.ts!r}, raw={self.raw!r})"
        )


_unpackb = msgpack.unpackb


def received(event: Event) -> Received:
    try:
        data = _unpackb(event.data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        data = event.data  # not MessagePack: as it came
    return Received(event.seq, event.topic, data, event.producer, event.uuid, event.ts, event.data)
