"""Asking the broker's monitor channel: used by ``emq_status`` and the admin."""

from __future__ import annotations

import json
import time
from typing import Any

import zmq

from emq_django import transport
from emq_django.exceptions import BrokerUnavailable, JobRefused
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
    if transport.is_failover(url):
        return _query_brokers(context, url, request, timeout, keys)
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


def command(*words: str) -> dict[str, Any]:
    """One monitor command to ``EMQ_MONITOR_URL`` (the admin's actions and live
    pages), its JSON answer; raises ``BrokerUnavailable``, or ``JobRefused`` for
    the broker's ERROR with its reason."""
    from emq_django.conf import cached_settings

    settings = cached_settings()
    answer = query(settings.MONITOR_URL, " ".join(words).encode(), settings.MONITOR_TIMEOUT)
    if answer.startswith(b"ERROR"):
        raise JobRefused(answer.decode(errors="replace"))
    doc = json.loads(answer)
    if not isinstance(doc, dict):
        raise JobRefused(f"the monitor answered {doc!r}")
    return doc


def status(url: str, timeout: float = 2.0) -> dict[str, Any]:
    doc = json.loads(query(url, b"MONITOR JSON", timeout))
    if not isinstance(doc, dict):
        raise BrokerUnavailable(f"the monitor at {url} answered something that is not a document")
    return doc


def _standby(answer: bytes) -> bool:
    """A standby broker's answer (``broker/ha.py``): an error naming the active
    broker, or a MONITOR JSON whose ``ha`` section says ``standby``."""
    if answer.startswith(b"ERROR standby"):
        return True
    if not answer.startswith(b"{") or b"standby" not in answer:
        return False
    try:
        doc = json.loads(answer)
    except ValueError:
        return False
    return isinstance(doc, dict) and (doc.get("ha") or {}).get("role") == "standby"


def _query_brokers(
    context: zmq.Context[Any], url: str, request: bytes, timeout: float, keys: Any
) -> bytes:
    """``query`` of a failover list (``tcp://a:47293,tcp://b:47293``): every broker
    is asked at once, and the active one's answer is returned as soon as it comes;
    a standby's (which names the active one) only when no active broker answered
    within ``timeout``. Raises ``BrokerUnavailable`` when none answered."""
    asked = []
    try:
        for address in transport.addresses(url):
            asked.append(
                transport.connect_watched(
                    context, zmq.REQ, address, SocketOptions(curve=keys), role="monitor"
                )
            )
        for sock, _ in asked:
            sock.send(request, zmq.NOBLOCK)  # (a REQ queues for a broker not connected yet)
        deadline = time.monotonic() + timeout
        fallback: bytes | None = None
        pending = {sock: watch for sock, watch in asked}
        while pending and (left := deadline - time.monotonic()) > 0:
            items = [(s, zmq.POLLIN) for s in pending] + [
                (w.pair, zmq.POLLIN) for w in pending.values()
            ]
            ready = dict(zmq.zmq_poll(items, max(int(left * 1000), 1)))
            for sock, watch in list(pending.items()):
                if watch.pair in ready:
                    watch.check()  # a refusal with its reason: HandshakeRefused
                if sock in ready:
                    del pending[sock]
                    answer = sock.recv()
                    if not _standby(answer):
                        return answer
                    fallback = fallback or answer
        if fallback is not None:
            return fallback
        raise BrokerUnavailable(
            f"broker unreachable at {url}: no monitor channel answered within {timeout:g} s"
        )
    finally:
        for sock, watch in asked:
            watch.close()  # (first: HandshakeWatch.close)
            sock.close(linger=0)
