"""REQUESTS: several REQUESTs in one message (our extension, client -> our broker,
and our broker -> a worker process of ours that announced it: ``unpack_requests``);
REPLIES: several answers in one (a worker process of ours -> our broker).

    ['', 'eMQP/1.0', 'REQUESTS', msgid, jobs]

``jobs`` is one frame holding one record per job, back to back::

    u8 msgid length | u8 queue length | u16 headers length | u32 body length
    | msgid | queue | headers | body

(lengths big-endian), each job exactly what a REQUEST's frames 3-6 would carry.
Only our client sends it, and only to a broker whose ACKs say it reads it
(``MARK``, below); docs/eventmq-wire.md §7 says when and why. Pure: no sockets.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from emq_django.exceptions import ProtocolError
from emq_django.protocol.batching import join_replies
from emq_django.protocol.frames import ACK, MAX_ID_LENGTH, PROTOCOL, REQUEST

REQUESTS = b"REQUESTS"
# The msgid of every ACK our broker sends to a client that flags its REQUESTs with
# ``acks`` starts with this: such a client may send REQUESTS from then on. Other
# peers read an ACK's own msgid as an opaque id (EventMQ's never get these ACKs).
MARK = b"requests:"
# our broker's ACK msgid to such a client: MARK, its incarnation (32 hex digits, a
# fresh one each time it starts), '.', a fresh id: a client finds a restarted broker
# in its first ACK (its plain jobs are lost: client.JobLost)
INCARNATION_CHARS = 32
ACK_ID_LENGTH = len(MARK) + INCARNATION_CHARS + 1 + 32


def ack_id(incarnation: bytes, new_id: bytes) -> bytes:
    """The msgid of our broker's ACK to a client that reads several per ACK."""
    return MARK + incarnation + b"." + new_id


def ack_incarnation(ack_id: bytes) -> bytes | None:
    """The incarnation an ACK's msgid names (``ack_id``), None if it names none."""
    at = len(MARK) + INCARNATION_CHARS
    if len(ack_id) != ACK_ID_LENGTH or ack_id[at : at + 1] != b"." or not ack_id.startswith(MARK):
        return None
    return ack_id[len(MARK) : at]


PACK_SEPARATOR = b"\n"  # between the msgids of a packed ACK
MAX_JOBS = 1024  # in one REQUESTS message; more is malformed
HEAD = struct.Struct(">BBHI")
MAX_HEADERS_LENGTH = 0xFFFF
_pack_head = HEAD.pack
_unpack_head = HEAD.unpack_from
_HEAD_SIZE = HEAD.size

Job = tuple[bytes, bytes, bytes, bytes]  # msgid, queue, headers, body

# REPLIES: a worker process's answers to our broker, one frame of records (the
# "packed_replies" extension, protocol/batching.py): u8 ref length | u8 status length
# | u32 body length | ref | status | body
REPLIES = b"REPLIES"
ANSWER_HEAD = struct.Struct(">BBI")
_pack_answer = ANSWER_HEAD.pack
_unpack_answer = ANSWER_HEAD.unpack_from
_ANSWER_SIZE = ANSWER_HEAD.size


def job_record(msgid: bytes, queue: bytes, headers: bytes, body: bytes) -> list[bytes]:
    """One job's record as parts to join (``encode_requests`` joins them); raises
    ``ValueError`` for a field over its length (the caller sends a REQUEST then)."""
    if not 0 < len(msgid) <= MAX_ID_LENGTH or not 0 < len(queue) <= 255:
        raise ValueError("a msgid and a queue name take 1 to 255 bytes")
    if len(headers) > MAX_HEADERS_LENGTH:
        raise ValueError(f"headers over {MAX_HEADERS_LENGTH} bytes")
    head = _pack_head(len(msgid), len(queue), len(headers), len(body))
    return [head, msgid, queue, headers, body]


def record_head(msgid_length: int, queue: bytes, headers: bytes, body: bytes) -> bytes:
    """A job record's head (the four lengths), for a msgid of ``msgid_length`` bytes."""
    return _pack_head(msgid_length, len(queue), len(headers), len(body))


def requests_frames(msgid: bytes, records: bytes) -> list[bytes]:
    """A REQUESTS message around its job records, already joined: the one place
    its frames are made (``encode_requests``, the client's coalescing buffer)."""
    return [b"", PROTOCOL, REQUESTS, msgid, records]


def encode_requests(msgid: bytes, jobs: Sequence[Job]) -> list[bytes]:
    parts: list[bytes] = []
    for job in jobs:
        parts += job_record(*job)
    return requests_frames(msgid, b"".join(parts))


def encode_packed_ack(msgid: bytes, ref_msgids: Sequence[bytes]) -> list[bytes] | None:
    """The ACK of several msgids in one frame, LF-separated, for a client that sent
    REQUESTS: ``['', 'eMQP/1.0', 'ACK', msgid, b"ref1\nref2..."]``; None when a
    msgid holds an LF itself (then the ACK names them one frame each)."""
    joined = PACK_SEPARATOR.join(ref_msgids)
    if joined.count(PACK_SEPARATOR) != len(ref_msgids) - 1:
        return None
    return [b"", PROTOCOL, ACK, msgid, joined]


def _records(frames: Sequence[bytes], command: str) -> bytes:
    """The records frame of a REQUESTS or REPLIES message (``command``), once its
    frames are checked."""
    if len(frames) != 5:
        raise ProtocolError(f"{command} needs 5 frames, got {len(frames)}", frames)
    if frames[0] or frames[1] != PROTOCOL or not 0 < len(frames[3]) <= MAX_ID_LENGTH:
        raise ProtocolError(f"{command}: not an eMQP/1.0 message with a msgid", frames)
    return frames[4]


def decode_jobs(frames: Sequence[bytes]) -> list[Job]:
    """The jobs of a REQUESTS message (``frames`` without the ROUTER identity),
    or ``ProtocolError`` when the message is malformed anywhere (then none of its
    jobs is taken: a record that overruns the frame, a zero-length msgid or queue,
    bytes left over, over ``MAX_JOBS`` jobs, not 5 frames). A job's queue name
    and headers are checked as a REQUEST's are, by the caller, job by job."""
    data = _records(frames, "REQUESTS")
    end = len(data)
    jobs: list[Job] = []
    at = 0
    try:
        while at < end:
            m, q, h, b = _unpack_head(data, at)
            at += _HEAD_SIZE
            if not m or not q:
                raise ProtocolError(f"REQUESTS: job {len(jobs) + 1} has no msgid or queue", frames)
            i = at + m
            j = i + q
            k = j + h
            at = k + b
            if at > end:
                raise ProtocolError(f"REQUESTS: job {len(jobs) + 1} overruns the frame", frames)
            jobs.append((data[i - m : i], data[i:j], data[j:k], data[k:at]))
            if len(jobs) > MAX_JOBS:
                raise ProtocolError(f"REQUESTS: over {MAX_JOBS} jobs", frames)
    except struct.error:
        raise ProtocolError(f"REQUESTS: job {len(jobs) + 1} is cut short", frames) from None
    if not jobs:
        raise ProtocolError("REQUESTS without a job", frames)
    return jobs


def encode_replies(msgid: bytes, answers: Sequence[tuple[bytes, bytes, bytes]]) -> list[bytes]:
    """A worker process's answers, (body, ref, status) each as ``join_replies`` takes
    them, as one REPLIES message (``decode_replies``); ``ValueError`` for a ref that
    is not 1 to 255 bytes or a status over 255 (the process sends a REPLY then)."""
    parts: list[bytes] = []
    for body, ref, status in answers:
        if not 0 < len(ref) <= MAX_ID_LENGTH or len(status) > 255:
            raise ValueError("a ref takes 1 to 255 bytes, a status at most 255")
        parts += (_pack_answer(len(ref), len(status), len(body)), ref, status, body)
    return [b"", PROTOCOL, REPLIES, msgid, b"".join(parts)]


def answers_frames(
    msgid: bytes, answers: Sequence[tuple[bytes, bytes, bytes]], packed: bool
) -> list[bytes]:
    """One message answering several jobs, (body, ref, status) each: a REPLIES when
    the broker reads them (``packed``) and they fit its records, else a REPLY of
    three frames per answer (protocol/batching.py ``join_replies``)."""
    if packed:
        try:
            return encode_replies(msgid, answers)
        except ValueError:
            pass
    return join_replies(msgid, answers)


def decode_replies(frames: Sequence[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """The answers of a REPLIES message, (ref, status, body) each, or
    ``ProtocolError`` when it is malformed anywhere (then none is taken): as
    ``decode_jobs``, with an answer record for a job record."""
    data = _records(frames, "REPLIES")
    end = len(data)
    answers: list[tuple[bytes, bytes, bytes]] = []
    at = 0
    try:
        while at < end:
            r, s, b = _unpack_answer(data, at)
            at += _ANSWER_SIZE
            if not r:
                raise ProtocolError(f"REPLIES: answer {len(answers) + 1} has no ref", frames)
            i = at + r
            j = i + s
            at = j + b
            if at > end:
                raise ProtocolError(
                    f"REPLIES: answer {len(answers) + 1} overruns the frame", frames
                )
            answers.append((data[i - r : i], data[i:j], data[j:at]))
            if len(answers) > MAX_JOBS:
                raise ProtocolError(f"REPLIES: over {MAX_JOBS} answers", frames)
    except struct.error:
        raise ProtocolError(f"REPLIES: answer {len(answers) + 1} is cut short", frames) from None
    if not answers:
        raise ProtocolError("REPLIES without an answer", frames)
    return answers


def unpack_requests(frames: Sequence[bytes]) -> list[list[bytes]]:
    """The jobs of a REQUESTS message our broker sent a worker process that
    announced ``"packed": true`` (protocol/batching.py ``PACKED_META``), each as the
    7-frame REQUEST it stands for; ``ProtocolError`` as ``decode_jobs``."""
    return [[b"", PROTOCOL, REQUEST, m, q, h, b] for m, q, h, b in decode_jobs(frames)]
