"""A minimal Majordomo echo worker in plain pyzmq (majortomo's framing), for
bench/mdp_bench.py: it answers each REQUEST at once with a FINAL of the same
frames, so that the broker, not the worker, is what the benchmark measures.

    python bench/mdp_echo_worker.py URL SERVICE
"""

from __future__ import annotations

import signal
import sys
import time

import zmq

W = b"MDPW02"
READY, REQUEST, FINAL, HEARTBEAT, DISCONNECT = b"\x01", b"\x02", b"\x04", b"\x05", b"\x06"


def main() -> None:
    url, service = sys.argv[1], sys.argv[2].encode()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(url)
    sock.send_multipart([b"", W, READY, service])
    last_beat = time.monotonic()
    while True:
        if sock.poll(1000):
            frames = sock.recv_multipart()
            if frames[2] == REQUEST:
                # ['', W, REQUEST, client, '', body...] -> ['', W, FINAL, client, '', body...]
                sock.send_multipart([b"", W, FINAL, *frames[3:]])
            elif frames[2] == DISCONNECT:
                sock.send_multipart([b"", W, READY, service])
        now = time.monotonic()
        if now - last_beat >= 1.0:
            sock.send_multipart([b"", W, HEARTBEAT])
            last_beat = now


if __name__ == "__main__":
    main()
