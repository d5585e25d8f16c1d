"""Asking the broker's monitor channel: used by ``emq_status`` and the admin."""

from __future__ import annotations

import json
from typing import Any

import zmq

from emq_django import transport
from emq_django.exceptions import BrokerUnavailable


def query(url: str, request: bytes = b"MONITOR JSON", timeout: float = 2.0) -> bytes:
    """Send one monitor request; raises ``BrokerUnavailable`` after ``timeout`` s."""
    context: zmq.Context[Any] = zmq.Context.instance()
    sock = transport.connect(context, zmq.REQ, url)
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
