"""The client's sending: REQUESTs pipelined within the ACK window, coalesced into
REQUESTS messages (protocol/batch.py's records) while earlier ones are
unacknowledged, or waiting for their ACK (a guaranteed job, the first message).
"""

from __future__ import annotations

import logging
import time
from operator import itemgetter
from typing import Any

import zmq

from emq_django import wire
from emq_django.client.inbox import MAX_KEPT_REPLIES, Inbox
from emq_django.client.lifetime import _Flusher
from emq_django.client.state import COALESCE_JOBS
from emq_django.exceptions import (
    JobsRefused,
)
from emq_django.ids import ID_CHARS
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.protocol.limits import check_job_id

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
# Pipelined sends read the broker's ACKs only every DRAIN_STEP sends (and when
# the window fills, or an ACK is overdue), each time all that are waiting, with
# NOBLOCK: a check per send cost more than sending (a getsockopt that makes
# libzmq process its command queue).
DRAIN_STEP = 64
# Coalescing (the REQUESTS extension, docs/eventmq-wire.md §7): a pipelined send
# made while earlier ones are unacknowledged waits in a buffer, and the buffer
# leaves as one message at COALESCE_JOBS jobs or COALESCE_BYTES of bodies, when
# anything else is sent or waited for, or COALESCE_WAIT after its first job (the
# flusher thread). A send with nothing unacknowledged goes at once, as a REQUEST.
# 256, not 128: each message costs the producer about 20 us of libzmq's wake-ups
# (its I/O thread's and the ACK's), so that bench/producer_cost.py went 2.63 ->
# 2.33 us/job (no workers) and 3.10 -> 2.93 (with workers); COALESCE_WAIT still
# bounds what a job waits here.
COALESCE_BYTES = 64 * 1024
COALESCE_WAIT = 0.002  # seconds
# Which unacknowledged sends mean "coalesce": our broker holds the ACK of a job with
# a reply for up to 1-2 ms (broker/server.py ACK_DELAY), so an ACK not yet here
# says little by itself. A send is buffered when the one before it was made under
# BURST_GAP ago (a loop of sends: what coalescing is for), or when an ACK is older
# than ACK_GRACE (the broker is behind). Else it goes at once: a job sent 0.5 ms
# after a slower one with a reply waited 2.3 ms here, against 0.3 (bench/send_gap.py).
BURST_GAP = 0.0002  # seconds
ACK_GRACE = 0.003  # seconds
EXIT_WAIT = 2.0  # seconds the interpreter's exit waits for the last ACKs, at most
_REQUESTS = B.REQUESTS
_REPLY_REQUESTED = b"reply-requested"
_MARK = B.MARK
_pack_head = B.HEAD.pack
_record_head = B.record_head  # the record layout and the message: protocol/batch.py
_requests_frames = B.requests_frames
_MAX_HEADERS = B.MAX_HEADERS_LENGTH
_SEP = B.PACK_SEPARATOR
_LF = _SEP[0]
_second = itemgetter(1)


class Sending(Inbox):
    def send(
        self,
        queue: str,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        job_id: str | None = None,
        noreply: bool = False,
    ) -> str:
        """Send a REQUEST; returns its id. Waits for the ACK when ``confirm`` (and on
        the socket's first message); raises ``BrokerUnavailable``, ``QueueFull`` or
        ``JobRefused``, and ``JobsRefused`` for earlier ``noreply`` jobs the broker
        refused (this one is then not sent). Sending again with the same ``job_id``
        never makes a second job: the broker de-duplicates by id."""
        given = check_job_id(job_id) if job_id is not None else None
        msgid = self.send_request(
            queue.encode(), headers, body, confirm=confirm, msgid=given, noreply=noreply
        )
        return job_id or msgid.decode()

    def send_request(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        msgid: bytes | None = None,
        noreply: bool = False,
    ) -> bytes:
        """``send()`` with the queue already encoded; returns the msgid (the job id
        as bytes), a new one unless ``msgid`` is given."""
        with self._lock:
            if self._refused:
                self._raise_refused(not_sent=True)
            if msgid is None:
                ready = self._ids._ready  # the generator's next id, without a call
                msgid = ready.pop() if ready else self._ids()
            flagged = self._flagged.get(headers)
            headers = flagged if flagged is not None else self._flag(headers)
            if noreply and not confirm:
                self._noreply.append(msgid)
            if self._buf and not confirm and len(headers) <= _MAX_HEADERS and 0 < len(queue) < 256:
                # the buffer's next job (its first checked what a send checks)
                head = _record_head(len(msgid), queue, headers, body)
                self._buf += (head, msgid, queue + headers + body)
                self._buffered(len(body))
                return msgid
            self._send_locked(msgid, queue, headers, body, confirm)
            return msgid

    def send_pipelined(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        head: bytes | None,
        tail: bytes | None,
        noreply: bool = False,
    ) -> bytes:
        """``send_request(queue, headers, body)`` for a job that does not wait for
        its ACK, on ``Task.delay()``'s path: the caller checked once that ``queue``
        (1 to 255 bytes) and ``headers`` (already with the ``acks`` flag, at most
        ``MAX_HEADERS_LENGTH``) may go in a REQUESTS record, and may give the
        record's parts around the msgid: ``head`` (for a msgid of ``ID_CHARS``
        bytes) and ``tail`` (``queue + headers + body``). Returns the msgid; raises
        ``JobsRefused`` (this job not sent) for earlier ``noreply`` jobs refused."""
        lock = self._lock
        lock.acquire()
        try:
            if self._refused:
                self._raise_refused(not_sent=True)
            ready = self._ids._ready  # the generator's next id, without a call
            msgid = ready.pop() if ready else self._ids()
            if noreply:
                self._noreply.append(msgid)
            if self._buf:
                if head is None or len(msgid) != ID_CHARS:
                    # (B.record_head inlined: delay()'s path with arguments)
                    head = _pack_head(len(msgid), len(queue), len(headers), len(body))
                self._buf += (head, msgid, queue + headers + body if tail is None else tail)
                # (_buffered, inline: this is every coalesced job's path)
                self._buf_bytes += len(body)
                self._buf_jobs += 1
                if self._buf_jobs >= COALESCE_JOBS or self._buf_bytes >= COALESCE_BYTES:
                    self._send_buffer(self._sock)  # type: ignore[arg-type]
                if len(self._pending) + self._sent_jobs + self._buf_jobs >= self._drain_at:
                    self._drain_window(self._sock)  # type: ignore[arg-type]
            else:
                self._send_locked(msgid, queue, headers, body, False)
        finally:
            lock.release()
        return msgid

    def _buffered(self, size: int) -> None:
        """Count the job just added to the buffer (``size``: its body's bytes): send
        the buffer when full, read the ACKs waiting every DRAIN_STEP jobs."""
        self._buf_bytes += size
        self._buf_jobs += 1
        if self._buf_jobs >= COALESCE_JOBS or self._buf_bytes >= COALESCE_BYTES:
            self._send_buffer(self._sock)  # type: ignore[arg-type]
        if self._unacked() >= self._drain_at:
            self._drain_window(self._sock)  # type: ignore[arg-type]

    def _send_locked(
        self, msgid: bytes, queue: bytes, headers: bytes, body: bytes, confirm: bool
    ) -> None:
        """A send with nothing buffered (headers flagged): it waits for its ACK, starts
        a buffer, or goes at once as a REQUEST. Called with the lock held."""
        sock = self._sock
        if confirm or sock is None or not self._confirmed:
            self._send_waiting(msgid, queue, headers, body, confirm)
            return
        pending = self._pending
        now = _monotonic()
        oldest = self._oldest()
        if oldest is not None and now - oldest > self.ack_timeout:
            self._check_overdue()
        if (
            self._coalesce
            and (pending or self._sent)
            and self._still_pending(sock)
            and (now - self._last_send < BURST_GAP or now - (self._oldest() or now) > ACK_GRACE)
        ):
            if len(headers) <= _MAX_HEADERS and 0 < len(queue) < 256:
                self._buffer(sock, msgid, queue, headers, body, now)
                return
        self._flush_buffer()
        self._last_send = now
        f = _encode_request(msgid, queue, headers, body)  # frames come from protocol/
        try:
            # NOBLOCK: a socket the broker refused may have no connection left to
            # queue on (libzmq does not connect again), and would block for ever
            _send(sock, f[0], _MORE_NOBLOCK)
        except zmq.Again:
            self._send_blocked(sock, f)
        else:  # the first frame went: the rest of the message goes with it
            _send(sock, f[1], _SNDMORE)
            _send(sock, f[2], _SNDMORE)
            _send(sock, f[3], _SNDMORE)
            _send(sock, f[4], _SNDMORE)
            _send(sock, f[5], _SNDMORE)
            _send(sock, f[6], 0)
        pending[msgid] = now
        if self._unacked() >= self._drain_at:
            self._drain_window(sock)

    def _drain_window(self, sock: zmq.Socket[Any]) -> None:
        """Read the ACKs waiting; wait for room when the window is full."""
        self._drain(sock)
        if self._unacked() >= self.window:
            self._wait_below(self.window // 2)
        self._drain_at = min(self._unacked() + DRAIN_STEP, self.window)

    # ---- coalescing (REQUESTS) ------------------------------------------------

    def _still_pending(self, sock: zmq.Socket[Any]) -> bool:
        """Whether sends are unacknowledged once the ACKs waiting are read: asked
        when the buffer is empty (once per coalesced message), so that a send after
        a pause is not held back by ACKs this client has not read yet."""
        self._drain(sock)
        return bool(self._pending or self._sent)

    def _buffer(
        self,
        sock: zmq.Socket[Any],
        msgid: bytes,
        queue: bytes,
        headers: bytes,
        body: bytes,
        now: float,
    ) -> None:
        """Start a buffer with this job (``send_request`` adds the next ones)."""
        self._buf_since = now
        flusher = self._flusher
        if flusher is None:
            flusher = self._flusher = _Flusher(self)
            flusher.start()
        if flusher.idle:  # else it is between sleeps, and looks again before waiting
            flusher.idle = False
            flusher.wake.set()
        head = _record_head(len(msgid), queue, headers, body)
        self._buf = [head, msgid, queue + headers + body]  # (records: 3 parts, _send_buffer)
        self._buf_bytes = len(body)
        self._buf_jobs = 1
        if self._unacked() >= self._drain_at:
            self._drain_window(sock)

    def _send_buffer(self, sock: zmq.Socket[Any], waiting: bool = True) -> bool:
        """Send the buffered jobs as one REQUESTS message. ``waiting``: as any send
        here (may wait for room; raises ``HandshakeRefused``/``BrokerUnavailable``);
        else (the flusher thread) never blocks nor raises: False when the socket
        took nothing, the buffer kept for the next send or wait of a caller."""
        buf = self._buf
        data = b"".join(buf)
        frames = _requests_frames(self._ids(), data)
        try:
            _send(sock, b"", _MORE_NOBLOCK)
        except zmq.Again:
            if not waiting:
                return False  # (the buffer as it was)
            self._sent_as_one(buf)
            self._send_blocked(sock, frames)
            return True
        _send(sock, _PROTOCOL, _SNDMORE)
        _send(sock, _REQUESTS, _SNDMORE)
        _send(sock, frames[3], _SNDMORE)
        _send(sock, data, 0)
        self._sent_as_one(buf)
        self._last_send = _monotonic()
        return True

    def _sent_as_one(self, buf: list[bytes]) -> None:
        """The buffer went as one message: its jobs wait for their ACK in _sent."""
        ids = buf[1::3]  # each record is (head, msgid, queue + headers + body)
        self._sent.append((_SEP.join(ids), len(ids), self._buf_since))
        self._sent_jobs += len(ids)
        self._buf = []
        self._buf_jobs = self._buf_bytes = 0

    def _flush_buffer(self) -> None:
        """Send what is buffered (before anything that must come after it)."""
        if self._buf and self._sock is not None:
            self._send_buffer(self._sock)

    def _flush_due(self, flusher: _Flusher) -> None:
        """The flusher thread: send the buffer once its first job has waited
        COALESCE_WAIT (a caller may send it sooner). Returns once no buffer is
        left, marked ``idle`` under the lock: the next buffer wakes it."""
        while True:
            # A look without the lock first: while callers send, the buffer is
            # younger than COALESCE_WAIT (they send it at COALESCE_JOBS), and taking
            # the lock to see so made a convoy with them (each of their releases a
            # wake-up of this thread). Only a buffer that may be due takes the lock.
            if self._buf:
                wait = self._buf_since + COALESCE_WAIT - _monotonic()
                if wait > 0:
                    time.sleep(wait)
                    continue
            with self._lock:
                if not self._buf or self._sock is None:
                    flusher.idle = True
                    return
                wait = self._buf_since + COALESCE_WAIT - _monotonic()
                if wait <= 0:
                    try:
                        sent = self._send_buffer(self._sock, waiting=False)
                    except Exception:  # the socket closed under us: the caller will see
                        log.debug("the flusher could not send", exc_info=True)
                        sent = False
                    if not sent:  # a caller's next send or wait sends it
                        flusher.idle = True
                        return
                    continue
            time.sleep(wait)

    def _flag(self, headers: bytes) -> bytes:
        """``headers`` with the ``acks`` flag, remembered (a task's headers repeat)."""
        flagged = F.with_acks_flag(headers)
        if len(self._flagged) >= 1024:
            self._flagged.clear()
        self._flagged[headers] = self._flagged[flagged] = flagged
        return flagged

    def _send_waiting(
        self, msgid: bytes, queue: bytes, headers: bytes, body: bytes, confirm: bool
    ) -> None:
        """The send that waits for its ACK: a guaranteed job, or the socket's first
        message (so that a missing broker is reported at once)."""
        sock = self._socket()
        self._flush_buffer()
        self._drain(sock)
        if self._pending or self._sent:
            self._check_overdue()
        frames = F.encode_request(msgid, queue, headers, body)
        self._send_frames(sock, frames)
        self._pending[msgid] = _monotonic()
        self._wait_ack(msgid, resend=frames if confirm else None)
        if confirm and _REPLY_REQUESTED in headers.split(b","):
            self._await_reply(msgid, frames)

    def _await_reply(self, msgid: bytes, frames: list[bytes]) -> None:
        """A guaranteed job with a reply, acknowledged: kept (its frames) until its
        REPLY comes, to be sent again to a broker that replaces this one
        (``_broker_replaced``)."""
        if msgid in self._replies or msgid in self._errors:
            return
        awaiting = self._awaiting
        awaiting[msgid] = frames
        if len(awaiting) > MAX_KEPT_REPLIES:
            awaiting.popitem(last=False)

    def _raise_refused(self, not_sent: bool = False) -> None:
        refused, count = self._refused, self._refused_count
        self._refused, self._refused_count = [], 0
        raise JobsRefused(refused, count, not_sent)
