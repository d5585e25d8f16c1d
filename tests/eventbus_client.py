"""An Event BUS client for the tests, written from the protocol document
(/work/shared/specs/event-bus-protocol.txt) and WIRE-NOTES (ASCII decimal
sequence numbers, subtrees joined by ``,``, MessagePack data), with pyzmq and
msgpack only: a peer independent of the broker's own code, so the tests check the
wire, not our codec against itself.

- snapshot: a DEALER sends ``SYNCSTART, subtrees, sequence`` and reads ``SYNC``
  messages until ``SYNCEND``;
- subscriber: a SUB on the publisher port, filtering on the topic frame;
- producer: a DEALER sends ``topic, seq, producer, timestamp, uuid, data`` to the
  collector (the bus ignores the seq frame).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack
import zmq


@dataclass
class BusEvent:
    topic: str
    seq: int
    producer: str
    timestamp: str
    uuid: str
    data: Any  # unpacked MessagePack


def _event(frames: list[bytes]) -> BusEvent:
    topic, seq, producer, timestamp, event_uuid, data = frames
    return BusEvent(
        topic.decode(),
        int(seq.decode("ascii")),
        producer.decode(),
        timestamp.decode(),
        event_uuid.decode(),
        msgpack.unpackb(data, raw=False),
    )


def iso_now() -> str:
    """``Date.toISOString()``'s form."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BusClient:
    """One client's three connections (made when first used)."""

    def __init__(
        self,
        snapshot: str,
        publisher: str,
        collector: str,
        context: zmq.Context[Any] | None = None,
        rcvhwm: int | None = None,
        track: list[zmq.Socket[Any]] | None = None,
    ) -> None:
        """``track``: a list every socket made is added to (a fixture closes them
        before terminating the context, even when a test fails)."""
        self.urls = {"snapshot": snapshot, "publisher": publisher, "collector": collector}
        self.context = context or zmq.Context.instance()
        self.rcvhwm = rcvhwm
        self.track = track if track is not None else []
        self._snapshot: zmq.Socket[Any] | None = None
        self._sub: zmq.Socket[Any] | None = None
        self._pub: zmq.Socket[Any] | None = None

    def _socket(self, kind: int, url: str) -> zmq.Socket[Any]:
        sock = self.context.socket(kind)
        sock.linger = 2000 if kind == zmq.DEALER else 0
        if self.rcvhwm is not None:
            sock.rcvhwm = self.rcvhwm
        sock.connect(url)
        self.track.append(sock)
        return sock

    # ---- snapshot ---------------------------------------------------------------------

    def sync(
        self, subtrees: str = "", since: int = 0, timeout: float = 30.0
    ) -> tuple[list[BusEvent], int]:
        """SYNCSTART; the SYNC events and the SYNCEND's sequence."""
        if self._snapshot is None:
            self._snapshot = self._socket(zmq.DEALER, self.urls["snapshot"])
        sock = self._snapshot
        sock.send_multipart([b"SYNCSTART", subtrees.encode(), str(since).encode()])
        events = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                raise TimeoutError(f"no SYNCEND within {timeout} s ({len(events)} SYNCs)")
            frames = sock.recv_multipart()
            if frames[0] == b"SYNC":
                events.append(_event(frames[1:]))
            elif frames[0] == b"SYNCEND":
                assert frames[1] == subtrees.encode(), frames
                return events, int(frames[2].decode("ascii"))
            else:
                raise AssertionError(f"unexpected on the snapshot: {frames!r}")

    def send_raw_snapshot(self, frames: list[bytes]) -> None:
        if self._snapshot is None:
            self._snapshot = self._socket(zmq.DEALER, self.urls["snapshot"])
        self._snapshot.send_multipart(frames)

    # ---- subscriber -------------------------------------------------------------------

    def subscribe(self, *subtrees: str) -> zmq.Socket[Any]:
        if self._sub is None:
            self._sub = self._socket(zmq.SUB, self.urls["publisher"])
        for subtree in subtrees or ("",):
            self._sub.setsockopt(zmq.SUBSCRIBE, subtree.encode())
        return self._sub

    def receive(self, timeout: float = 10.0) -> BusEvent | None:
        assert self._sub is not None, "subscribe() first"
        if not self._sub.poll(int(timeout * 1000)):
            return None
        return _event(self._sub.recv_multipart())

    def receive_n(self, n: int, timeout: float = 30.0) -> list[BusEvent]:
        got: list[BusEvent] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and (left := deadline - time.monotonic()) > 0:
            event = self.receive(left)
            if event is not None:
                got.append(event)
        return got

    # ---- producer ---------------------------------------------------------------------

    def publish(self, topic: str, data: Any, producer: str = "test-producer") -> None:
        self.publish_raw(
            [
                topic.encode(),
                b"",
                producer.encode(),
                datetime.now(UTC)
                .isoformat(timespec="milliseconds")
                .replace("+00:00", "Z")
                .encode(),
                str(uuid.uuid4()).encode(),
                msgpack.packb(data),
            ]
        )

    def publish_raw(self, frames: list[bytes]) -> None:
        if self._pub is None:
            self._pub = self._socket(zmq.DEALER, self.urls["collector"])
        self._pub.send_multipart(frames)

    def close(self) -> None:
        for sock in (self._snapshot, self._sub, self._pub):
            if sock is not None:
                sock.close()
        self._snapshot = self._sub = self._pub = None
