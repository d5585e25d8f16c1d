"""A PZQ producer and consumer written from the document
(specs/pzq-sockets-and-formats.txt and WIRE-NOTES.md) with plain pyzmq, never with
``emq_django.protocol``: what a foreign program would write. Shared by the e2e tests
(tests/e2e/test_pzq.py) and the fault-injection suite (tests/faults/)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import zmq

_open: list[zmq.Socket[Any]] = []  # closed by close_all() (a test's teardown)


def connect(ctx: zmq.Context[Any], kind: int, url: str) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.connect(url)
    _open.append(sock)
    return sock


def close_all() -> None:
    """Close every socket made here (an unclosed one warns when collected)."""
    while _open:
        _open.pop().close(linger=0)


class Producer:
    """A DEALER on the receive socket: ``[id, '', body...]``, answered ``[id, '1'|'0',
    '', text]``."""

    def __init__(self, ctx: zmq.Context[Any], url: str) -> None:
        self.sock = connect(ctx, zmq.DEALER, url)

    def send(self, msg_id: bytes, *body: bytes) -> None:
        self.sock.send_multipart([msg_id, b"", *body])

    def answers(self, n: int, timeout: float = 20.0) -> dict[bytes, tuple[bytes, bytes]]:
        got: dict[bytes, tuple[bytes, bytes]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(got)} of {n} answers"
            if self.sock.poll(int(left * 1000)):
                frames = self.sock.recv_multipart()
                delimiter = frames.index(b"", 1)
                got[frames[0]] = (frames[1], b"".join(frames[delimiter + 1 :]))
        return got


class Delivery:
    """``[pzq id, msg id, sent µs, ack timeout µs, (headers...), '', body...]``."""

    def __init__(self, frames: list[bytes]) -> None:
        self.pzq_id, self.msg_id, sent, timeout = frames[:4]
        self.sent_us, self.timeout_us = int(sent), int(timeout)
        delimiter = frames.index(b"", 4)
        self.body = frames[delimiter + 1 :]


class Consumer:
    """A ROUTER connected to the send socket; acks ``[pzq id, msg id, '1'|'0']``."""

    def __init__(self, ctx: zmq.Context[Any], url: str) -> None:
        self.sock = connect(ctx, zmq.ROUTER, url)

    def recv(self, timeout: float = 10.0) -> Delivery | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return Delivery(self.sock.recv_multipart())

    def ack(self, d: Delivery, ok: bool = True) -> None:
        self.sock.send_multipart([d.pzq_id, d.msg_id, b"1" if ok else b"0"])


class ConfirmingProducer:
    """The producer the document describes for many messages: it keeps a list of the
    messages sent and marks off the ids answered '1'. A message answered '0', or not
    answered within ``resend_after`` seconds (a broker that died), is sent again
    under the same id, so it may be stored twice; ``sends`` counts each id's sends.

    Each message's id and body are its key. Wall-clock times of each key's first
    send and of its '1' are kept, so that a test can name the messages that were
    unconfirmed at a given moment. Run it in one thread (its socket is made there)."""

    def __init__(self, url: str, window: int = 2000, resend_after: float = 5.0) -> None:
        self.url = url
        self.window = window
        self.resend_after = resend_after
        self.first_sent: dict[str, float] = {}
        self.confirmed_at: dict[str, float] = {}
        self.sends: Counter[str] = Counter()
        self.refused = 0
        self.outstanding = 0  # read by other threads: a plain int, never iterated

    def run(
        self,
        keys: Iterable[str],
        on_confirm: Callable[[str], None],
        timeout: float = 240.0,
    ) -> None:
        """Send every key, at most ``window`` unconfirmed at a time, until each one is
        answered '1'; ``on_confirm`` is called once per key, at its first '1'."""
        ctx: zmq.Context[Any] = zmq.Context()
        sock = connect(ctx, zmq.DEALER, self.url)
        sock.sndhwm = 0  # never drop nor block on our own sends while the broker is away
        todo = list(keys)
        todo.reverse()
        waiting: dict[str, float] = {}  # key -> monotonic time of its last send
        deadline = time.monotonic() + timeout
        try:
            while todo or waiting:
                assert time.monotonic() < deadline, (
                    f"{len(self.confirmed_at)} confirmed, {len(waiting)} unanswered"
                )
                while todo and len(waiting) < self.window:
                    self._send(sock, todo.pop(), waiting)
                if sock.poll(200):
                    for _ in range(1000):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._answer(sock, frames, waiting, on_confirm)
                now = time.monotonic()
                for key in [k for k, t in waiting.items() if now - t > self.resend_after]:
                    self._send(sock, key, waiting)
                self.outstanding = len(waiting)
        finally:
            sock.close(linger=0)
            ctx.destroy(linger=0)

    def _send(self, sock: zmq.Socket[Any], key: str, waiting: dict[str, float]) -> None:
        raw = key.encode()
        sock.send_multipart([raw, b"", raw])
        waiting[key] = time.monotonic()
        self.first_sent.setdefault(key, time.time())
        self.sends[key] += 1

    def _answer(
        self,
        sock: zmq.Socket[Any],
        frames: list[bytes],
        waiting: dict[str, float],
        on_confirm: Callable[[str], None],
    ) -> None:
        key = frames[0].decode()
        if key not in waiting:
            return  # the answer to an earlier send of a key confirmed already
        if frames[1] == b"1":
            del waiting[key]
            self.confirmed_at[key] = time.time()
            on_confirm(key)
        else:
            self.refused += 1
            self._send(sock, key, waiting)

    def unconfirmed_at(self, t: float) -> set[str]:
        """The keys sent before wall-clock ``t`` and confirmed after it (or never)."""
        return {
            key
            for key, sent in self.first_sent.items()
            if sent <= t and self.confirmed_at.get(key, float("inf")) >= t
        }

    def resent(self) -> set[str]:
        return {key for key, n in self.sends.items() if n > 1}
