"""eMQP/1.0 commands as typed frames, and the broker's fast encoders.

Every frame list here excludes the ROUTER identity and starts with the empty
delimiter frame, as peers send it: ``['', 'eMQP/1.0', COMMAND, msgid, ...]``.
Each command's ``encode()`` sends what the released EventMQ 0.3.13 peers
understand (specs/WIRE-NOTES.md); decoding is protocol/decoding.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from emq_django.protocol.headers import Headers
from emq_django.protocol.reply_status import reply_flags

PROTOCOL = b"eMQP/1.0"
MAX_ID_LENGTH = 255
# a msgid over MAX_ID_LENGTH is refused, and named in the ERROR up to this length
# (its sender waits on it); a longer one is dropped
MAX_ANSWERED_ID_LENGTH = 4096

ACK = b"ACK"
REPLY = b"REPLY"
HEARTBEAT = b"HEARTBEAT"
DISCONNECT = b"DISCONNECT"
KBYE = b"KBYE"
KBAI = b"KBAI"
REQUEST = b"REQUEST"
PUBLISH = b"PUBLISH"
SCHEDULE = b"SCHEDULE"
UNSCHEDULE = b"UNSCHEDULE"
INFORM = b"INFORM"
READY = b"READY"
ERROR = b"ERROR"  # extension: the broker refused the command named by ref_msgid
KILL = b"KILL"  # extension: broker -> our job manager only, stop the process running an attempt
STOP = b"STOP"  # extension: broker -> our job manager only, finish the running jobs and exit
# extension: broker -> our job manager only, run this many worker processes from now on
RESIZE = b"RESIZE"
# extension: a partial result of a running attempt, our worker -> broker -> our client
# (only a client whose REQUEST carried the ``stream`` header); docs/eventmq-wire.md
PARTIAL = b"PARTIAL"
# extension: our job manager -> broker, on its control connection only: one of its
# worker processes ended, and every answer of that process it had went before this
ENDED = b"ENDED"

PEER_WORKER = "worker"
PEER_SCHEDULER = "scheduler"


@dataclass(frozen=True, slots=True)
class Ack:
    msgid: bytes
    ack_msgid: bytes

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, ACK, self.msgid, self.ack_msgid]


@dataclass(frozen=True, slots=True)
class Reply:
    """A job's reply. ``request_msgid`` names the REQUEST it answers.

    ``status`` is an extension frame our job managers add (``ok``/``failed``
    plus flags such as ``ready``); EventMQ's job manager sends none.
    """

    msgid: bytes
    body: bytes
    request_msgid: bytes = b""
    status: bytes = b""

    def encode(self) -> list[bytes]:
        frames = [b"", PROTOCOL, REPLY, self.msgid, self.body]
        if self.request_msgid or self.status:
            frames.append(self.request_msgid)
        if self.status:
            frames.append(self.status)
        return frames

    @property
    def failed(self) -> bool:
        return reply_flags(self.status)[0]

    @property
    def ready(self) -> bool:
        return reply_flags(self.status)[1]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    msgid: bytes
    timestamp: float
    # extension: our job manager's memory, now and then (protocol/memory_report.py)
    memory: dict[str, Any] | None = None

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, HEARTBEAT, self.msgid, repr(self.timestamp).encode()]


@dataclass(frozen=True, slots=True)
class Disconnect:
    msgid: bytes

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, DISCONNECT, self.msgid]


@dataclass(frozen=True, slots=True)
class Kbye:
    """Goodbye. Decoded from KBYE (the released code) or KBAI (the document)."""

    msgid: bytes

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, KBYE, self.msgid]


@dataclass(frozen=True, slots=True)
class Request:
    msgid: bytes
    queue: str
    headers: Headers
    body: bytes

    def encode(self) -> list[bytes]:
        return [
            b"",
            PROTOCOL,
            REQUEST,
            self.msgid,
            self.queue.encode(),
            self.headers.raw,
            self.body,
        ]


@dataclass(frozen=True, slots=True)
class Publish:
    msgid: bytes
    topic: str
    headers: Headers
    body: bytes

    def encode(self) -> list[bytes]:
        return [
            b"",
            PROTOCOL,
            PUBLISH,
            self.msgid,
            self.topic.encode(),
            self.headers.raw,
            self.body,
        ]


@dataclass(frozen=True, slots=True)
class Schedule:
    """SCHEDULE; ``interval`` is None in the document's 7-frame form, -1 for cron."""

    msgid: bytes
    queue: str
    headers: Headers
    body: bytes
    interval: int | None = None
    cron: str = ""

    command = SCHEDULE

    def encode(self) -> list[bytes]:
        frames = [b"", PROTOCOL, self.command, self.msgid, self.queue.encode(), self.headers.raw]
        if self.interval is None:
            return [*frames, self.body]
        return [*frames, str(self.interval).encode(), self.body, self.cron.encode()]


@dataclass(frozen=True, slots=True)
class Unschedule(Schedule):
    command = UNSCHEDULE


@dataclass(frozen=True, slots=True)
class Inform:
    """INFORM. ``queues`` are (weight, name), highest weight first.

    ``meta`` is an optional extension frame (JSON object) our peers add: host,
    pid, role (``manager`` or ``slot``) and the manager a slot belongs to.
    """

    msgid: bytes
    queues: tuple[tuple[int, str], ...]
    peer_type: str
    meta: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> list[bytes]:
        queues = json.dumps([[w, q] for w, q in self.queues]).encode() if self.queues else b""
        frames = [b"", PROTOCOL, INFORM, self.msgid, queues, self.peer_type.encode()]
        if self.meta:
            frames.append(json.dumps(self.meta, separators=(",", ":")).encode())
        return frames


@dataclass(frozen=True, slots=True)
class Ready:
    msgid: bytes

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, READY, self.msgid]


@dataclass(frozen=True, slots=True)
class Error:
    """Extension: the broker refused the command ``ref_msgid`` for ``reason``."""

    msgid: bytes
    ref_msgid: bytes
    reason: str
    code: str = "refused"

    def encode(self) -> list[bytes]:
        return [
            b"",
            PROTOCOL,
            ERROR,
            self.msgid,
            self.ref_msgid,
            self.code.encode(),
            self.reason.encode(),
        ]


@dataclass(frozen=True, slots=True)
class Kill:
    """Extension: the broker asks our job manager to kill the worker process that
    runs ``attempt_id`` (``reason``: ``cancelled``). Only sent on a job manager's
    control connection (INFORM ``role: manager``), never to an EventMQ peer."""

    msgid: bytes
    attempt_id: bytes
    reason: str = "cancelled"

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, KILL, self.msgid, self.attempt_id, self.reason.encode()]


@dataclass(frozen=True, slots=True)
class Stop:
    """Extension: the broker asks our job manager to stop as on its first SIGTERM
    (its running jobs finish, it says goodbye and exits); ``reason``: who asked.
    Only sent on a job manager's control connection, never to an EventMQ peer."""

    msgid: bytes
    reason: str = "stopped from the admin"

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, STOP, self.msgid, self.reason.encode()]


@dataclass(frozen=True, slots=True)
class Resize:
    """Extension: the broker asks our job manager to run ``concurrency`` worker
    processes from now on (the admin's pool resize): it starts more, or stops idle
    ones first and lets busy ones finish their running job. Only sent on a job
    manager's control connection, never to an EventMQ peer."""

    msgid: bytes
    concurrency: int

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, RESIZE, self.msgid, b"%d" % self.concurrency]


@dataclass(frozen=True, slots=True)
class Partial:
    """Extension: partial result number ``seq`` (1, 2, ... within the attempt) of
    the attempt ``attempt_id`` (``<job id>#<n>``): a value a generator task
    yielded, or ``emq.partial(value)``. ``body`` is ``{"value": ...}`` as in a REPLY.

    Our worker process sends it to the broker as soon as the value exists; the
    broker forwards body, attempt id and seq unchanged to the job's client when
    that client asked for partials (header ``stream``). Never sent to an EventMQ
    peer. ``seq`` lets the client see a gap, and the attempt number a restart."""

    msgid: bytes
    body: bytes
    attempt_id: bytes
    seq: int

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, PARTIAL, self.msgid, self.body, self.attempt_id, b"%d" % self.seq]

    @property
    def job_id(self) -> bytes:
        """The client's msgid: the attempt id without its ``#<n>``."""
        job_id, sep, _ = self.attempt_id.rpartition(b"#")
        return job_id if sep else self.attempt_id

    @property
    def attempt(self) -> int:
        """The attempt's number (1, 2, ...); 1 for an id without ``#<n>``."""
        _, sep, number = self.attempt_id.rpartition(b"#")
        return int(number) if sep and number.isdigit() and len(number) < 10 else 1


@dataclass(frozen=True, slots=True)
class Ended:
    """Extension: our job manager says that its worker process ``pid`` ended
    (``how``: ``exit code 1``, ``killed by signal 9``). Sent on its control
    connection after every answer of that process it had to send (those the
    process held or sent last, the ``lost`` one of the job it was running), so the
    broker knows that the process's other jobs in flight never started. Never sent
    by an EventMQ peer."""

    msgid: bytes
    pid: int
    how: str = ""

    def encode(self) -> list[bytes]:
        return [b"", PROTOCOL, ENDED, self.msgid, b"%d" % self.pid, self.how.encode()]


Command: TypeAlias = (
    Ack
    | Reply
    | Heartbeat
    | Disconnect
    | Kbye
    | Request
    | Publish
    | Schedule
    | Unschedule
    | Inform
    | Ready
    | Error
    | Kill
    | Stop
    | Resize
    | Partial
    | Ended
)


# ---- fast encoders for the broker's hot path ----------------------------------------
# The same frames as the dataclasses' ``encode()``, without building a frozen
# dataclass per message (several per job).


def encode_ack(msgid: bytes, ref_msgid: bytes) -> list[bytes]:
    return [b"", PROTOCOL, ACK, msgid, ref_msgid]


# The REQUEST header flag of a client that reads an ACK naming several msgids.
ACKS_FLAG = b"acks"


def encode_acks(msgid: bytes, ref_msgids: Sequence[bytes]) -> list[bytes]:
    """Extension: one ACK for several messages, ``[..., ACK, msgid, ref1, ref2, ...]``
    (one frame per acknowledged msgid). Only to a client whose REQUESTs carry the
    ``acks`` header flag (our client); one msgid makes the document's ACK."""
    return [b"", PROTOCOL, ACK, msgid, *ref_msgids]


def with_acks_flag(headers: bytes) -> bytes:
    """``headers`` with the ``acks`` flag added (once)."""
    if not headers:
        return ACKS_FLAG
    if ACKS_FLAG in headers.split(b","):
        return headers
    return headers + b"," + ACKS_FLAG


def encode_reply(msgid: bytes, body: bytes, ref_msgid: bytes, status: bytes) -> list[bytes]:
    return [b"", PROTOCOL, REPLY, msgid, body, ref_msgid, status]


def encode_request(msgid: bytes, queue: bytes, headers: bytes, body: bytes) -> list[bytes]:
    return [b"", PROTOCOL, REQUEST, msgid, queue, headers, body]


def encode_heartbeat(msgid: bytes, wall: float, report: bytes = b"") -> list[bytes]:
    """``report``: a sixth frame, our job manager's memory (protocol/memory_report.py)."""
    frames = [b"", PROTOCOL, HEARTBEAT, msgid, b"%.6f" % wall]
    if report:
        frames.append(report)
    return frames


# Extension: our broker answers a client's HEARTBEAT with a HEARTBEAT whose msgid is
# this mark and the broker's incarnation (a fresh one each time it starts). Our client
# asks on each new connection: a new incarnation has lost the plain jobs it had.
INCARNATION = b"incarnation:"


def encode_incarnation(incarnation: bytes, wall: float) -> list[bytes]:
    return encode_heartbeat(INCARNATION + incarnation, wall)


def encode_ready(msgid: bytes) -> list[bytes]:
    return [b"", PROTOCOL, READY, msgid]


def encode_disconnect(msgid: bytes) -> list[bytes]:
    return [b"", PROTOCOL, DISCONNECT, msgid]
