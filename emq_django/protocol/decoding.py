"""``decode()``: eMQP/1.0 frames to typed commands (protocol/commands.py).

Accepts what the document says and what the released EventMQ 0.3.13 peers
send (specs/WIRE-NOTES.md); every malformed input raises ``ProtocolError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.commands import (
    ACK,
    DISCONNECT,
    ENDED,
    ERROR,
    HEARTBEAT,
    INFORM,
    KBAI,
    KBYE,
    KILL,
    MAX_ANSWERED_ID_LENGTH,
    MAX_ID_LENGTH,
    PARTIAL,
    PEER_SCHEDULER,
    PEER_WORKER,
    PROTOCOL,
    PUBLISH,
    READY,
    REPLY,
    REQUEST,
    RESIZE,
    SCHEDULE,
    STOP,
    UNSCHEDULE,
    Ack,
    Command,
    Disconnect,
    Ended,
    Error,
    Heartbeat,
    Inform,
    Kbye,
    Kill,
    Partial,
    Publish,
    Ready,
    Reply,
    Request,
    Resize,
    Schedule,
    Stop,
    Unschedule,
)
from emq_django.protocol.headers import Headers, parse_headers
from emq_django.protocol.limits import (
    MAX_INTERVAL,
    REFUSED_UNKNOWN_COMMAND,
)
from emq_django.protocol.memory_report import decode_memory
from emq_django.protocol.reply_status import MAX_STATUS_LENGTH
from emq_django.protocol.validation import (
    _QUEUE_CODES,
    _count,
    _job_queue,
    _json,
    _queue_name,
    _text,
    parse_queues,
)


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
    _count(f, "HEARTBEAT", 4, 5, 6)
    stamp = 0.0
    if len(f) >= 5 and f[4]:
        try:
            stamp = float(f[4])
        except ValueError:
            raise ProtocolError("HEARTBEAT timestamp is not a number", f) from None
        if not math.isfinite(stamp):
            raise ProtocolError("HEARTBEAT timestamp is not a finite number", f)
    return Heartbeat(f[3], stamp, decode_memory(f[5], f) if len(f) == 6 else None)


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


def _decode_stop(f: Sequence[bytes]) -> Stop:
    _count(f, "STOP", 5)
    return Stop(f[3], _text(f[4], "reason", f))


def _decode_resize(f: Sequence[bytes]) -> Resize:
    _count(f, "RESIZE", 5)
    if not (0 < len(f[4]) < 10 and f[4].isdigit() and f[4][:1] != b"0"):
        raise ProtocolError("RESIZE needs a number of worker processes from 1", f)
    return Resize(f[3], int(f[4]))


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
    STOP: _decode_stop,
    RESIZE: _decode_resize,
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
