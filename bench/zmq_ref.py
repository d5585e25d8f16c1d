"""Physical reference: a minimal ROUTER-to-ROUTER forwarder with LRU workers.

    python -m bench.zmq_ref forwarder FRONT_URL BACK_URL
    python -m bench.zmq_ref worker BACK_URL [CREDIT]

Clients (DEALER) send [body] to the frontend ROUTER; workers (DEALER) announce
themselves with one READY per free slot on the backend ROUTER; the forwarder
hands each request to the least recently ready worker as [worker, client, body]
and sends the reply [client, body] back. Requests wait in a deque when no
worker is ready. Every socket drains until EAGAIN before polling again.

An empty body is the no-op job: the worker sends the harness's completion
signal (``bench/donesignal.py``, the same PUSH every system's no-op task sends)
and returns its credit with a READY instead of a reply, as a job sent without
a reply would. Any other body is echoed back as the job's result.
"""

from __future__ import annotations

import sys
from collections import deque

import zmq

from bench.donesignal import mark_done

READY = b"READY"


def _socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    s = ctx.socket(kind)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.LINGER, 0)
    return s


def forwarder(front_url: str, back_url: str) -> None:
    ctx = zmq.Context()
    front = _socket(ctx, zmq.ROUTER)
    back = _socket(ctx, zmq.ROUTER)
    front.setsockopt(zmq.ROUTER_MANDATORY, 1)
    back.setsockopt(zmq.ROUTER_MANDATORY, 1)
    front.bind(front_url)
    back.bind(back_url)
    ready: deque[bytes] = deque()
    pending: deque[tuple[bytes, bytes]] = deque()
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    noblock = zmq.NOBLOCK
    while True:
        poller.poll()
        while True:  # replies and READYs from workers
            try:
                frames = back.recv_multipart(noblock)
            except zmq.Again:
                break
            ready.append(frames[0])
            if len(frames) == 3:
                front.send_multipart(frames[1:], noblock)
            if pending:
                client, body = pending.popleft()
                back.send_multipart([ready.popleft(), client, body], noblock)
        while True:  # requests from clients
            try:
                client, body = front.recv_multipart(noblock)
            except zmq.Again:
                break
            if ready:
                back.send_multipart([ready.popleft(), client, body], noblock)
            else:
                pending.append((client, body))


def worker(back_url: str, credit: int) -> None:
    ctx = zmq.Context()
    sock = _socket(ctx, zmq.DEALER)
    sock.connect(back_url)
    for _ in range(credit):
        sock.send(READY)
    while True:
        client, body = sock.recv_multipart()
        if body:
            sock.send_multipart([client, body])  # the result: the body, echoed
        else:
            mark_done()
            sock.send(READY)


def main(argv: list[str]) -> None:
    if argv[0] == "forwarder":
        forwarder(argv[1], argv[2])
    elif argv[0] == "worker":
        worker(argv[1], int(argv[2]) if len(argv) > 2 else 1)
    else:
        raise SystemExit(f"unknown role {argv[0]!r}: use forwarder or worker")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        pass
