"""Counting the connections libzmq refuses before ZAP sees them.

A plain-text peer (no key at all) or one that has the wrong server key fails the
CURVE handshake inside libzmq: the ZAP handler never hears of it. This thread
reads the broker sockets' monitor events for failed handshakes and counts them
(``handshake_failed``), logging the port and libzmq's reason within a budget.
ZAP refusals show here too (``EVENT_HANDSHAKE_FAILED_AUTH``) but are counted by
the ZAP handler, which knows the key.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
LOG_BUDGET = 100


class HandshakeWatch:
    def __init__(self, context: zmq.Context[Any]) -> None:
        self.context = context
        self.counters: Counter[str] = Counter(handshake_failed=0)
        self._monitors: list[tuple[zmq.Socket[Any], str]] = []
        self._stop_endpoint = f"inproc://emq-handshakes-stop-{id(self):x}"
        self._thread: threading.Thread | None = None
        self._log_budget = LOG_BUDGET

    def watch(self, sock: zmq.Socket[Any], name: str) -> None:
        """Watch ``sock`` (before the thread starts; from the socket's thread)."""
        self._monitors.append((sock.get_monitor_socket(EVENTS), name))

    def start(self) -> None:
        stop_in = self.context.socket(zmq.PAIR)
        stop_in.linger = 0
        stop_in.bind(self._stop_endpoint)
        self._thread = threading.Thread(
            target=self._serve, args=(stop_in,), name="emq-handshakes", daemon=True
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
            pass
        self._thread.join(timeout=5)
        stop_out.close()
        self._thread = None

    def _serve(self, stop_in: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(stop_in, zmq.POLLIN)
        names = {}
        for monitor, name in self._monitors:
            poller.register(monitor, zmq.POLLIN)
            names[monitor] = name
        try:
            while True:
                ready = dict(poller.poll())
                if stop_in in ready:
                    return
                for monitor in ready:
                    event: Any = recv_monitor_message(monitor)
                    self._note(event, names[monitor])
        except zmq.ContextTerminated:
            return
        finally:
            stop_in.close(linger=0)
            for monitor, _ in self._monitors:
                monitor.close(linger=0)

    def _note(self, event: dict[str, Any], port: str) -> None:
        self.counters["handshake_failed"] += 1
        n = self.counters["handshake_failed"]
        if self._log_budget > 0 or n % 1000 == 0:
            self._log_budget -= 1
            log.warning(
                "refused a connection on the %s port (%s): the CURVE handshake failed "
                "(libzmq reason %s: plain text, or not our server key) (%d so far)",
                port,
                event.get("endpoint", b"").decode(errors="replace"),
                event.get("value"),
                n,
            )
