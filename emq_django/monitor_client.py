"""Asking the broker's monitor channel: used by ``emq_status`` and the admin."""

from __future__ import annotations

import json
import time
from typing import Any

import zmq

from emq_django import transport
from emq_django.exceptions import BrokerUnavailable
from emq_django.security.keys import FROM_SETTINGS, CurveKeys, resolve
from emq_django.transport import SocketOptions


def query(
    url: str,
    request: bytes = b"MONITOR JSON",
    timeout: float = 2.0,
    curve: CurveKeys | None | str = FROM_SETTINGS,
) -> bytes:
    """Send one monitor request; raises ``BrokerUnavailable`` after ``timeout`` s, and
    ``HandshakeRefused`` (a ``BrokerUnavailable``) as soon as the broker refuses the
    connection's handshake (a key without the monitor role, or none where CURVE is
    on). ``curve``: CURVE keys, by default this process's (``EMQ_CURVE_*``)."""
    context: zmq.Context[Any] = zmq.Context.instance()
    keys = resolve(curve)
    sock, watch = transport.connect_watched(
        context, zmq.REQ, url, SocketOptions(curve=keys), role="monitor"
    )
    try:
        deadline = time.monotonic() + timeout
        if watch.send(sock, [request], int(timeout * 1000)):
            items = [(sock, zmq.POLLIN), (watch.pair, zmq.POLLIN)]
            while (left := deadline - time.monotonic()) > 0:
                ready = dict(zmq.zmq_poll(items, max(int(left * 1000), 1)))
                if watch.pair in ready:
                    watch.check()
                if sock in ready:
                    return sock.recv()
        raise BrokerUnavailable(
            f"broker unreachable at {url}: the monitor channel did not answer within {timeout:g} s"
        )
    finally:
        watch.close()  # (first: HandshakeWatch.close)
        sock.close()


def status(url: str, timeout: float = 2.0) -> dict[str, Any]:
    doc = json.loads(query(url, b"MONITOR JSON", timeout))
    if not isinstance(doc, dict):
        raise BrokerUnavailable(f"the monitor at {url} answered something that is not a document")
    return doc
