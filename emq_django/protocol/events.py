"""Topic events as values: what every port, the broker's topic space and
``emq.publish``/``emq.subscribe`` share (an ``Event``, its content types), and the
rules on topics and on retention (``EMQ_TOPIC_RETENTION``). Pure: no sockets, no
clock, no Django.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_TOPIC_BYTES = 255
DEFAULT_RETENTION: dict[str, dict[str, float]] = {"": {"max_age": 7 * 86400, "max_count": 100_000}}

MSGPACK = "application/msgpack"
JSON = "application/json"
OCTETS = "application/octet-stream"


@dataclass(slots=True, eq=False)
class Event:
    seq: int  # one strictly increasing sequence for the whole broker
    topic: str
    data: bytes  # raw payload as published
    producer: str = ""
    uuid: bytes = b""  # 16 bytes
    ts: float = 0.0  # wall-clock seconds
    content_type: str = ""  # application/msgpack, application/json, application/octet-stream
    headers: tuple[tuple[str, str], ...] = ()  # extra headers kept and forwarded (mc0's X-)


@dataclass(frozen=True, slots=True)
class Rule:
    prefix: str
    max_age: float  # seconds; 0: no limit
    max_count: int  # events; 0: no limit


def check_topic(topic: str) -> None:
    """Raises ``ValueError`` for a topic no port may publish on."""
    if not isinstance(topic, str) or not topic:
        raise ValueError("a topic must be a non-empty string")
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("a topic must be valid UTF-8") from None
    if size > MAX_TOPIC_BYTES:
        raise ValueError(f"a topic is at most {MAX_TOPIC_BYTES} bytes, not {size}")


def parse_retention(raw: Mapping[str, Any] | str | None) -> tuple[Rule, ...]:
    """The rules of ``EMQ_TOPIC_RETENTION`` (a dict or its JSON), longest prefix first.
    A catch-all rule ``""`` is added from the defaults when missing."""
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.strip() else {}
    spec: dict[str, Any] = dict(DEFAULT_RETENTION)
    spec.update(raw or {})
    rules = []
    for prefix, limits in spec.items():
        if not isinstance(prefix, str) or not isinstance(limits, Mapping):
            raise ValueError(f"retention rule {prefix!r}: expected {{max_age, max_count}}")
        unknown = set(limits) - {"max_age", "max_count"}
        if unknown:
            raise ValueError(f"retention rule {prefix!r}: unknown keys {sorted(unknown)}")
        default = DEFAULT_RETENTION[""]
        max_age = float(limits.get("max_age", default["max_age"]))
        max_count = int(limits.get("max_count", default["max_count"]))
        if max_age < 0 or max_count < 0:
            raise ValueError(f"retention rule {prefix!r}: limits must be >= 0 (0: no limit)")
        rules.append(Rule(prefix, max_age, max_count))
    return tuple(sorted(rules, key=lambda r: -len(r.prefix)))


def matches(topic: str, prefixes: Sequence[str]) -> bool:
    """Prefix match, as the Event BUS does; no prefixes (or ``""``) match everything."""
    if not prefixes:
        return True
    return any(topic.startswith(p) for p in prefixes)
