"""Majordomo echo workers in plain pyzmq (majortomo's framing), for
bench/mdp_bench.py: each answers a REQUEST at once with a FINAL of the same
frames, so that the broker, not the workers, is what the benchmark measures.

    python bench/mdp_echo_worker.py URL SERVICE [SOCKETS]

One process runs ``SOCKETS`` workers (default 1), each its own DEALER (its own
identity at the broker, one request at a time as Majordomo has it), all read
through one poller. A Majordomo worker holds one request at a time, so the
broker can only be kept busy with many of them; many processes would cost more
CPU (and more context switches on a small machine) than many sockets in one.
Frames go through pyzmq's backend ``send``/``recv`` with plain integer flags:
``send_multipart``/``recv_multipart`` cost several times the libzmq calls.
"""

from __future__ import annotations

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
_send = _BackendSocket.send
_recv = _BackendSocket.recv


def send(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    for frame in frames[:-1]:
        _send(sock, frame, SNDMORE)
    _send(sock, frames[-1], 0)


def recv(sock: zmq.Socket[Any]) -> list[bytes] | None:
    try:
        frame = _recv(sock, NOBLOCK, False)
    except zmq.Again:
        return None
    parts = [frame.bytes]
    while frame.more:
        frame = _recv(sock, 0, False)
        parts.append(frame.bytes)
    return parts


def main() -> None:
    url, service = sys.argv[1], sys.argv[2].encode()
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = []
    for _ in range(n):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(url)
        send(sock, [b"", W, READY, service])
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    last_beat = time.monotonic()
    while True:
        for sock, _ in poller.poll(1000):
            while (frames := recv(sock)) is not None:
                if frames[2] == REQUEST:
                    # ['', W, REQUEST, client, '', body...] -> ['', W, FINAL, client, '', body...]
                    send(sock, [b"", W, FINAL, *frames[3:]])
                elif frames[2] == DISCONNECT:
                    send(sock, [b"", W, READY, service])
        now = time.monotonic()
        if now - last_beat >= 1.0:
            for sock in socks:
                send(sock, [b"", W, HEARTBEAT])
            last_beat = now


if __name__ == "__main__":
    main()
