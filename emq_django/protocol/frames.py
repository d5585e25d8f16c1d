"""eMQP/1.0 commands as typed frames.

Every frame list here excludes the ROUTER identity and starts with the empty
delimiter frame, as peers send it: ``['', 'eMQP/1.0', COMMAND, msgid, ...]``.
``decode()`` accepts what the document says and what the released EventMQ
0.3.13 peers send (specs/WIRE-NOTES.md); ``encode()`` sends what those peers
understand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

from emq_django.exceptions import ProtocolError
from emq_django.protocol.headers import Headers, parse_headers
from emq_django.protocol.limits import (
    MAX_INTERVAL,
    MAX_NAME_LENGTH,
    REFUSED_BAD_QUEUE_NAME,
    REFUSED_QUEUE_NAME_TOO_LONG,
    REFUSED_UNKNOWN_COMMAND,
    check_queue_name,
)

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
    | Partial
    | Ended
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


STATUS_OK = b"ok"
STATUS_FAILED = b"failed"
FLAG_READY = b"ready"
FLAG_LOST = b"lost"  # the attempt ended with its worker process: killed, died, timed out
FLAG_REQUEUE = b"requeue"  # the worker process gives the job back unstarted
MAX_STATUS_LENGTH = 255
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


def _decode_ack(f: Sequence[bytes]) -> Ack:
    _count(f, "ACK", 5)
    return Ack(f[3], f[4])


def _decode_reply(f: Sequence[bytes]) -> Reply:
    _count(f, "REPLY", 5, 6, 7)
    request_msgid = f[5] if len(f) > 5 else b""
    status = f[6] if len(f) > 6 else b""
    if len(status) > MAX_STATUS_LENGTH:
        raise ProtocolError("REPLY status frame too long", f)
    return Reply(f[3], f[4], request_msgid, status)


def _decode_heartbeat(f: Sequence[bytes]) -> Heartbeat:
    _count(f, "HEARTBEAT", 4, 5)
    stamp = 0.0
    if len(f) == 5 and f[4]:
        try:
            stamp = float(f[4])
        except ValueError:
            raise ProtocolError("HEARTBEAT timestamp is not a number", f) from None
        if not math.isfinite(stamp):
            raise ProtocolError("HEARTBEAT timestamp is not a finite number", f)
    return Heartbeat(f[3], stamp)


def _decode_disconnect(f: Sequence[bytes]) -> Disconnect:
    _count(f, "DISCONNECT", 4)
    return Disconnect(f[3])


def _decode_kbye(f: Sequence[bytes]) -> Kbye:
    _count(f, "KBYE", 4)
    return Kbye(f[3])


def _decode_request(f: Sequence[bytes]) -> Request:
    _count(f, "REQUEST", 7)
    return Request(f[3], _job_queue(f[4], f), parse_headers(f[5]), f[6])


def _decode_publish(f: Sequence[bytes]) -> Publish:
    _count(f, "PUBLISH", 6, 7)
    if len(f) == 6:
        return Publish(f[3], _queue_name(f[4], f), Headers(), f[5])
    return Publish(f[3], _queue_name(f[4], f), parse_headers(f[5]), f[6])


def _decode_schedule_like(cls: type[Schedule]) -> Callable[[Sequence[bytes]], Schedule]:
    def decode(f: Sequence[bytes]) -> Schedule:
        _count(f, cls.command.decode(), 7, 9)
        if cls is Schedule:  # the jobs it sends must find a job manager
            queue = _job_queue(f[4], f)
        else:  # unscheduling names what was scheduled: no more than text is needed
            queue = _text(f[4], "queue name", f, codes=_QUEUE_CODES)
        headers = parse_headers(f[5])
        if len(f) == 7:
            return cls(f[3], queue, headers, f[6])
        try:
            interval = int(f[6])
        except ValueError:
            raise ProtocolError("interval is not an integer", f) from None
        cron = _text(f[8], "cron expression", f)
        if interval < 0 and interval != -1:
            raise ProtocolError("interval must be >= 0, or -1 for cron", f)
        if interval > MAX_INTERVAL:
            raise ProtocolError(f"interval is {interval} s; the most is {MAX_INTERVAL:.0f}", f)
        if interval == -1 and not cron and cls is Schedule:
            # EventMQ's unschedule sends -1 with no cron; only SCHEDULE needs one
            raise ProtocolError("interval -1 needs a cron expression", f)
        return cls(f[3], queue, headers, f[7], interval, cron)

    return decode


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


def _decode_inform(f: Sequence[bytes]) -> Inform:
    _count(f, "INFORM", 6, 7)
    peer_type = _text(f[5], "peer type", f)
    if peer_type not in (PEER_WORKER, PEER_SCHEDULER):
        raise ProtocolError(f"unknown peer type {peer_type!r}", f)
    queues = parse_queues(f[4], f)
    meta: dict[str, Any] = {}
    if len(f) == 7 and f[6]:
        try:
            meta = _json(f[6], "INFORM meta frame", f)
        except ValueError:
            raise ProtocolError("INFORM meta frame is not JSON", f) from None
        if not isinstance(meta, dict):
            raise ProtocolError("INFORM meta frame must be a JSON object", f)
    return Inform(f[3], queues, peer_type, meta)


def _decode_ready(f: Sequence[bytes]) -> Ready:
    _count(f, "READY", 4)
    return Ready(f[3])


def _decode_error(f: Sequence[bytes]) -> Error:
    _count(f, "ERROR", 7)
    return Error(f[3], f[4], _text(f[6], "reason", f, 4096), _text(f[5], "code", f))


def _decode_kill(f: Sequence[bytes]) -> Kill:
    _count(f, "KILL", 6)
    if not f[4] or len(f[4]) > MAX_ID_LENGTH:
        raise ProtocolError("KILL needs an attempt id of 1 to 255 bytes", f)
    return Kill(f[3], f[4], _text(f[5], "reason", f))


def _decode_partial(f: Sequence[bytes]) -> Partial:
    _count(f, "PARTIAL", 7)
    if not f[5] or len(f[5]) > MAX_ID_LENGTH:
        raise ProtocolError("PARTIAL needs an attempt id of 1 to 255 bytes", f)
    if not (0 < len(f[6]) < 10 and f[6].isdigit() and f[6][:1] != b"0"):
        raise ProtocolError("PARTIAL needs a sequence number from 1", f)
    return Partial(f[3], f[4], f[5], int(f[6]))


def _decode_ended(f: Sequence[bytes]) -> Ended:
    _count(f, "ENDED", 6)
    if not (0 < len(f[4]) < 10 and f[4].isdigit()):
        raise ProtocolError("ENDED needs a process id (ASCII decimal)", f)
    return Ended(f[3], int(f[4]), _text(f[5], "how", f))


_DECODERS: dict[bytes, Callable[[Sequence[bytes]], Command]] = {
    ACK: _decode_ack,
    REPLY: _decode_reply,
    HEARTBEAT: _decode_heartbeat,
    DISCONNECT: _decode_disconnect,
    KBYE: _decode_kbye,
    KBAI: _decode_kbye,
    REQUEST: _decode_request,
    PUBLISH: _decode_publish,
    SCHEDULE: _decode_schedule_like(Schedule),
    UNSCHEDULE: _decode_schedule_like(Unschedule),
    INFORM: _decode_inform,
    READY: _decode_ready,
    ERROR: _decode_error,
    KILL: _decode_kill,
    PARTIAL: _decode_partial,
    ENDED: _decode_ended,
}


# Commands whose sender waits for an answer (an ACK), so a refusal gets an ERROR.
_AWAITED = {
    "frontend": frozenset((REQUEST, PUBLISH, SCHEDULE, UNSCHEDULE, INFORM)),
    "backend": frozenset((INFORM,)),
}


def answerable_msgid(frames: Sequence[bytes], port: str = "frontend") -> bytes | None:
    """The msgid to name in an ERROR for a message ``decode()`` refused, or None
    when the frames are too broken to find one (or the command expects no
    answer: HEARTBEAT, READY, REPLY, ...). ``port``: ``frontend`` (clients and
    schedulers: an unknown command is answered too) or ``backend``."""
    if len(frames) < 4 or frames[0] or frames[1] != PROTOCOL:
        return None
    msgid = frames[3]
    if not msgid or len(msgid) > MAX_ANSWERED_ID_LENGTH:
        return None
    command = frames[2]
    if command in _AWAITED[port] or (port == "frontend" and command not in _DECODERS):
        return bytes(msgid)
    return None


def decode(frames: Sequence[bytes]) -> Command:
    """Decode one message (without ROUTER identity); raises ``ProtocolError``."""
    if len(frames) < 4:
        raise ProtocolError(f"too few frames ({len(frames)})", frames)
    if frames[0]:
        raise ProtocolError("first frame must be empty", frames)
    if frames[1] != PROTOCOL:
        raise ProtocolError(f"unknown protocol {bytes(frames[1][:32])!r}", frames)
    decoder = _DECODERS.get(frames[2])
    if decoder is None:
        raise ProtocolError(
            f"unknown command {bytes(frames[2][:32])!r}", frames, REFUSED_UNKNOWN_COMMAND
        )
    if not frames[3] or len(frames[3]) > MAX_ID_LENGTH:
        raise ProtocolError(
            f"msgid is {len(frames[3])} bytes; it must be 1 to {MAX_ID_LENGTH} "
            "(a job id: at most 200 bytes of UTF-8)",
            frames,
        )
    return decoder(frames)


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


def encode_heartbeat(msgid: bytes, wall: float) -> list[bytes]:
    return [b"", PROTOCOL, HEARTBEAT, msgid, b"%.6f" % wall]


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


# ---- extension: several jobs per REQUEST, several answers per REPLY -----------------
# (docs/eventmq-wire.md §7). Only between our broker and a worker process whose
# INFORM meta says ``"batch": N`` (N >= 2): the broker may then send it up to N jobs
# in one REQUEST, and it may answer several in one REPLY. Nobody else sends or
# receives these.

BATCH_META = "batch"  # the INFORM meta key
MAX_BATCH = 64  # the most jobs the broker puts in one message, whatever the peer says
_REQUEST_JOB = 4  # frames per job in a REQUEST: msgid, queue, headers, body
_REPLY_ANSWER = 3  # frames per answer in a REPLY: body, request msgid, status


def batch_of(meta: dict[str, Any]) -> int:
    """The most jobs a peer takes per REQUEST, from its INFORM meta (1: one, as
    the document says, for every peer that did not ask for more)."""
    value = meta.get(BATCH_META)
    if type(value) is not int or value < 2:
        return 1
    return min(value, MAX_BATCH)


def join_requests(first: list[bytes], more: Sequence[list[bytes]]) -> list[bytes]:
    """One REQUEST carrying the jobs of several 7-frame REQUESTs (``first`` and
    ``more``): ``['', PROTOCOL, REQUEST, msgid1, queue1, headers1, body1, msgid2, ...]``."""
    frames = list(first)
    for request in more:
        frames += request[3:]
    return frames


def batch_ack_frame(batch: int) -> bytes:
    """The frame the broker adds to its ACK of an INFORM that announced a batch
    (``['', PROTOCOL, ACK, msgid, inform_msgid, b'batch:N']``): the peer may send
    REPLYs of several answers and READYs of several credits from then on."""
    return b"batch:%d" % batch


def acked_batch(frames: Sequence[bytes]) -> int:
    """N of an ACK that says ``batch:N`` (see ``batch_ack_frame``), else 0."""
    if len(frames) != 6 or frames[2] != ACK or not frames[5].startswith(b"batch:"):
        return 0
    n = frames[5][6:]
    return int(n) if n.isdigit() and len(n) <= 4 else 0


MAX_READY_COUNT = 1024  # the most credit one READY of the extension gives


def encode_readies(msgid: bytes, count: int) -> list[bytes]:
    """One READY giving ``count`` credits: ``['', PROTOCOL, READY, msgid, count]``
    (ASCII decimal); only from a peer that announced a batch."""
    return [b"", PROTOCOL, READY, msgid, b"%d" % count]


def ready_count(frame: bytes) -> int:
    """The credit a 5-frame READY gives; 0 when its count frame is not 1 to
    MAX_READY_COUNT in ASCII decimal without a leading zero."""
    if not 0 < len(frame) <= 4 or not frame.isdigit() or frame[:1] == b"0":
        return 0
    count = int(frame)
    return count if count <= MAX_READY_COUNT else 0


def join_replies(msgid: bytes, answers: Sequence[tuple[bytes, bytes, bytes]]) -> list[bytes]:
    """One REPLY answering several jobs: ``['', PROTOCOL, REPLY, msgid, body1,
    ref1, status1, body2, ref2, status2, ...]``; ``answers``: (body, ref, status)."""
    frames = [b"", PROTOCOL, REPLY, msgid]
    for body, ref, status in answers:
        frames += (body, ref, status)
    return frames


def split_batch(frames: Sequence[bytes]) -> list[list[bytes]] | None:
    """The 7-frame REQUESTs or REPLYs a batched message carries (a REQUEST of
    3 + 4k frames, a REPLY of 4 + 3k, k >= 2), each with the message's msgid;
    None when ``frames`` is not one (a plain message, or anything malformed,
    which ``decode`` then refuses)."""
    n = len(frames)
    if n <= 7 or frames[0] or frames[1] != PROTOCOL:
        return None
    command = frames[2]
    if command == REQUEST and (n - 3) % _REQUEST_JOB == 0:
        return [[b"", PROTOCOL, REQUEST, *frames[i : i + 4]] for i in range(3, n, 4)]
    if command == REPLY and (n - 4) % _REPLY_ANSWER == 0:
        msgid = frames[3]
        return [[b"", PROTOCOL, REPLY, msgid, *frames[i : i + 3]] for i in range(4, n, 3)]
    return None
