"""The reply of a finished guaranteed job, kept in the journal with its done row.

Why: at a failover the old active broker may have acknowledged a guaranteed job,
run it and journaled it done, then died (or been paused, or cut off) before the
reply reached its client. The client then sends the job again to the new active
broker, which knows the id only as done (de-duplication): without the reply in
the journal, ``get()`` would wait for nothing (``ResultTimeout``). So when the
client wants a reply, the done row carries it (``KeepReply``: the row's ``body``
column, which a done row otherwise empties), a restored broker keeps it in memory
(``BrokerCore.unclaimed``) and answers the client that sends the id again.

Only for jobs whose client wants a reply: the plain guaranteed path writes what it
wrote before. The journal keeps the reply as long as it keeps the done row (the
de-duplication window, ``PruneDone``); in memory it is dropped once claimed.

The encoding is the core's, not a protocol's: a flag (failed or not), the eMQP
status frame (``Outcome.raw``: what our client port sends), the body and any
further body frames (Majordomo replies), each length-prefixed.
"""

from __future__ import annotations

import struct

_LEN = struct.Struct(">I")
_FAILED, _OK = b"F", b"S"


def encode_reply(failed: bool, status: bytes, body: bytes, more: tuple[bytes, ...] = ()) -> bytes:
    """The bytes kept in the journal for a final outcome: whether it failed, its
    eMQP status frame, its body frames. (Plain values: this module stays out of
    the core's import cycle of effects and ports.)"""
    parts = [_FAILED if failed else _OK, status, body, *more]
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def decode_reply(data: bytes) -> tuple[bool, bytes, bytes, tuple[bytes, ...]] | None:
    """(failed, status, body, more) from ``encode_reply``'s bytes; None for anything
    else (an empty done row, a damaged one): then there is nothing to answer with."""
    parts: list[bytes] = []
    at, end = 0, len(data)
    try:
        while at < end:
            (n,) = _LEN.unpack_from(data, at)
            at += _LEN.size
            if at + n > end:
                return None
            parts.append(bytes(data[at : at + n]))
            at += n
    except struct.error:
        return None
    if len(parts) < 3 or parts[0] not in (_FAILED, _OK):
        return None
    return parts[0] == _FAILED, parts[1], parts[2], tuple(parts[3:])
