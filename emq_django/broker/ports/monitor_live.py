"""The monitor channel's live lists and queue controls (``broker/live.py``):

- ``JOBS WAITING <queue> [<offset> [<limit>]] [BODIES]``: a page of the queue's
  waiting jobs, oldest first, and its delayed ones, soonest due first;
- ``JOBS RUNNING [<queue>|*|@<job manager>] [<offset> [<limit>]] [BODIES]``: a
  page of the attempts in flight (of a queue, all, or one job manager's);
- ``QUEUE PAUSE <queue>`` and ``QUEUE RESUME <queue>`` (the ``admin`` role);
  ``QUEUE RATE <queue> <rate>|OFF``: the queue's rate limit (``"10/s"``, ``/m``,
  ``/h``, as in ``EMQ_RATE_LIMITS``) from now on, or none, until the broker restarts;
- ``MANAGER DRAIN <name>`` and ``MANAGER RESUME <name>`` (the ``admin`` role): one
  of our job managers finishes its jobs and gets no new one, or gets them again
  (``broker/manager_control.py``; EventMQ's are refused with the reason);
  ``MANAGER STOP <name>``: drained, and it exits once its running jobs finish;
  ``MANAGER RESIZE <name> <n>``: it runs ``n`` worker processes from now on;
- ``TASKS``: per task and queue, the jobs succeeded, failed, retried and
  dead-lettered and the run-time histogram (``broker/task_stats.py``).

``limit`` is 50 unless given, at most ``live.MAX_PAGE``; ``BODIES`` adds a preview
of each job's body (its arguments). Answers are JSON; bad input is answered
``ERROR`` with the reason.
"""

from __future__ import annotations

from typing import Any

from emq_django.broker import live, manager_control, monitor
from emq_django.protocol.flow import parse_rate

DEFAULT_LIMIT = 50
MAX_QUEUE_NAME = 255
USAGE = (
    b"ERROR usage: JOBS WAITING <queue> [<offset> [<limit>]] [BODIES], "
    b"JOBS RUNNING [<queue>|*|@<job manager>] [<offset> [<limit>]] [BODIES], "
    b"QUEUE PAUSE|RESUME <queue>, QUEUE RATE <queue> <rate>|OFF, "
    b"MANAGER DRAIN|RESUME|STOP <name>, "
    b"MANAGER RESIZE <name> <n>, TASKS"
)


class BadRequest(ValueError):
    pass


def changes(words: list[bytes]) -> bool:
    """Whether the command changes something (it needs the ``admin`` role)."""
    return len(words) > 1 and words[0].upper() in (b"QUEUE", b"MANAGER")


def handles(words: list[bytes]) -> bool:
    return bool(words) and words[0].upper() in (b"JOBS", b"QUEUE", b"TASKS", b"MANAGER")


def _queue_name(word: bytes) -> str:
    try:
        name = word.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("a queue name is UTF-8") from None
    if len(word) > MAX_QUEUE_NAME:
        raise BadRequest(f"a queue name is at most {MAX_QUEUE_NAME} bytes")
    return name


def _number(word: bytes, what: str, low: int, high: int) -> int:
    if not word.isdigit():
        raise BadRequest(
            f"{what} must be a whole number, got {word[:20].decode(errors='replace')!r}"
        )
    value = int(word)
    if not low <= value <= high:
        raise BadRequest(f"{what} must be between {low} and {high}, got {value}")
    return value


def _rate(word: bytes) -> float | None:
    """A rate limit's word: ``10/s`` (jobs per second), or ``OFF`` (None)."""
    if word.upper() == b"OFF":
        return None
    try:
        text = word.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("a rate is UTF-8") from None
    try:
        return parse_rate(text, "the rate")
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _page(words: list[bytes]) -> tuple[int, int, bool]:
    bodies = bool(words) and words[-1].upper() == b"BODIES"
    if bodies:
        words = words[:-1]
    if len(words) > 2:
        raise BadRequest("too many words: give an offset and a limit at most")
    offset = _number(words[0], "the offset", 0, 10**12) if words else 0
    limit = _number(words[1], "the limit", 1, live.MAX_PAGE) if len(words) > 1 else DEFAULT_LIMIT
    return offset, limit, bodies


def answer(core: Any, words: list[bytes], now: float) -> bytes:
    try:
        return monitor.as_json(_answer(core, words, now))
    except BadRequest as exc:
        core.counters["protocol_errors"] += 1
        return b"ERROR " + str(exc).encode()


def _answer(core: Any, words: list[bytes], now: float) -> dict[str, Any]:
    what = words[1].upper() if len(words) > 1 else b""
    if words[0].upper() == b"TASKS":
        if len(words) != 1:
            raise BadRequest("usage: TASKS (no arguments)")
        stats = core.life.task_stats
        if stats is None:
            return {"enabled": False, "buckets": [], "tasks": []}
        return {"enabled": True, **stats.doc()}
    if words[0].upper() == b"QUEUE" and what == b"RATE":
        if len(words) != 4:
            raise BadRequest('usage: QUEUE RATE <queue> <rate> (e.g. "10/s", "5/m") or OFF')
        return live.set_rate(core, _queue_name(words[2]), _rate(words[3]), now)
    if words[0].upper() == b"QUEUE":
        if what not in (b"PAUSE", b"RESUME") or len(words) != 3:
            raise BadRequest("usage: QUEUE PAUSE <queue> or QUEUE RESUME <queue>")
        name = _queue_name(words[2])
        return live.pause(core, name) if what == b"PAUSE" else live.resume(core, name, now)
    if words[0].upper() == b"MANAGER" and what == b"RESIZE":
        if len(words) != 4:
            raise BadRequest("usage: MANAGER RESIZE <name> <worker processes>")
        count = _number(words[3], "the number of worker processes", 1, 10_000)
        try:
            return manager_control.resize(core, _queue_name(words[2]), count)
        except manager_control.NotDrainable as exc:
            raise BadRequest(str(exc)) from None
    if words[0].upper() == b"MANAGER":
        if what not in (b"DRAIN", b"RESUME", b"STOP") or len(words) != 3:
            raise BadRequest("usage: MANAGER DRAIN|RESUME|STOP <name>")
        name = _queue_name(words[2])  # (the same rules as a queue's name)
        try:
            if what == b"DRAIN":
                return manager_control.drain(core, name)
            if what == b"STOP":
                return manager_control.stop(core, name)
            return manager_control.resume(core, name, now)
        except manager_control.NotDrainable as exc:
            raise BadRequest(str(exc)) from None
    if what == b"WAITING":
        if len(words) < 3:
            raise BadRequest("usage: JOBS WAITING <queue> [<offset> [<limit>]] [BODIES]")
        offset, limit, bodies = _page(words[3:])
        return live.waiting(core, _queue_name(words[2]), offset, limit, bodies, now)
    if what == b"RUNNING":
        rest = words[2:]
        queue: str | None = None
        manager: str | None = None
        if rest and not rest[0].isdigit() and rest[0].upper() != b"BODIES":
            if rest[0].startswith(b"@"):
                manager = _queue_name(rest[0][1:])  # (the same rules as a queue's name)
            elif rest[0] != b"*":
                queue = _queue_name(rest[0])
            rest = rest[1:]
        offset, limit, bodies = _page(rest)
        return live.running(core, queue, offset, limit, bodies, now, manager)
    raise BadRequest(USAGE[len(b"ERROR ") :].decode())
