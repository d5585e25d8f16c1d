"""The status frame of a REPLY (our extension): ``ok``/``failed`` and flags such
as ``ready``, ``lost:<how>``, ``retry:<s>``, ``error:<type>``, ``span:<traceparent>``.
Pure."""

from __future__ import annotations

import math
import re
from functools import lru_cache

STATUS_OK = b"ok"
STATUS_FAILED = b"failed"
FLAG_READY = b"ready"
FLAG_LOST = b"lost"  # the attempt ended with its worker process: killed, died, timed out
FLAG_REQUEUE = b"requeue"  # the worker process gives the job back unstarted
MAX_STATUS_LENGTH = 255
# a failed attempt's OpenTelemetry span, W3C ``traceparent`` form, which the broker
# keeps with the job for its retries (docs/eventmq-wire.md, section 8)
SPAN_PREFIX = b"span:"
_TRACEPARENT = re.compile(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
REQUEUE_STATUS = b"failed,requeue"


def status_frame(
    failed: bool, error: str = "", lost: str | None = None, retry: float | None = None
) -> bytes:
    """A REPLY status frame for an outcome that did not come as one (the broker's own
    verdicts, and results from workers of other protocols)."""
    if not failed:
        return STATUS_OK
    if lost is not None:
        return lost_status(error or "Error", lost)
    status = STATUS_FAILED
    if error:
        status += b",error:" + error.replace(",", "_").encode()[:100]
    if retry is not None:
        status += b",retry" if retry < 0 else b",retry:%.3f" % retry
    return status


def lost_status(error: str, detail: str) -> bytes:
    """The status of a REPLY our job manager sends for an attempt whose worker
    process ended mid-job: ``failed,lost:<detail>,error:<type>``."""
    detail = detail.replace(",", ";")[:120]
    return b"failed,lost:" + detail.encode() + b",error:" + error.replace(",", "_").encode()[:100]


@lru_cache(maxsize=1024)
def reply_lost(status: bytes) -> str | None:
    """How the attempt's worker process ended (``exit code 1``, ``killed by signal 6``)
    for a REPLY flagged ``lost``: '' when not said; None for a REPLY not so flagged."""
    for token in status.split(b","):
        if token == FLAG_LOST:
            return ""
        if token.startswith(b"lost:"):
            return token[5:].decode("utf-8", "replace")
    return None


@lru_cache(maxsize=1024)
def without_ready(status: bytes) -> bytes:
    """A REPLY status without its ``ready`` flag (the credit it gives back)."""
    return b",".join(t for t in status.split(b",") if t != FLAG_READY)


def reply_flags(status: bytes) -> tuple[bool, bool]:
    """(failed, ready) from a REPLY status frame such as ``failed,ready``.

    ``ready`` lets our job manager return its slot's credit with the REPLY
    instead of a separate READY; a REPLY without it gives no credit back.
    """
    tokens = status.split(b",")
    return STATUS_FAILED in tokens, FLAG_READY in tokens


@lru_cache(maxsize=1024)
def reply_retry(status: bytes) -> float | None:
    """A retry the task asked for (``emq.Retry``): ``retry:<seconds>`` gives the delay,
    a bare ``retry`` gives -1 (use the backoff); None when it asked for none."""
    for token in status.split(b","):
        if token == b"retry":
            return -1.0
        if token.startswith(b"retry:"):
            try:
                delay = float(token[6:])
            except ValueError:
                return -1.0
            return max(0.0, delay) if math.isfinite(delay) else -1.0
    return None


@lru_cache(maxsize=1024)
def reply_error(status: bytes) -> str:
    """The error type in a status frame (``failed,ready,error:ValueError``), or ''."""
    for token in status.split(b","):
        if token.startswith(b"error:"):
            return token[6:].decode("utf-8", "replace")
    return ""


def reply_span(status: bytes) -> bytes:
    """The failed attempt's span (``span:00-<trace id>-<span id>-<flags>``) in a
    status frame, or b'' when it has none or a malformed one. Read only when the
    broker retries a job (not cached: each value is one attempt's)."""
    if SPAN_PREFIX not in status:
        return b""
    for token in status.split(b","):
        if token.startswith(SPAN_PREFIX):
            value = token[len(SPAN_PREFIX) :]
            return value if _TRACEPARENT.fullmatch(value) else b""
    return b""
