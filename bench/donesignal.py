"""The completion signal every system's no-op task sends: one ZeroMQ PUSH.

The task calls ``mark_done()``, which sends one empty message on a PUSH socket
connected to the harness's sink (``bench/sink.py``, address in
``BENCH_DONE_URL``). The socket is created on first use, once per process and
thread: pyzmq sockets must not be shared between threads, and a context must
not cross a fork (Celery's prefork pool forks after importing the app).
The cost (one non-blocking send, a few µs) is the same for every system.
"""

from __future__ import annotations

import os
import threading

import zmq

ENV = "BENCH_DONE_URL"

_local = threading.local()
_ctx: zmq.Context[zmq.Socket[bytes]] | None = None
_ctx_pid = 0
_ctx_lock = threading.Lock()


def _context() -> zmq.Context[zmq.Socket[bytes]]:
    global _ctx, _ctx_pid
    with _ctx_lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx, _ctx_pid = zmq.Context(), os.getpid()
        return _ctx


def _socket() -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] | None = getattr(_local, "sock", None)
    if sock is None or getattr(_local, "pid", 0) != os.getpid():
        url = os.environ.get(ENV)
        if not url:
            raise RuntimeError(f"{ENV} is not set: run the task under bench/run.py")
        sock = _context().socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop a signal
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(url)
        _local.sock, _local.pid = sock, os.getpid()
    return sock


def mark_done() -> None:
    """Tell the harness that one no-op task has run."""
    _socket().send(b"", zmq.NOBLOCK)
