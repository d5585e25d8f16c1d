"""Tasks for tests/e2e/test_netns.py, loaded by its job manager through EMQ_IMPORTS.

``seal`` returns a digest of its argument, never the argument itself: a sniffed
REPLY then cannot be what carries the secret, only the REQUEST can. It also says
which job manager ran it (``NETNS_JM_NAME`` in the job manager's environment).
"""

from __future__ import annotations

import hashlib
import os

import emq_django as emq


@emq.task(queue="netns")
def seal(secret: str) -> dict[str, str]:
    return {
        "sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "jm": os.environ.get("NETNS_JM_NAME", ""),
    }
