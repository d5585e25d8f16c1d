"""Extension: several jobs per REQUEST, several answers per REPLY, several
credits per READY, between our broker and our worker processes (docs/eventmq-wire.md
§7). Pure. (REQUESTS, several jobs from a client, is protocol/batch.py.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emq_django.protocol.commands import ACK, PROTOCOL, READY, REPLY, REQUEST

# ---- extension: several jobs per REQUEST, several answers per REPLY -----------------
# (docs/eventmq-wire.md §7). Only between our broker and a worker process whose
# INFORM meta says ``"batch": N`` (N >= 2): the broker may then send it up to N jobs
# in one REQUEST, and it may answer several in one REPLY. Nobody else sends or
# receives these.

BATCH_META = "batch"  # the INFORM meta key
# ... and, with it, ``"packed": true``: the broker may send that process its jobs as
# one REQUESTS message (protocol/batch.py's records, one frame for them all) instead
# of a REQUEST of four frames per job: one libzmq call per message, not per field
PACKED_META = "packed"
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


def packs(meta: dict[str, Any]) -> bool:
    """The peer's INFORM announced a batch and packed jobs (``PACKED_META``)."""
    return meta.get(PACKED_META) is True and batch_of(meta) > 1


# ... and ``"packed_replies": true``: the process would send its answers as one
# REPLIES message (protocol/batch.py ``encode_replies``: a record per answer, one
# frame for them all) instead of a REPLY of three frames per answer. A broker that
# reads them says so in its ACK of the INFORM: a frame after the batch's
# (``PACKED_REPLIES_ACK``); until then the process sends REPLYs
PACKED_REPLIES_META = "packed_replies"
PACKED_REPLIES_ACK = b"replies:packed"


def packs_replies(meta: dict[str, Any]) -> bool:
    """The peer's INFORM announced a batch and packed answers (``PACKED_REPLIES_META``)."""
    return meta.get(PACKED_REPLIES_META) is True and batch_of(meta) > 1


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
    """N of an ACK that says ``batch:N`` (see ``batch_ack_frame``; the frame after it,
    if any, says more: ``PACKED_REPLIES_ACK``), else 0."""
    if not 6 <= len(frames) <= 7 or frames[2] != ACK or not frames[5].startswith(b"batch:"):
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
