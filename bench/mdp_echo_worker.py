"""Majordomo echo workers in plain pyzmq (majortomo's framing), for
bench/mdp_bench.py: each answers a REQUEST at once with a FINAL of the same
frames, so that the broker, not the workers, is what the benchmark measures.

    python bench/mdp_echo_worker.py URL SERVICE [SOCKETS]

One process runs ``SOCKETS`` workers (default 1), each its own DEALER (its own
identity at the broker, one request at a time as Majordomo has it), all read
through one poll of their ZMQ_FDs (not ``zmq_poll``, which asks every socket
for ZMQ_EVENTS, a system call each, before and after it sleeps). A Majordomo
worker holds one request at a time, so the broker can only be kept busy with
many of them; many processes would cost more CPU (and more context switches on
a small machine) than many sockets in one.

The same workers serve both brokers of the benchmark, so what they cost per
request dilutes the ratio between the brokers; they are kept cheap:

- frames go through pyzmq's backend ``send``/``recv`` with plain integer flags
  (``send_multipart``/``recv_multipart`` cost several times the libzmq calls);
- a message whose shape is known is read frame by frame as ``bytes`` and only
  its last frame as a ``zmq.Frame``, whose ``more`` says whether anything
  follows (a ``zmq.Frame`` per frame, or asking ``RCVMORE`` per frame, cost two
  to three times as much: 5 and 7.6 µs against 1.7 µs for a 6-frame REQUEST);
- a socket with a message is read once: it holds at most one request (the
  broker sends the next after our FINAL), and it is asked for ZMQ_EVENTS again
  before the next sleep. Reading on until ``zmq.Again`` would raise an
  exception (about 4 µs) per request.
"""

from __future__ import annotations

import select
import signal
import sys
import time
from typing import Any

import zmq
from zmq.backend import Socket as _BackendSocket

W = b"MDPW02"
READY, REQUEST, FINAL, HEARTBEAT, DISCONNECT = b"\x01", b"\x02", b"\x04", b"\x05", b"\x06"
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
RCVMORE = int(zmq.RCVMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
HEARTBEAT_INTERVAL = 1.0  # seconds
_send = _BackendSocket.send
_recv = _BackendSocket.recv
_get = _BackendSocket.get


def send(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    for frame in frames[:-1]:
        _send(sock, frame, SNDMORE)
    _send(sock, frames[-1], 0)


def rest(sock: zmq.Socket[Any]) -> list[bytes]:
    """The remaining frames of the message being read."""
    parts = []
    while _get(sock, RCVMORE):
        parts.append(_recv(sock, NOBLOCK, True))
    return parts


def serve_one(sock: zmq.Socket[Any], service: bytes) -> None:
    """Read the one message the poll said waits on ``sock`` and answer it."""
    empty = _recv(sock, NOBLOCK, True)
    if empty != b"" or not _get(sock, RCVMORE):
        rest(sock)  # not majortomo's framing: dropped
        return
    header = _recv(sock, NOBLOCK, True)
    command = _recv(sock, NOBLOCK, True) if _get(sock, RCVMORE) else b""
    if header == W and command == REQUEST:
        # '' MDPW02 REQUEST client '' body... -> '' MDPW02 FINAL client '' body...
        client = _recv(sock, NOBLOCK, True)
        gap = _recv(sock, NOBLOCK, True)
        body = _recv(sock, NOBLOCK, False)
        _send(sock, b"", SNDMORE)
        _send(sock, W, SNDMORE)
        _send(sock, FINAL, SNDMORE)
        _send(sock, client, SNDMORE)
        _send(sock, gap, SNDMORE)
        while body.more:
            _send(sock, body, SNDMORE)
            body = _recv(sock, NOBLOCK, False)
        _send(sock, body, 0)
        return
    rest(sock)
    if header == W and command == DISCONNECT:
        send(sock, [b"", W, READY, service])
    # a HEARTBEAT needs no answer: ours go out every HEARTBEAT_INTERVAL


def main() -> None:
    url, service = sys.argv[1], sys.argv[2].encode()
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctx = zmq.Context()
    socks = []
    for _ in range(n):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(url)
        send(sock, [b"", W, READY, service])
        socks.append(sock)
    # Sleep in a poll of the sockets' ZMQ_FDs: zmq_poll would ask every socket
    # for ZMQ_EVENTS before and after each sleep (a system call each); a ZMQ_FD
    # only says that commands wait, and reading or sending may process them, so
    # a socket used since is asked for ZMQ_EVENTS before the next sleep.
    by_fd = {}
    poller = select.poll()
    for sock in socks:
        fd = sock.getsockopt(zmq.FD)
        by_fd[fd] = sock
        poller.register(fd, select.POLLIN)
    used = list(socks)
    next_beat = time.monotonic() + HEARTBEAT_INTERVAL
    while True:
        ready = [sock for sock in used if _get(sock, EVENTS) & POLLIN]
        used = []
        for fd, _ in poller.poll(0 if ready else 1000):
            sock = by_fd[fd]
            if sock not in ready and _get(sock, EVENTS) & POLLIN:
                ready.append(sock)
        for sock in ready:
            serve_one(sock, service)
            used.append(sock)
        now = time.monotonic()
        if now >= next_beat:
            for sock in socks:
                send(sock, [b"", W, HEARTBEAT])
            next_beat = now + HEARTBEAT_INTERVAL
            used = list(socks)


if __name__ == "__main__":
    main()
