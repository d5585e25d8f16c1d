"""Checks of eMQP fields shared by the decoders and the broker's hot path:
frame counts, text, queue names (cached), INFORM's queues. Raise ``ProtocolError``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.commands import MAX_ID_LENGTH, PROTOCOL, REQUEST
from emq_django.protocol.headers import Headers, parse_headers
from emq_django.protocol.limits import (
    MAX_NAME_LENGTH,
    REFUSED_BAD_QUEUE_NAME,
    REFUSED_QUEUE_NAME_TOO_LONG,
    check_queue_name,
)


def _text(
    frame: bytes,
    what: str,
    frames: Sequence[bytes],
    limit: int = MAX_NAME_LENGTH,
    codes: tuple[str, str] = ("malformed", "malformed"),
) -> str:
    """``frame`` as text; ``codes``: the refusal codes for (too long, not UTF-8)."""
    if len(frame) > limit:
        raise ProtocolError(f"{what} longer than {limit} bytes ({len(frame)})", frames, codes[0])
    try:
        return frame.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8", frames, codes[1]) from None


_QUEUE_CODES = (REFUSED_QUEUE_NAME_TOO_LONG, REFUSED_BAD_QUEUE_NAME)


def _count(frames: Sequence[bytes], name: str, *allowed: int) -> None:
    if len(frames) not in allowed:
        want = " or ".join(str(n) for n in allowed)
        raise ProtocolError(f"{name} needs {want} frames, got {len(frames)}", frames)


def _queue_name(frame: bytes, frames: Sequence[bytes]) -> str:
    name = _QUEUE_NAMES.get(frame)
    if name is not None:
        return name
    name = _text(frame, "queue name", frames, codes=_QUEUE_CODES)
    if not name:
        raise ProtocolError("empty queue name", frames, REFUSED_BAD_QUEUE_NAME)
    if len(_QUEUE_NAMES) >= MAX_QUEUE_NAMES_KEPT:
        _QUEUE_NAMES.clear()  # names are cheap to check again
    _QUEUE_NAMES[bytes(frame)] = name
    return name


# Queue names already checked, as their frame: the same few repeat on every message.
MAX_QUEUE_NAMES_KEPT = 4096
_QUEUE_NAMES: dict[bytes, str] = {}
_JOB_QUEUES: dict[bytes, str] = {}


def _job_queue(frame: bytes, frames: Sequence[bytes]) -> str:
    """A job's queue name: also one a job manager can serve (no whitespace, control
    characters, ``,`` or ``:``; limits.check_queue_name), else ``bad-queue-name``.
    A topic (PUBLISH) may hold them: it takes ``_queue_name`` alone."""
    name = _JOB_QUEUES.get(frame)
    if name is not None:
        return name
    name = _queue_name(frame, frames)
    try:
        check_queue_name(name)
    except ValueError as exc:
        raise ProtocolError(
            f"{exc}: no job manager can serve it", frames, REFUSED_BAD_QUEUE_NAME
        ) from None
    if len(_JOB_QUEUES) >= MAX_QUEUE_NAMES_KEPT:
        _JOB_QUEUES.clear()
    _JOB_QUEUES[bytes(frame)] = name
    return name


def request_fields(f: Sequence[bytes]) -> tuple[str, Headers] | None:
    """The queue name and headers of a well-formed 7-frame REQUEST (the broker's
    hot path: no ``Request`` object); None when ``f`` is not one such, and
    ``ProtocolError`` as ``decode`` raises it for a bad queue name or headers.
    ``decode`` handles whatever this does not."""
    if f[0] or f[1] != PROTOCOL or f[2] != REQUEST or not 0 < len(f[3]) <= MAX_ID_LENGTH:
        return None
    return _job_queue(f[4], f), parse_headers(f[5])


def job_fields(queue: bytes, headers: bytes, frames: Sequence[bytes]) -> tuple[str, Headers]:
    """A job's queue name and headers, checked as a REQUEST's are (a REQUESTS
    message's jobs: protocol/batch.py); raises ``ProtocolError`` naming ``frames``."""
    return _job_queue(queue, frames), parse_headers(headers)


def parse_queues(frame: bytes, frames: Sequence[bytes] = ()) -> tuple[tuple[int, str], ...]:
    """Parse INFORM's queues: JSON ``[[10, "default"], ...]``, ``[40, "email"]``
    pairs without the outer list as the document writes them, or ``name:weight``."""
    if not frame.strip():
        return ()
    text = _text(frame, "queues", frames or [frame], limit=65536)
    try:
        data = _json(text, "queues", frames)
    except ValueError:
        # the document writes Python-style pairs: [40, 'email'], [10, 'default']
        relaxed = text.replace("'", '"')
        try:
            data = _json(
                relaxed if relaxed.lstrip().startswith("[[") else f"[{relaxed}]", "queues", frames
            )
        except ValueError:
            if any(c in text for c in "[]'\"{}"):
                raise ProtocolError("queues must be a list of [weight, name]", frames) from None
            data = [_pair_from_colon(item, frames) for item in text.split(",") if item.strip()]
    if isinstance(data, list) and len(data) == 2 and not isinstance(data[0], list):
        data = [data]
    if not isinstance(data, list):
        raise ProtocolError("queues must be a list of [weight, name]", frames)
    result = [_pair(item, frames) for item in data]
    result.sort(key=lambda p: -p[0])
    return tuple(result)


def _json(text: str | bytes, what: str, frames: Sequence[bytes]) -> Any:
    """``json.loads``; ``ValueError`` as it raises it, ``ProtocolError`` for JSON
    nested too deep for the decoder (it recurses: ``[`` 5,000 deep)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ProtocolError(f"{what} nest too deep to read", frames) from None


def _pair_from_colon(item: str, frames: Sequence[bytes]) -> list[Any]:
    name, _, weight = item.strip().partition(":")
    try:
        return [int(weight or 10), name]
    except ValueError:
        raise ProtocolError(f"bad queue weight in {item!r}", frames) from None


def _pair(item: Any, frames: Sequence[bytes]) -> tuple[int, str]:
    if not isinstance(item, list | tuple) or len(item) != 2:
        raise ProtocolError("each queue must be [weight, name]", frames)
    a, b = item
    if isinstance(a, str) and isinstance(b, int):
        a, b = b, a
    if not isinstance(a, int) or isinstance(a, bool) or not isinstance(b, str) or not b:
        raise ProtocolError("each queue must be [integer weight, name]", frames)
    if len(b.encode("utf-8", "surrogatepass")) > MAX_NAME_LENGTH:
        raise ProtocolError(f"queue name too long (over {MAX_NAME_LENGTH} bytes)", frames)
    return a, b
