"""Extension: our job manager's memory, in a sixth frame of its HEARTBEAT.

``{"rss": bytes, "processes": {"<pid>": bytes, ...}}`` in JSON: the resident set
of the job manager's own process and of each of its worker processes. It sends
one at most every few seconds (worker/memory.py); the broker keeps the last one
per job manager for its monitor (``memory_bytes``). EventMQ's job manager sends
none (its page says "not reported"); EventMQ's broker reads the timestamp frame
of a HEARTBEAT only, and takes no harm from the sixth.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from emq_django.exceptions import ProtocolError

MAX_REPORT = 16 * 1024  # bytes: a thousand worker processes' figures fit
MAX_PROCESSES = 1024


def encode_memory(rss: int, processes: dict[int, int]) -> bytes:
    doc = {"rss": rss, "processes": {str(pid): n for pid, n in processes.items()}}
    return json.dumps(doc, separators=(",", ":")).encode()


def _bytes(value: Any) -> bool:
    return type(value) is int and value >= 0


def decode_memory(frame: bytes, frames: Sequence[bytes]) -> dict[str, Any]:
    """The report, checked: a ``ProtocolError`` says what is wrong with it."""
    if len(frame) > MAX_REPORT:
        raise ProtocolError(f"HEARTBEAT memory report over {MAX_REPORT} bytes", frames)
    try:
        doc = json.loads(frame)
    except ValueError:
        raise ProtocolError("HEARTBEAT memory report is not JSON", frames) from None
    processes = doc.get("processes", {}) if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or not _bytes(doc.get("rss"))
        or not isinstance(processes, dict)
        or len(processes) > MAX_PROCESSES
        or not all(k.isdigit() and _bytes(v) for k, v in processes.items())
    ):
        raise ProtocolError(
            'HEARTBEAT memory report is not {"rss": bytes, "processes": {"<pid>": bytes}}',
            frames,
        )
    return {"rss": doc["rss"], "processes": processes}
