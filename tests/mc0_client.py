"""An mc0 connector for tests, written from specs/mc0-protocol.txt and the mc0 part
of specs/WIRE-NOTES.md with plain pyzmq (it does not use emq_django.protocol.mc0,
so that a mistake there is not made twice).

A DEALER; every message starts with an empty frame: ``['', VERB, k, v, ..., '',
positional...]``. CONNECT sends VERSION, TTL (ms) and an ID; CONNECT, SUB and
UNSUB carry an ID and wait for the OK (``Mc0Refused`` on an ERROR). PUT, NOOP and
DISCONNECT carry none. Messages that arrive while waiting for an OK are kept for
``recv``.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq


class Mc0Refused(Exception):
    """The broker answered ERROR."""


@dataclass
class Received:
    """One message from the broker, parsed the way the document describes it."""

    verb: bytes
    headers: list[tuple[bytes, bytes]]
    positional: list[bytes]
    at: float = field(default_factory=time.monotonic)
    raw: list[bytes] = field(default_factory=list)

    def header(self, key: bytes) -> bytes | None:
        return dict(self.headers).get(key)


def parse(frames: list[bytes]) -> Received:
    assert frames and frames[0] == b"", f"no leading empty frame: {frames!r}"
    verb = frames[1]
    rest = frames[2:]
    end = rest.index(b"") if b"" in rest else len(rest)
    raw = rest[:end]
    assert len(raw) % 2 == 0, f"odd header frames from the broker: {frames!r}"
    return Received(verb, list(zip(raw[::2], raw[1::2], strict=True)), rest[end + 1 :], raw=frames)


SEND_TIMEOUT_MS = 5000


class Mc0Client:
    def __init__(
        self,
        ctx: zmq.Context[Any],
        url: str,
        *,
        curve: tuple[bytes, bytes, bytes] | None = None,  # (server public, our public, our secret)
    ) -> None:
        self.sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        # a socket whose handshake the broker refused may have no connection left to
        # queue on: a blocking send would wait forever (it did, under load), so a
        # send gives up after SEND_TIMEOUT and says so (``TimeoutError``)
        self.sock.sndtimeo = SEND_TIMEOUT_MS
        if curve is not None:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = curve
        self.sock.connect(url)
        self.ids = itertools.count(1)
        self.kept: deque[Received] = deque()

    def close(self) -> None:
        self.sock.close(linger=0)

    def send(
        self, verb: bytes, headers: Sequence[tuple[bytes, bytes]] = (), *positional: bytes
    ) -> None:
        frames = [b"", verb]
        for k, v in headers:
            frames += [k, v]
        if positional:
            frames.append(b"")
            frames += positional
        self.send_raw(frames)

    def send_raw(self, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart(frames)
        except zmq.Again:
            raise TimeoutError(
                f"no connection took {frames[1:2]!r} in {SEND_TIMEOUT_MS} ms"
            ) from None

    def _next(self, timeout: float) -> Received | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return parse(self.sock.recv_multipart())

    def request(
        self,
        verb: bytes,
        headers: Sequence[tuple[bytes, bytes]] = (),
        *positional: bytes,
        timeout: float = 10.0,
    ) -> Received:
        """Send with a fresh ID and wait for its OK; ERROR raises ``Mc0Refused``."""
        msg_id = str(next(self.ids)).encode()
        self.send(verb, [*headers, (b"ID", msg_id)], *positional)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {verb!r} ID {msg_id!r}")
            got = self._next(left)
            if got is None:
                continue
            if got.verb in (b"OK", b"ERROR") and got.header(b"ID") == msg_id:
                if got.verb == b"ERROR":
                    raise Mc0Refused((got.header(b"MESSAGE") or b"").decode())
                return got
            self.kept.append(got)

    def connect(self, ttl_ms: int = 30_000, version: bytes = b"0.2") -> None:
        self.request(b"CONNECT", [(b"VERSION", version), (b"TTL", str(ttl_ms).encode())])

    def sub(self, *topics: str) -> None:
        self.request(b"SUB", [], *(t.encode() for t in topics))

    def unsub(self, *topics: str) -> None:
        self.request(b"UNSUB", [], *(t.encode() for t in topics))

    def put(self, topic: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.send(b"PUT", [(b"TOPIC", topic.encode()), *headers], body)

    def noop(self) -> None:
        self.send(b"NOOP")

    def disconnect(self) -> None:
        self.send(b"DISCONNECT")

    def recv(self, timeout: float = 10.0, verb: bytes | None = None) -> Received | None:
        """The next message (of ``verb`` if given; others are kept), or None."""
        for i, got in enumerate(self.kept):
            if verb is None or got.verb == verb:
                del self.kept[i]
                return got
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            got = self._next(left)
            if got is None:
                return None
            if verb is None or got.verb == verb:
                return got
            self.kept.append(got)

    def messages(self, n: int, timeout: float = 10.0) -> list[Received]:
        """``n`` MESSAGEs (NOOPs skipped), or fewer if time runs out."""
        out: list[Received] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got = self.recv(left, verb=b"MESSAGE")
            if got is None:
                break
            out.append(got)
        return out
