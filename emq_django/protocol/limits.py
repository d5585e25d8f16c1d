"""The limits every peer checks, and the codes of the refusals that enforce them.

The client checks them before it sends (``ValueError``/``TypeError`` at the call
site); the broker answers a command that breaks them with an ERROR whose code is
one of the ``REFUSED_*`` below and counts it as ``refused_<code>``; the worker
fails an attempt whose body nests too deep instead of dying in the JSON decoder.
Pure: no sockets, no clock.
"""

from __future__ import annotations

import math
from typing import Any

MAX_NAME_LENGTH = 255  # bytes of a queue or topic name (UTF-8)
# Arguments nest at most this deep (a scalar is 0, ``[1]`` is 1). The JSON codecs
# recurse; Python's stops at about 1,000 frames, minus whatever is on the stack.
MAX_DEPTH = 100
# The body wraps the arguments in ``["run", {"args": [...]}]``: three more levels.
BODY_DEPTH = MAX_DEPTH + 3
# run-after / countdown / eta: at most this far in the future (a year and a day).
MAX_DELAY = 366 * 24 * 3600.0
# retries / retry-count: what every layer holds (the worker's slot table and the
# scheduler's PositiveIntegerField hold a signed 32-bit int)
MAX_RETRIES = 2**31 - 1
# timeout: a time limit of at most a year and a day, as for run-after
MAX_TIMEOUT = MAX_DELAY
# a schedule's interval: at most ten such years (its ticks must stay dates)
MAX_INTERVAL = 10 * MAX_DELAY
# a job's priority: an int, higher first (Django Tasks' range and convention)
MIN_PRIORITY = -100
MAX_PRIORITY = 100
# unique jobs (broker/unique.py): the longest unique key, and the longest unique-for
MAX_UNIQUE_KEY = 200
MAX_UNIQUE_FOR = 30 * 86400.0  # seconds

# ERROR codes (the frame after the refused msgid), one counter each
REFUSED_MALFORMED = "malformed"  # wrong frame count, bad msgid, ...
REFUSED_UNKNOWN_COMMAND = "unknown-command"
REFUSED_WRONG_PORT = "wrong-port"  # e.g. a job manager's INFORM on the client port
REFUSED_BAD_HEADER = "bad-header"  # a header that does not parse, or out of range
REFUSED_BAD_QUEUE_NAME = "bad-queue-name"  # empty or not UTF-8
REFUSED_QUEUE_NAME_TOO_LONG = "queue-name-too-long"
REFUSED_BAD_RUN_AFTER = "bad-run-after"  # not finite, or more than MAX_DELAY ahead
REFUSED_BODY_TOO_BIG = "body-too-big"  # over EMQ_MAX_BODY_BYTES
REFUSED_TOO_DEEP = "too-deep"  # arguments nested deeper than MAX_DEPTH (worker, client)
REFUSED_JOURNAL = "journal-error"  # the journal could not save a guaranteed job
# the broker lost its lease to another (a failover) before it could save a
# guaranteed job: our clients send it again, to the new active broker
REFUSED_LEASE_LOST = "lease-lost"
REFUSED_QUEUE_FULL = "queue-full"
REFUSED_SHUTTING_DOWN = "shutting-down"
REFUSED_TOO_MANY_QUEUES = "too-many-queues"
# a workflow graph the broker will not run (protocol/workflow.py): malformed, an
# empty group, a chord without a callback, nested too deep, too many steps
REFUSED_BAD_WORKFLOW = "bad-workflow"
# not a refusal: a job with the same unique key waits or runs; the reason is
# "duplicate of <job id>" (docs/eventmq-wire.md, the unique header)
DUPLICATE = "duplicate"
DUPLICATE_OF = "duplicate of "

REFUSAL_CODES = (
    REFUSED_MALFORMED,
    REFUSED_UNKNOWN_COMMAND,
    REFUSED_WRONG_PORT,
    REFUSED_BAD_HEADER,
    REFUSED_BAD_QUEUE_NAME,
    REFUSED_QUEUE_NAME_TOO_LONG,
    REFUSED_BAD_RUN_AFTER,
    REFUSED_BODY_TOO_BIG,
    REFUSED_TOO_DEEP,
    REFUSED_JOURNAL,
    REFUSED_LEASE_LOST,
    REFUSED_QUEUE_FULL,
    REFUSED_SHUTTING_DOWN,
    REFUSED_TOO_MANY_QUEUES,
    REFUSED_BAD_WORKFLOW,
)

_QUEUE_NAME_FORBIDDEN = frozenset(",:")  # separators of --queues and INFORM's name:weight


def refusal_counter(code: str) -> str:
    """The counter a refusal with ``code`` is counted in: ``refused_bad_header``."""
    return "refused_" + code.replace("-", "_")


def check_queue_name(name: Any) -> str:
    """``name`` if it is a queue name a job manager can serve; raises ``TypeError``
    (not a str) or ``ValueError`` (empty, over 255 bytes, whitespace, control
    characters, ``,`` or ``:``)."""
    if not isinstance(name, str):
        raise TypeError(f"a queue name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("a queue name cannot be empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_LENGTH:
        raise ValueError(f"queue name is {size} bytes; the most is {MAX_NAME_LENGTH} (UTF-8)")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise ValueError(f"queue name {name[:40]!r} has whitespace or control characters")
    if _QUEUE_NAME_FORBIDDEN.intersection(name):
        raise ValueError(f"queue name {name[:40]!r} cannot contain ',' or ':'")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"queue name {name[:40]!r} is not valid Unicode") from None
    return name


MAX_JOB_ID = 200  # bytes (UTF-8) of a job id the caller chooses: room for "#<attempt>"


def check_job_id(job_id: Any) -> bytes:
    """A job id the caller chose, encoded; raises ``TypeError`` (not a str) or
    ``ValueError`` (empty, not printable, with ``#``, over ``MAX_JOB_ID`` bytes of
    UTF-8, or not valid Unicode)."""
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
    if not job_id or not job_id.isprintable() or "#" in job_id:
        raise ValueError(f"job_id {job_id[:40]!r} must be printable, without '#', not empty")
    try:
        encoded = job_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"job_id {job_id[:40]!r} is not valid Unicode") from None
    if len(encoded) > MAX_JOB_ID:
        raise ValueError(
            f"job_id is {len(encoded)} bytes of UTF-8 ({len(job_id)} characters); "
            f"the most is {MAX_JOB_ID} bytes"
        )
    return encoded


def check_count(what: str, value: Any, limit: int = MAX_RETRIES) -> int:
    """A non-negative integer option (``retries``) up to ``limit``; raises
    ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    if value > limit:
        raise ValueError(f"{what} is {value}; the most is {limit}")
    return value


def check_priority(value: Any) -> int:
    """A job's priority, an int from ``MIN_PRIORITY`` to ``MAX_PRIORITY`` (higher
    runs first); raises ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int from -100 to 100, got {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"priority must be from -100 to 100 (higher first), got {value}")
    return value


def check_unique_key(value: Any) -> str:
    """A unique key: a non-empty str of at most ``MAX_UNIQUE_KEY`` characters, no
    comma (the headers frame's separator); raises ``TypeError``/``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"unique_key must be a str, got {value!r}")
    if not value:
        raise ValueError("unique_key must not be empty")
    if len(value) > MAX_UNIQUE_KEY:
        raise ValueError(f"unique_key is {len(value)} characters; the most is {MAX_UNIQUE_KEY}")
    if "," in value:
        raise ValueError(f"unique_key cannot contain a comma: {value[:40]!r}")
    return value


def check_seconds(what: str, value: Any, limit: float = math.inf) -> float:
    """A finite, non-negative number of seconds (``timeout``, ``countdown``) up to
    ``limit``; raises ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    if value > limit:
        raise ValueError(f"{what} is {value:g} s; the most is {limit:g} s")
    return float(value)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists, tuples and dicts in ``value`` nest more than ``limit`` deep.
    Iterative: it never meets the recursion limit, and stops on a cycle."""
    containers = (list, tuple, dict)
    if not isinstance(value, containers):
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, containers):
                stack.append((child, depth + 1))
    return False


def may_nest_deeper_than(text: str | bytes, limit: int) -> bool:
    """A cheap first test on encoded JSON: fewer opening brackets than ``limit``
    cannot nest deeper (brackets inside strings only make it say maybe)."""
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{") > limit
    return text.count("[") + text.count("{") > limit


# The delivery rule both ends apply: a guaranteed job is retried after at least this
# many deaths of its worker process, whatever its ``retries`` (a job manager killed
# with its jobs must not send durable work to the dead letters).
GUARANTEED_DEATH_RETRIES = 2
