"""The monitor channel (EventMQ's administration port 47293, PZQ-style text).

A REQ (or DEALER with an empty delimiter) sends one line and gets one answer:

- ``MONITOR``: ``key: value`` lines; ``MONITOR JSON``: the whole status document;
- ``CANCEL <job id>...``: the ids by what happened (JSON);
- ``DEADLETTERS [LIST | REQUEUE ALL|<id>... | PURGE ALL|<id>...]`` (JSON);
- ``TOPIC LATEST <n> <topic>``: the topic's latest ``n`` events kept (at most
  ``MAX_LATEST``), oldest first, their data in base64 (JSON); the admin's Topics page;
- ``JOBS WAITING ...``, ``JOBS RUNNING ...``, ``QUEUE PAUSE|RESUME <queue>``: the
  live lists and queue controls (``monitor_live``).

Anything else is answered ``ERROR ...`` and counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from emq_django.broker import monitor
from emq_django.broker.effects import Effect
from emq_django.broker.ports import monitor_live
from emq_django.broker.ports.base import Port
from emq_django.security.roles import ADMIN, MONITOR
from emq_django.transport import SocketOptions

MAX_REQUEST = 65536
MAX_LATEST = 100
UNKNOWN = (
    b"ERROR unknown command; send MONITOR, MONITOR JSON, CANCEL <id>..., "
    b"DEADLETTERS [LIST | REQUEUE ALL|<id>... | PURGE ALL|<id>...], TOPIC LATEST <n> <topic>, "
    b"JOBS WAITING|RUNNING ..., QUEUE PAUSE|RESUME <queue> or MANAGER DRAIN|RESUME <name>"
)


class MonitorPort(Port):
    name = "monitor"
    roles = (MONITOR, ADMIN)

    def __init__(self, core: Any, address: str = "") -> None:
        super().__init__(core, address)
        # the status document; the server adds what only it knows (journal, trace)
        self.status = lambda: monitor.snapshot(self.core, time.monotonic(), time.time(), {})

    def socket_options(self) -> SocketOptions:
        return SocketOptions()

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        if not frames:
            self.core.counters["protocol_errors"] += 1
            return None
        envelope, request = list(frames[:-1]), frames[-1].strip()
        return [*envelope, self.answer(request[:MAX_REQUEST], now)]

    def authorize(self, socket: str, roles: frozenset[str], frames: Sequence[bytes]) -> str | None:
        """Reading needs ``monitor`` or ``admin``; CANCEL, REQUEUE, PURGE, QUEUE
        PAUSE|RESUME and MANAGER DRAIN|RESUME ``admin``."""
        words = frames[-1].split()[:2] if frames else []
        command = words[0].upper() if words else b""
        action = words[1].upper() if len(words) > 1 else b"LIST"
        changes = (
            command == b"CANCEL"
            or (command == b"DEADLETTERS" and action != b"LIST")
            or monitor_live.changes(words)
        )
        if changes and ADMIN not in roles:
            return f"{command.decode(errors='replace')} needs the admin role"
        if not roles & {MONITOR, ADMIN}:
            return "the monitor channel needs the monitor or admin role"
        return None

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None:
        return [*frames[:-1], b"ERROR forbidden: " + reason.encode()] if frames else None

    def local_request(self, request: bytes, now: float) -> bytes | None:
        return self.answer(request, now)

    def answer(self, request: bytes, now: float) -> bytes:
        words = request.split()
        command = b" ".join(words[:2]).upper()
        if command in (b"MONITOR", b"MONITOR JSON"):
            doc = self.status() if self.status is not None else {}
            return monitor.as_json(doc) if command.endswith(b"JSON") else monitor.as_lines(doc)
        if words and words[0].upper() == b"CANCEL" and len(words) > 1:
            states: dict[str, list[str]] = {
                "cancelled": [],
                "stopping": [],
                "running": [],
                "unknown": [],
            }
            for job_id in words[1:]:
                states[self.core.cancel(job_id, now)].append(job_id.decode("utf-8", "replace"))
            return monitor.as_json(states)
        if words and words[0].upper() == b"DEADLETTERS":
            result = self._dead_letters(words[1:], now)
            if result is not None:
                return monitor.as_json(result)
        if monitor_live.handles(words):
            return monitor_live.answer(self.core, words, now)
        if command == b"TOPIC LATEST":
            answer = self._latest(request)
            if answer is not None:
                return answer
        self.core.counters["protocol_errors"] += 1
        return UNKNOWN

    def _latest(self, request: bytes) -> bytes | None:
        parts = request.split(maxsplit=3)
        if len(parts) != 4 or not parts[2].isdigit():
            return None
        try:
            topic = parts[3].decode("utf-8")
        except UnicodeDecodeError:
            self.core.counters["protocol_errors"] += 1
            return b"ERROR a topic is UTF-8"
        n = min(int(parts[2]), MAX_LATEST)
        events = self.core.topics.latest(topic, n) if n else []
        return monitor.as_json({"topic": topic, "events": [monitor.event_doc(e) for e in events]})

    def _dead_letters(self, words: list[bytes], now: float) -> dict[str, Any] | None:
        core = self.core
        action = words[0].upper() if words else b"LIST"
        if action == b"LIST":
            return {"dead_letters": core.dead_letters(), "count": len(core.life.dead)}
        ids: list[bytes] | None = words[1:] or None
        if ids == [b"ALL"] or ids == [b"all"]:
            ids = None
        elif ids is None:
            return {"error": "name the jobs, or ALL"}
        if action == b"REQUEUE":
            return {"requeued": core.requeue_dead(ids, now)}
        if action == b"PURGE":
            return {"purged": core.purge_dead(ids, now)}
        return None

    def encode(self, effect: Effect) -> list[bytes] | None:
        return None  # answers go straight back from handle()


class StandbyMonitorPort(MonitorPort):
    """A standby broker's monitor channel (``broker/ha.py``): ``MONITOR`` and
    ``MONITOR JSON`` tell its state (``ha``: role standby, the active broker);
    every other command is answered with an error naming the active broker, since
    a standby holds no jobs, dead letters or topics."""

    def answer(self, request: bytes, now: float) -> bytes:
        if b" ".join(request.split()[:2]).upper() in (b"MONITOR", b"MONITOR JSON"):
            return super().answer(request, now)
        self.core.counters["protocol_errors"] += 1
        ha = (self.status() if self.status is not None else {}).get("ha") or {}
        active = ha.get("active") or "none at the moment"
        for broker in ha.get("brokers") or ():
            if broker.get("name") == active and (broker.get("info") or {}).get("monitor"):
                active += f" (monitor {broker['info']['monitor']})"
        return f"ERROR standby: this broker serves nothing; the active broker is {active}".encode()
