"""The eMQP headers frame: comma-separated flags and ``key:value`` pairs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

from emq_django.exceptions import ProtocolError
from emq_django.protocol.flow import check_concurrency_key, check_max_concurrency, parse_rate
from emq_django.protocol.limits import (
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_TIMEOUT,
    MAX_UNIQUE_FOR,
    MAX_UNIQUE_KEY,
    MIN_PRIORITY,
    REFUSED_BAD_HEADER,
    REFUSED_BAD_RUN_AFTER,
    check_count,
    check_priority,
    check_seconds,
    check_unique_key,
)

MAX_HEADERS_LENGTH = 4096
# extension: the OpenTelemetry span of a retried job's first traced attempt, which
# the broker adds for the retries (docs/eventmq-wire.md, section 8)
FIRST_ATTEMPT = "first-attempt"
# the most each numeric header may say (run-after is checked against the clock)
_HEADER_LIMITS: dict[str, float] = {
    "retry-count": MAX_RETRIES,
    "timeout": MAX_TIMEOUT,
    "unique-for": MAX_UNIQUE_FOR,
}


@dataclass(frozen=True, slots=True)
class Headers:
    """Parsed headers. ``raw`` is kept so that the broker forwards them unchanged."""

    raw: bytes = b""
    reply_requested: bool = False
    guarantee: bool = False
    nohaste: bool = False
    retry_count: int = 0
    timeout: float = 0.0
    run_after: float = 0.0
    task: str = ""  # extension: the task's registered name, so the broker can trace it
    # extension: the client wants the job's partial results (PARTIAL); only our client
    # sends it, so only our clients ever receive a PARTIAL
    stream: bool = False
    # extension: the client reads an ACK that names several msgids (``acks``); only
    # our client sends it, so an EventMQ client only ever gets one msgid per ACK
    acks: bool = False
    # extension: higher runs first, -100..100 (docs/eventmq-wire.md); 0 when absent
    priority: int = 0
    # extension, the broker's to our worker processes only: the job's rank in its
    # ranked queue (lower first: broker/priority.py ``wire_rank``); None when absent
    rank: float | None = None
    # extension: a unique job's key (broker/unique.py), and how long the key is kept
    # after the job ended; "" and 0 when absent
    unique: str = ""
    unique_for: float = 0.0
    # extension, flow control (broker/flow.py): the task's rate limit in jobs per
    # second, at most how many of its jobs (per concurrency key, when one is given)
    # run at once; 0 and "" when absent. ``flow``: any of them, read once per job
    rate_limit: float = 0.0
    max_concurrency: int = 0
    concurrency_key: str = ""
    flow: bool = False
    extra: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        for name, value in self.extra:
            if name == key:
                return value
        return default


def _number(key: str, value: str, raw: bytes, cast: type[int] | type[float]) -> float:
    code = REFUSED_BAD_RUN_AFTER if key == "run-after" else REFUSED_BAD_HEADER
    try:
        number = cast(value)
    except ValueError:
        raise ProtocolError(
            f"header {key!r} needs a number, got {value[:40]!r}", [raw], code
        ) from None
    if not math.isfinite(number) or number < 0:  # negative, NaN or infinite
        raise ProtocolError(
            f"header {key!r} must be a finite number >= 0, got {value[:40]!r}", [raw], code
        )
    limit = _HEADER_LIMITS.get(key)
    if limit is not None and number > limit:
        raise ProtocolError(
            f"header {key!r} is {value[:40]}; the most is {int(limit)}", [raw], code
        )
    return number


def _priority(value: str, raw: bytes) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ProtocolError(
            f"header 'priority' needs an integer, got {value[:40]!r}", [raw], REFUSED_BAD_HEADER
        ) from None
    if not MIN_PRIORITY <= number <= MAX_PRIORITY:
        raise ProtocolError(
            f"header 'priority' is {number}; it must be from {MIN_PRIORITY} to {MAX_PRIORITY}",
            [raw],
            REFUSED_BAD_HEADER,
        )
    return number


def _rank(value: str, raw: bytes) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ProtocolError(
            f"header 'rank' needs a finite number, got {value[:40]!r}", [raw], REFUSED_BAD_HEADER
        )
    return number


@lru_cache(maxsize=1024)
def parse_headers(raw: bytes) -> Headers:
    """Parse a headers frame; raises ``ProtocolError`` on a malformed one.

    Cached: the same few header strings repeat on every message of a queue.
    """
    if not raw:
        return Headers()
    if len(raw) > MAX_HEADERS_LENGTH:
        raise ProtocolError(
            f"headers frame too long (over {MAX_HEADERS_LENGTH} bytes)",
            [raw[:64]],
            REFUSED_BAD_HEADER,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("headers frame is not UTF-8", [raw], REFUSED_BAD_HEADER) from None
    fields: dict[str, object] = {}
    extra: list[tuple[str, str]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        if key == "reply-requested":
            fields["reply_requested"] = True
        elif key == "guarantee":
            fields["guarantee"] = True
        elif key == "nohaste":
            fields["nohaste"] = True
        elif key == "retry-count":
            fields["retry_count"] = int(_number(key, value, raw, int))
        elif key == "timeout":
            fields["timeout"] = float(_number(key, value, raw, float))
        elif key == "run-after":
            fields["run_after"] = float(_number(key, value, raw, float))
        elif key == "task":
            fields["task"] = value
        elif key == "stream":
            fields["stream"] = True
        elif key == "acks":
            fields["acks"] = True
        elif key == "priority":
            fields["priority"] = _priority(value, raw)
        elif key == "rank":
            fields["rank"] = _rank(value, raw)
        elif key == "unique":
            if not value or len(value) > MAX_UNIQUE_KEY:
                raise ProtocolError(
                    f"header 'unique' needs a key of 1 to {MAX_UNIQUE_KEY} characters, "
                    f"got {len(value)}",
                    [raw],
                    REFUSED_BAD_HEADER,
                )
            fields["unique"] = value
        elif key == "unique-for":
            fields["unique_for"] = float(_number(key, value, raw, float))
        elif key in _FLOW_HEADERS:
            _flow_header(key, value, raw, fields)
        else:
            extra.append((key, value if sep else ""))
    if "concurrency_key" in fields and "max_concurrency" not in fields:
        raise ProtocolError(
            "header 'concurrency-key' needs a 'max-concurrency' header", [raw], REFUSED_BAD_HEADER
        )
    if "rate_limit" in fields or "max_concurrency" in fields:
        fields["flow"] = True
    return Headers(raw=raw, extra=tuple(extra), **fields)  # type: ignore[arg-type]


_FLOW_HEADERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "rate-limit": ("rate_limit", lambda v: parse_rate(v, "header 'rate-limit'")),
    "max-concurrency": ("max_concurrency", lambda v: check_max_concurrency(_integer(v))),
    "concurrency-key": ("concurrency_key", check_concurrency_key),
}


def _flow_header(key: str, value: str, raw: bytes, fields: dict[str, object]) -> None:
    """A flow control header (docs/eventmq-wire.md) into ``fields``; raises
    ``ProtocolError`` with the reason for a bad value."""
    name, check = _FLOW_HEADERS[key]
    try:
        fields[name] = check(value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(
            f"header {key!r} is {value[:40]!r}: {exc}", [raw], REFUSED_BAD_HEADER
        ) from None


def _integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("max_concurrency must be an integer") from None


def trace_id_of(h: Headers) -> str:
    """The W3C trace id (32 lowercase hex digits) of the job's ``traceparent``
    header (docs/eventmq-wire.md, section 8), or '' when it has none or a malformed
    one."""
    if not h.extra:
        return ""
    parts = (h.get("traceparent") or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or not parts[1].strip("0"):
        return ""
    trace_id = parts[1].lower()
    return trace_id if all(c in "0123456789abcdef" for c in trace_id) else ""


def with_first_attempt(h: Headers, span: bytes) -> Headers:
    """``h`` with the ``first-attempt:<span>`` item appended (``raw`` too, so that it
    goes to the job's next attempts); ``h`` itself when it has one already or the
    frame would grow past ``MAX_HEADERS_LENGTH``. No parse: a retry's headers are
    its own, and would only fill ``parse_headers``' cache."""
    if h.get(FIRST_ATTEMPT) is not None:
        return h
    item = FIRST_ATTEMPT.encode() + b":" + span
    raw = h.raw + b"," + item if h.raw else item
    if len(raw) > MAX_HEADERS_LENGTH:
        return h
    return replace(h, raw=raw, extra=(*h.extra, (FIRST_ATTEMPT, span.decode("ascii"))))


def parse_stored_headers(raw: bytes) -> Headers:
    """The headers of a job a journal kept, maybe from before a limit existed: an
    out-of-range ``retry-count`` or ``timeout`` is brought down to its limit (in
    ``raw`` too, which is forwarded to the worker) instead of refused; raises
    ``ProtocolError`` for anything else ``parse_headers`` refuses."""
    try:
        return parse_headers(raw)
    except ProtocolError:
        items = raw.decode("utf-8", "replace").split(",")
        fixed = ",".join(_within_limit(item) for item in items).encode()
        if fixed == raw:
            raise
        return parse_headers(fixed)


def _within_limit(item: str) -> str:
    key, _, value = item.strip().partition(":")
    limit = _HEADER_LIMITS.get(key)
    try:
        if limit is not None and float(value) > limit:
            return f"{key}:{int(limit)}"
    except ValueError:
        pass
    return item


def format_headers(
    *,
    reply_requested: bool = False,
    guarantee: bool = False,
    nohaste: bool = False,
    retry_count: int = 0,
    timeout: float = 0,
    run_after: float = 0,
    task: str = "",
    stream: bool = False,
    priority: int = 0,
    unique: str = "",
    unique_for: float = 0,
    rate_limit: str = "",
    max_concurrency: int = 0,
    concurrency_key: str = "",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """Build a headers frame, in the order EventMQ writes them. Raises ``TypeError``
    or ``ValueError`` for a value the broker would refuse (a negative, non-integer
    ``retry_count``; a negative or non-finite ``timeout`` or ``run_after``; a
    ``priority`` that is not an int from -100 to 100)."""
    check_count("retries", retry_count)
    check_priority(priority)
    check_seconds("timeout", timeout, MAX_TIMEOUT)
    check_seconds("run_after", run_after)
    check_seconds("unique_for", unique_for, MAX_UNIQUE_FOR)
    if unique:
        check_unique_key(unique)
    items: list[str] = []
    if reply_requested:
        items.append("reply-requested")
    if guarantee:
        items.append("guarantee")
    if nohaste:
        items.append("nohaste")
    if retry_count:
        items.append(f"retry-count:{int(retry_count)}")
    if timeout:
        items.append(f"timeout:{timeout:g}")
    if run_after:
        items.append(f"run-after:{run_after:.6f}")
    if task:
        if "," in task:
            raise ValueError(f"a task name cannot contain a comma: {task!r}")
        items.append(f"task:{task}")
    if stream:
        items.append("stream")
    if priority:
        items.append(f"priority:{priority}")
    if unique:
        items.append(f"unique:{unique}")
        if unique_for:
            items.append(f"unique-for:{unique_for:g}")
    if rate_limit:
        parse_rate(rate_limit)
        items.append(f"rate-limit:{rate_limit.strip()}")
    if max_concurrency:
        items.append(f"max-concurrency:{check_max_concurrency(max_concurrency)}")
        if concurrency_key:
            items.append(f"concurrency-key:{check_concurrency_key(concurrency_key)}")
    items.extend(f"{k}:{v}" if v else k for k, v in extra)
    return ",".join(items).encode()
