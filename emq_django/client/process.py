"""This process's client: made on first use (again after a fork), or installed
(``emq_django.testing``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from emq_django.client import lifetime
from emq_django.client.core import Client

log = logging.getLogger(__name__)

_client: Client | None = None
_client_pid = 0
_client_lock = threading.Lock()
_orphans: list[Client] = []  # a parent's clients, never touched in a forked child


def get_client() -> Client:
    """This process's client, created on first use (again after a fork)."""
    global _client, _client_pid
    client = _client
    if client is not None and _client_pid == lifetime._pid:
        return client
    with _client_lock:
        if _client is None or _client_pid != os.getpid():
            from emq_django.conf import cached_settings

            s = cached_settings()
            if _client is not None:
                _orphans.append(_client)
            _client = Client(s.BROKER_URL, ack_timeout=s.ACK_TIMEOUT, window=s.ACK_WINDOW)
            _client_pid = os.getpid()
        return _client


def reset_client(**kwargs: Any) -> None:
    """Forget this process's client (after settings change, in tests)."""
    global _client
    with _client_lock:
        if _client is not None and _client_pid == os.getpid():
            _client.close()
        _client = None


def current_client() -> Client | None:
    """This process's client if one was made (or installed), without making one."""
    return _client if _client_pid == lifetime._pid else None


def install_client(client: Any) -> Callable[[], None]:
    """Make ``client`` this process's client until the returned function is called:
    ``get_client()`` returns it, so ``delay()``, ``apply_async()``, ``map()`` and the
    result handles go through it. The seam ``emq_django.testing`` puts its in-memory
    broker's client in; ``client`` has ``Client``'s sending and reply methods."""
    global _client, _client_pid
    with _client_lock:
        saved = (_client, _client_pid)
        _client, _client_pid = client, lifetime._pid

    def restore() -> None:
        global _client, _client_pid
        with _client_lock:
            if _client is client:
                _client, _client_pid = saved

    return restore
