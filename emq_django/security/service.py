"""A thread that serves some ZeroMQ sockets until it is told to stop.

The ZAP handler and the handshake watch both run beside the broker's loop on its
context: each polls its own sockets plus an inproc PAIR that ``stop()`` writes to,
and closes its sockets when it ends (on ``stop()`` or when the context ends).
"""

from __future__ import annotations

import threading
from typing import Any

import zmq


class SocketThread:
    """Subclasses set ``thread_name`` and implement ``_on_readable(sock)``; they
    hand their sockets to ``_start`` (which then belong to the thread)."""

    thread_name = "emq-sockets"

    def __init__(self, context: zmq.Context[Any]) -> None:
        self.context = context
        self._stop_endpoint = f"inproc://{self.thread_name}-stop-{id(self):x}"
        self._thread: threading.Thread | None = None

    def _start(self, sockets: list[zmq.Socket[Any]]) -> None:
        stop_in = self.context.socket(zmq.PAIR)
        stop_in.linger = 0
        stop_in.bind(self._stop_endpoint)
        self._thread = threading.Thread(
            target=self._serve, args=(stop_in, sockets), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        stop_out = self.context.socket(zmq.PAIR)
        stop_out.linger = 0
        stop_out.connect(self._stop_endpoint)
        try:
            stop_out.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass  # the thread is gone already
        self._thread.join(timeout=5)
        stop_out.close()
        self._thread = None

    def _serve(self, stop_in: zmq.Socket[Any], sockets: list[zmq.Socket[Any]]) -> None:
        poller = zmq.Poller()
        poller.register(stop_in, zmq.POLLIN)
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if stop_in in ready:
                    return
                for sock in ready:
                    self._on_readable(sock)
        except zmq.ContextTerminated:
            return
        finally:
            stop_in.close(linger=0)
            for sock in sockets:
                sock.close(linger=0)

    def _on_readable(self, sock: zmq.Socket[Any]) -> None:
        raise NotImplementedError
