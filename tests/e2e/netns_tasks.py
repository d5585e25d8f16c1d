"""Tasks for tests/e2e/test_netns.py, loaded by its job manager through EMQ_IMPORTS.

``seal`` returns a digest of its argument, never the argument itself: a sniffed
REPLY then cannot be what carries the secret, only the REQUEST can.
"""

from __future__ import annotations

import hashlib
import socket

import emq_django as emq


@emq.task(queue="netns")
def seal(secret: str) -> dict[str, str]:
    return {
        "sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "host": socket.gethostname(),
    }
