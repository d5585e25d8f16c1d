"""Counting the connections libzmq refuses before ZAP sees them.

A plain-text peer (no key at all) or one that has the wrong server key fails the
CURVE handshake inside libzmq: the ZAP handler never hears of it. This thread
reads the broker sockets' monitor events for failed handshakes and counts them
(``handshake_failed``), logging the port and libzmq's reason within a budget.
ZAP refusals show here too (``EVENT_HANDSHAKE_FAILED_AUTH``) but are counted by
the ZAP handler, which knows the key.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from emq_django.security.service import SocketThread

log = logging.getLogger(__name__)

EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
LOG_BUDGET = 100
_ids = itertools.count()


class HandshakeWatch(SocketThread):
    thread_name = "emq-handshakes"

    def __init__(self, context: zmq.Context[Any]) -> None:
        super().__init__(context)
        self.counters: Counter[str] = Counter(handshake_failed=0)
        self._monitors: dict[zmq.Socket[Any], str] = {}
        self._log_budget = LOG_BUDGET

    def watch(self, sock: zmq.Socket[Any], name: str) -> None:
        """Watch ``sock`` (before the thread starts; from the socket's thread)."""
        address = f"inproc://emq-handshake-failures-{os.getpid()}-{next(_ids)}"
        sock.monitor(address, EVENTS)
        pair: zmq.Socket[Any] = sock.context.socket(zmq.PAIR)
        pair.linger = 0
        # unbounded (transport.HandshakeWatch._monitor says why): a flood of failed
        # handshakes faster than this thread reads must never stop the broker's I/O
        # thread, which libzmq's blocking monitor sends would at the high-water mark
        pair.rcvhwm = 0
        pair.connect(address)
        self._monitors[pair] = name

    def start(self) -> None:
        self._start(list(self._monitors))

    def _on_readable(self, sock: zmq.Socket[Any]) -> None:
        event: Any = recv_monitor_message(sock)
        self._note(event, self._monitors[sock])

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
