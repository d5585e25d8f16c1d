"""The client's inbox: what the broker sends back (ACKs, whole or packed, REPLYs,
partial results, ERRORs, incarnations), kept until a caller takes it, and
the waits for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from emq_django import wire
from emq_django.client.incarnations import MAX_KEPT_REPLIES, Incarnations
from emq_django.client.lifetime import _Flusher
from emq_django.exceptions import (
    DuplicateJob,
    JobRefused,
    JobsRefused,
    ProtocolError,
    QueueFull,
)
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.protocol.frames import decode
from emq_django.protocol.limits import DUPLICATE, DUPLICATE_OF, REFUSED_LEASE_LOST

log = logging.getLogger(__name__)

# The backend's calls with plain int flags (emq_django/wire.py says why); the
# REQUEST path below unrolls its seven frames onto them.
_send = wire._send
_recv = wire._recv
_SNDMORE = wire.SNDMORE
_NOBLOCK = wire.NOBLOCK
_MORE_NOBLOCK = _SNDMORE | _NOBLOCK
_POLLIN = wire._POLLIN
_ACK_ID_LENGTH = B.ACK_ID_LENGTH  # the msgid of our broker's ACK, naming its incarnation
_monotonic = time.monotonic
_PROTOCOL = F.PROTOCOL
_encode_request = F.encode_request
_ACK = F.ACK
_REPLY = F.REPLY
_MAX_ID = F.MAX_ID_LENGTH
_MARK = B.MARK
_SEP = B.PACK_SEPARATOR
_LF = _SEP[0]
_second = itemgetter(1)

# Partial results (PARTIAL) wait here until ``Result.stream()`` takes them. A job's
# partials are dropped when ``get()`` takes its REPLY; a result nobody streams keeps
# at most MAX_PARTIALS_PER_JOB (the oldest go first), and at most MAX_STREAMED_JOBS
# jobs keep any (the job whose first partial came first goes first). A stream that
# missed partials this way raises ``PartialsLost`` (docs/features/streaming.md).
MAX_PARTIALS_PER_JOB = 10_000
MAX_STREAMED_JOBS = 1_000


class _Partials:
    """One job's partial results not yet streamed: (attempt, seq, body), in order."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: deque[tuple[int, int, bytes]] = deque()


def refusal(error: F.Error) -> JobRefused | QueueFull:
    if error.code == DUPLICATE and error.reason.startswith(DUPLICATE_OF):
        return DuplicateJob(error.reason[len(DUPLICATE_OF) :])
    cls: type[JobRefused | QueueFull] = QueueFull if error.code == "queue-full" else JobRefused
    return cls(error.reason)


_refusal = refusal


class Inbox(Incarnations):
    def _unacked(self) -> int:
        """Jobs sent or buffered and not yet acknowledged (nor refused)."""
        return len(self._pending) + self._sent_jobs + self._buf_jobs

    def _oldest(self) -> float | None:
        """When the oldest unacknowledged send was made; None when there is none."""
        oldest = next(iter(self._pending.values()), None)
        if self._sent:
            since = self._sent[0][2]
            oldest = since if oldest is None else min(oldest, since)
        return oldest

    def _settle(self) -> None:
        """Move the jobs of the REQUESTS not yet acknowledged into _pending, oldest
        first (for an ACK or a refusal that does not name whole messages)."""
        if not self._sent:
            return
        items = list(self._pending.items())
        for joined, _, since in self._sent:
            items += zip(joined.split(_SEP), repeat(since))
        items.sort(key=_second)  # (stable: each part was in order already)
        self._pending.clear()
        self._pending.update(items)
        self._sent.clear()
        self._sent_jobs = 0

    def take_reply(self, msgid: bytes) -> F.Reply | None:
        """Job ``msgid``'s REPLY if it has come (never blocks); raises ``JobRefused``."""
        with self._lock:
            reply = self._take_reply(msgid)
            if reply is None and self._sock is not None:
                self._flush_buffer()
                self._drain(self._sock)
                reply = self._take_reply(msgid)
            return reply

    def wait_reply(
        self, msgid: bytes, timeout: float | None, sent_at_change: int | None = None
    ) -> F.Reply:
        """The REPLY to job ``msgid``; raises ``ResultTimeout``, ``JobRefused``, or
        ``BrokerUnavailable`` once a send has waited over ``ack_timeout`` for its ACK
        (the broker is gone: the job may never have been taken). ``sent_at_change``:
        a plain job's ``broker_changes`` when it was sent; raises ``JobLost`` once the
        broker it was acknowledged by is known to have been replaced by another.

        Every wait reads all the messages waiting, for every job: a REPLY that came
        meanwhile waits in ``_replies`` for its own ``get()``, which then costs no
        poll (the results of a batch are gathered by whichever ``get()`` waits).
        A wait polls first (it returns at once when a message waits) and reads
        what the poll announced without asking libzmq again."""
        with self._lock:
            reply = self._take_reply(msgid)
            if reply is not None:
                return reply
            self._flush_buffer()  # the job may be among them
        from emq_django.exceptions import ResultTimeout

        deadline = None if timeout is None else _monotonic() + timeout
        while True:
            with self._lock:
                reply = self._take_reply(msgid)
                if reply is not None:
                    return reply
                if sent_at_change is not None and (
                    self.broker_changes > sent_at_change or msgid in self._lost
                ):
                    self._check_lost(msgid)
                remaining = None if deadline is None else deadline - _monotonic()
                if remaining is not None and remaining <= 0:
                    raise ResultTimeout(f"no result for job {msgid.decode()} within {timeout} s")
                # other threads may need the socket: wait in short slices
                slice_ms = 20 if threading.active_count() > 1 + _Flusher.alive else 1000
                wait = slice_ms if remaining is None else min(slice_ms, remaining * 1000)
                sock = self._socket()
                if self._poll(sock, max(int(wait), 1)):
                    self._drain(sock, ready=True)
                else:  # a quiet slice: was the broker refusing us, or is it gone?
                    if self._watch is not None:
                        self._check_handshake()
                    if self._pending or self._sent:
                        self._check_overdue()

    def poll_reply(self, msgid: bytes) -> F.Reply | None:
        return self.take_reply(msgid)

    def _take_reply(self, msgid: bytes) -> F.Reply | None:
        reply = self._replies.pop(msgid, None)
        if reply is None and msgid in self._errors:
            raise _refusal(self._errors.pop(msgid))
        if reply is not None and (self._partials or self._partials_evicted):
            self._partials.pop(msgid, None)  # get() took the outcome: nobody streams now
            self._partials_evicted.pop(msgid, None)
        return reply

    def next_streamed(
        self, msgid: bytes, timeout: float | None
    ) -> tuple[int, int, bytes] | F.Reply:
        """Job ``msgid``'s next partial result as (attempt, seq, body), or after the
        last its REPLY. Raises ``ResultTimeout`` when neither comes within
        ``timeout``, ``JobRefused`` for a refused job, and ``PartialsLost`` when
        partials waiting here were dropped over the bounds (MAX_STREAMED_JOBS)."""
        return self.next_streamed_of({msgid: 0}, timeout)[1]

    def next_streamed_of(
        self, msgids: Mapping[bytes, int], timeout: float | None, then: bytes | None = None
    ) -> tuple[bytes, tuple[int, int, bytes] | F.Reply]:
        """``next_streamed`` for one of ``msgids`` (the steps of a workflow, each
        with its rank; the caller may drop ids between calls): of those with
        something here, the lowest rank's, as (its msgid, its item). ``then``'s
        only when none of ``msgids`` has one (the workflow's own REPLY, which the
        broker sends after its steps'). A lookup costs what has arrived, not
        ``len(msgids)``."""
        from emq_django.exceptions import ResultTimeout

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flush_buffer()
        while True:
            with self._lock:
                found = self._take_streamed_of(msgids, then)
                if found is not None:
                    return found
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    some = [m.decode(errors="replace") for m in list(msgids)[:3]]
                    more = f" and {len(msgids) - 3} more" if len(msgids) > 3 else ""
                    raise ResultTimeout(
                        f"nothing from job {', '.join(some)}{more} within {timeout} s"
                    )
                slice_ms = 20 if threading.active_count() > 1 + _Flusher.alive else 1000
                wait = slice_ms if remaining is None else min(slice_ms, remaining * 1000)
                sock = self._socket()
                if _zmq_poll([(sock, _POLLIN)], max(int(wait), 1)):
                    self._drain(sock, ready=True)
                elif self._watch is not None:
                    self._check_handshake()  # a quiet slice: was the broker refusing us?

    def _take_streamed_of(
        self, msgids: Mapping[bytes, int], then: bytes | None
    ) -> tuple[bytes, tuple[int, int, bytes] | F.Reply] | None:
        if len(msgids) == 1:
            candidates: Iterable[bytes] = msgids
        else:  # what has arrived for them, the lowest rank first
            waiting = (m for m, p in self._partials.items() if p.items)
            arrived = chain(self._partials_evicted, waiting, self._replies, self._errors)
            first = min((m for m in arrived if m in msgids), key=msgids.__getitem__, default=None)
            candidates = () if first is None else (first,)
        for msgid in candidates:
            item = self._take_streamed(msgid)
            if item is not None:
                return msgid, item
        if then is not None:
            item = self._take_streamed(then)
            if item is not None:
                return then, item
        return None

    def _take_streamed(self, msgid: bytes) -> tuple[int, int, bytes] | F.Reply | None:
        if msgid in self._partials_evicted:
            from emq_django.exceptions import PartialsLost

            del self._partials_evicted[msgid]
            raise PartialsLost(
                f"partial results of job {msgid.decode(errors='replace')} were dropped: "
                f"over {MAX_STREAMED_JOBS} jobs had partials waiting (stream them, or get())"
            )
        waiting = self._partials.get(msgid)
        if waiting is not None and waiting.items:
            return waiting.items.popleft()
        return self._take_reply(msgid)

    def _keep_partial(self, cmd: F.Partial) -> None:
        job_id = cmd.job_id
        waiting = self._partials.get(job_id)
        if waiting is None:
            waiting = self._partials[job_id] = _Partials()
            if len(self._partials) > MAX_STREAMED_JOBS:
                evicted, _ = self._partials.popitem(last=False)
                self._partials_evicted[evicted] = None
                if len(self._partials_evicted) > MAX_KEPT_REPLIES:
                    self._partials_evicted.popitem(last=False)
        waiting.items.append((cmd.attempt, cmd.seq, cmd.body))
        if len(waiting.items) > MAX_PARTIALS_PER_JOB:
            waiting.items.popleft()  # the stream sees the gap in the seq numbers

    def _drain(self, sock: zmq.Socket[Any], ready: bool = False) -> None:
        """Handle every message waiting, without blocking. ACKs (one per message
        sent) and REPLYs take a short path with the checks ``decode()`` makes.

        Whether a message waits is asked with a poll of no time (1.7 us here; a
        ``getsockopt(EVENTS)`` cost 3.2, pyzmq making an enum of it, and reading
        on until ``zmq.Again`` 8.7, pyzmq making the exception): before the first
        message, unless ``ready`` says a poll has just said one waits, and after
        each."""
        pending = self._pending
        if not ready and not _zmq_poll([(sock, _POLLIN)], 0):
            return
        while True:
            try:
                frame = _recv(sock, _NOBLOCK, False)
            except zmq.Again:
                return
            frames = [frame.bytes]
            while frame.more:
                frame = _recv(sock, _NOBLOCK, False)
                frames.append(frame.bytes)
            n = len(frames)
            if not (
                n >= 5
                and not frames[0]
                and frames[1] == _PROTOCOL
                and 0 < len(frames[3]) <= _MAX_ID
            ):
                self._handle(frames)
            elif n == 5 and frames[2] == _ACK:
                self._confirmed = True
                if not self._coalesce and frames[3].startswith(_MARK):
                    self._coalesce = True  # our broker: it reads REQUESTS
                if len(frames[3]) == _ACK_ID_LENGTH and not frames[3].startswith(self._ack_head):
                    self._ack_from(frames[3])  # our broker's, from another incarnation
                ack_msgid = frames[4]
                if pending.pop(ack_msgid, None) is not None or not (
                    self._sent or _SEP in ack_msgid
                ):
                    if self._answered is not None:
                        self._answered.append(ack_msgid)
                else:  # our broker's, to a sender of REQUESTS (LF-packed, or one job)
                    self._packed_ack(ack_msgid)
            elif n > 5 and frames[2] == _ACK:  # our broker's ACK of several (``acks``)
                self._acks(frames)
            elif n == 7 and frames[2] == _REPLY and len(frames[6]) <= F.MAX_STATUS_LENGTH:
                self._confirmed = True
                self._keep_reply(F.Reply(frames[3], frames[4], frames[5], frames[6]))
            else:
                self._handle(frames)
            if not _zmq_poll([(sock, _POLLIN)], 0):
                return

    def _acks(self, frames: list[bytes]) -> None:
        """An ACK naming several msgids (frames 4 on): each is acknowledged."""
        acked = frames[4:]
        if not all(0 < len(m) <= _MAX_ID for m in acked):
            log.warning("dropped a malformed ACK from the broker (a msgid of 0 or 256+ bytes)")
            return
        self._confirmed = True
        if not self._coalesce and frames[3].startswith(_MARK):
            self._coalesce = True
        if len(frames[3]) == _ACK_ID_LENGTH and not frames[3].startswith(self._ack_head):
            self._ack_from(frames[3])
        self._settle()
        pending = self._pending
        for ack_msgid in acked:
            pending.pop(ack_msgid, None)
        if self._answered is not None:
            self._answered.extend(acked)

    def _packed_ack(self, packed: bytes) -> None:
        """An ACK naming several msgids in one frame, LF-separated: whole messages
        of _sent (the usual case: compared, not split) and sends of one job each,
        in the order sent; else (a message ACKed in parts) each msgid."""
        sent = self._sent
        pending = self._pending
        answered = self._answered
        at, end = 0, len(packed)
        while at < end:
            if sent:
                joined, count, _ = sent[0]
                stop = at + len(joined)
                if packed.startswith(joined, at) and (stop == end or packed[stop] == _LF):
                    sent.popleft()
                    self._sent_jobs -= count
                    if answered is not None:
                        answered.extend(joined.split(_SEP))
                    at = stop + 1
                    continue
            stop = packed.find(_SEP, at)
            if stop < 0:
                stop = end
            msgid = packed[at:stop]
            if pending.pop(msgid, None) is None and sent:
                break  # perhaps a part of a message: each msgid, below
            if answered is not None:
                answered.append(msgid)
            at = stop + 1
        else:
            return
        self._settle()
        acked = packed[at:].split(_SEP)
        for ack_msgid in acked:
            pending.pop(ack_msgid, None)
        if answered is not None:
            answered.extend(acked)

    def _keep_reply(self, reply: F.Reply) -> None:
        if self._awaiting:
            self._awaiting.pop(reply.request_msgid, None)
        replies = self._replies
        replies[reply.request_msgid] = reply
        if len(replies) > MAX_KEPT_REPLIES:
            replies.popitem(last=False)

    def _handle(self, frames: list[bytes]) -> None:
        try:
            cmd = decode(frames)
        except ProtocolError as exc:
            log.warning("dropped a malformed message from the broker: %s", exc)
            return
        self._confirmed = True
        if type(cmd) is F.Ack or type(cmd) is F.Error:
            self._settle()  # (a refusal names one job, perhaps of a REQUESTS)
        if type(cmd) is F.Ack:
            self._pending.pop(cmd.ack_msgid, None)
            if self._answered is not None:
                self._answered.append(cmd.ack_msgid)
        elif type(cmd) is F.Reply:
            self._keep_reply(cmd)
        elif type(cmd) is F.Heartbeat and cmd.msgid.startswith(F.INCARNATION):
            self._note_incarnation(cmd.msgid[len(F.INCARNATION) :])
        elif type(cmd) is F.Partial:
            self._keep_partial(cmd)
        elif type(cmd) is F.Error:
            ref = cmd.ref_msgid.decode(errors="replace")
            if cmd.code == REFUSED_LEASE_LOST and cmd.ref_msgid in self._resending:
                # a broker that lost its lease (a failover) could not save the job:
                # no refusal of the job's; it stays unacknowledged and is sent again
                # (``_wait_ack``: at once on the connection to the new active broker)
                log.info("job %s: %s; sending it again", ref, cmd.reason)
                return
            if self._pending.pop(cmd.ref_msgid, None) is None:  # answered: a resent copy's
                # refusal (the journal down after it saved the first): the first stands
                why = cmd.reason
                log.info("job %s: a copy sent again was refused (%s); its answer stands", ref, why)
                return
            self._awaiting.pop(cmd.ref_msgid, None)
            if self._answered is not None:
                self._answered.append(cmd.ref_msgid)
            self._errors[cmd.ref_msgid] = cmd
            if len(self._errors) > MAX_KEPT_REPLIES:
                self._errors.popitem(last=False)
            if cmd.ref_msgid in self._noreply:  # nobody will call its get()
                self._refused_count += 1
                if len(self._refused) < JobsRefused.MAX_NAMED:
                    self._refused.append((ref, cmd.code, cmd.reason))
            if cmd.code != DUPLICATE:  # (a unique job's existing one: not a refusal)
                log.warning("the broker refused job %s: %s", ref, cmd.reason)

    def _wait_ack(self, msgid: bytes, resend: list[bytes] | None = None) -> None:
        """Wait for ``msgid``'s ACK. With ``resend``, send the same message again
        every quarter of the timeout, and at once when the socket connects again
        (with failover: perhaps to another broker, which then has its full
        ``ack_timeout``): a broker that crashed and came back never got it, and one
        that did get it de-duplicates by msgid."""
        self._flush_buffer()
        start = time.monotonic()
        deadline = start + self.ack_timeout
        step = self.ack_timeout / 4
        next_resend = start + step
        sock = self._socket()
        connected = self._connected
        if resend is not None:
            self._resending.add(msgid)
        try:
            while msgid in self._pending:
                now = time.monotonic()
                if resend is not None and self._connected != connected:
                    connected = self._connected
                    next_resend = now
                    deadline = max(deadline, now + self.ack_timeout)
                if now >= deadline:
                    self._unavailable()
                if resend is not None and now >= next_resend:
                    self._check_handshake()
                    self._send_frames(sock, resend)
                    next_resend = now + step
                wait = min(deadline, next_resend if resend is not None else deadline) - now
                if self._poll(sock, int(wait * 1000) + 1):
                    self._drain(sock, ready=True)
        finally:
            self._resending.discard(msgid)
        if msgid in self._errors:
            if self._refused:  # raised here: not again by the next call
                ref = msgid.decode(errors="replace")
                kept = [r for r in self._refused if r[0] != ref]
                self._refused_count -= len(self._refused) - len(kept)
                self._refused = kept
            raise _refusal(self._errors.pop(msgid))

    def _wait_below(self, limit: int, timeout: float | None = None) -> None:
        self._flush_buffer()
        deadline = time.monotonic() + (self.ack_timeout if timeout is None else timeout)
        sock = self._socket()
        while self._unacked() >= limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poll(sock, int(remaining * 1000) + 1):
                if self._unacked() >= limit and not self._give_up_lost():
                    self._unavailable()
                continue
            self._drain(sock, ready=True)

    def _check_overdue(self) -> None:
        self._flush_buffer()
        oldest = self._oldest()
        if oldest is not None and time.monotonic() - oldest > self.ack_timeout:
            self._drain(self._socket())
            oldest = self._oldest()
            if oldest is not None and time.monotonic() - oldest > self.ack_timeout:
                if self._give_up_lost():
                    self._check_overdue()
                    return
                self._unavailable()
