"""Asking the broker's monitor channel: used by ``emq_status`` and the admin."""

from __future__ import annotations

import json
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
    """Send one monitor request; raises ``BrokerUnavailable`` after ``timeout`` s.
    ``curve``: CURVE keys, by default this process's (``EMQ_CURVE_*``)."""
    context: zmq.Context[Any] = zmq.Context.instance()
    keys = resolve(curve)
    sock = transport.connect(context, zmq.REQ, url, SocketOptions(curve=keys))
    try:
        sock.send(request)
        if not sock.poll(int(timeout * 1000)):
            raise BrokerUnavailable(
                f"broker unreachable at {url}: the monitor channel did not "
                f"answer within {timeout:g} s"
            )
        return sock.recv()
    finally:
        sock.close()


def status(url: str, timeout: float = 2.0) -> dict[str, Any]:
    doc = json.loads(query(url, b"MONITOR JSON", timeout))
    if not isinstance(doc, dict):
        raise BrokerUnavailable(f"the monitor at {url} answered something that is not a document")
    return doc
