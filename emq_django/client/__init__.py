"""The client: how Django code sends jobs to the broker and gets their results.

- ``interface``: the small transport interface (``Transport``: send, wait,
  stream, cancel) that ``Task`` and the result handles use;
- the eMQP implementation, ``Client`` (``core``), in layers: ``state`` (its
  attributes), ``connection`` (the socket), ``incarnations`` (which broker
  answers, and what a change of broker means: failover), ``inbox`` (ACKs, replies, partials
  and the waits for them), ``sending`` (the ACK window and coalescing into
  REQUESTS), ``batches`` (``send_batch``);
- ``lifetime`` (the fork and exit hooks, the flusher thread) and ``process``
  (this process's client: ``get_client()``, ``install_client()``).
"""

from __future__ import annotations

from emq_django.client.core import Client
from emq_django.client.inbox import MAX_KEPT_REPLIES, refusal
from emq_django.client.interface import Transport
from emq_django.client.process import current_client, get_client, install_client, reset_client

_refusal = refusal  # (the name it had)

__all__ = [
    "MAX_KEPT_REPLIES",
    "Client",
    "Transport",
    "current_client",
    "get_client",
    "install_client",
    "refusal",
    "reset_client",
]
