"""The client: one DEALER socket per process, created lazily, safe across fork
and threads.

Every REQUEST carries a msgid and the broker ACKs it. A guaranteed job waits for
its ACK. Other jobs are pipelined: the client keeps up to ``EMQ_ACK_WINDOW``
unacknowledged messages and checks their ACKs as it goes, as publisher confirms
do, so that a burst of ``delay()`` calls does not pay a round trip each. The very
first message on a socket always waits, so a missing broker is reported at once.

A broker that refuses the socket's handshake (ZAP refusing its CURVE key, or a
CURVE/plain-text mismatch) never answers it, and libzmq never connects it again:
the socket's monitor events (``transport.HandshakeWatch``) say so, and the wait
raises ``HandshakeRefused`` with the reason at once, not ``BrokerUnavailable``
after ``ack_timeout``. No send blocks on such a socket (it may have no connection
left to queue on).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from emq_django import transport, wire
from emq_django.exceptions import (
    BatchUnacknowledged,
    BrokerUnavailable,
    HandshakeRefused,
    JobRefused,
    JobsRefused,
    ProtocolError,
    QueueFull,
)
from emq_django.ids import ID_CHARS, IdGenerator
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.protocol.frames import decode
from emq_django.protocol.limits import check_job_id
from emq_django.security.keys import FROM_SETTINGS, CurveKeys, resolve
from emq_django.transport import HandshakeWatch, SocketOptions

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
COALESCE_JOBS = 256
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
_MARK = B.MARK
_pack_head = B.HEAD.pack
_MAX_HEADERS = B.MAX_HEADERS_LENGTH
_SEP = B.PACK_SEPARATOR
_LF = _SEP[0]
_second = itemgetter(1)

MAX_KEPT_REPLIES = 100_000
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


class Client:
    # job managers may record its jobs' results in the job history (emq_django.results),
    # where ``get()`` also looks; not so for the in-memory broker's (emq_django.testing)
    records_history = True

    def __init__(
        self,
        url: str,
        *,
        ack_timeout: float = 5.0,
        window: int = 1000,
        context: zmq.Context[Any] | None = None,
        curve: CurveKeys | None | str = FROM_SETTINGS,
    ) -> None:
        self.url = url
        self.curve = curve  # CURVE keys; FROM_SETTINGS: EMQ_CURVE_* (security/keys.py)
        self.ack_timeout = ack_timeout
        self.window = window
        self._context = context
        self._sock: zmq.Socket[Any] | None = None
        # the socket's handshakes: a broker refusing this process's key (or its lack
        # of one) is reported at once, as ``HandshakeRefused``, not after ack_timeout
        self._watch: HandshakeWatch | None = None
        self._lock = threading.RLock()
        # msgid -> sent at, oldest first. A dict: an OrderedDict's insert and pop cost
        # half as much again, once each per job (its first entry is found as fast)
        self._pending: dict[bytes, float] = {}
        self._replies: OrderedDict[bytes, F.Reply] = OrderedDict()
        self._errors: OrderedDict[bytes, F.Error] = OrderedDict()
        self._partials: OrderedDict[bytes, _Partials] = OrderedDict()
        self._partials_evicted: OrderedDict[bytes, None] = OrderedDict()  # over the bounds
        self._answered: list[bytes] | None = None  # ACKed/refused msgids, while a batch waits
        self._confirmed = False
        self._ids = IdGenerator()
        self._drain_at = 0  # read the ACKs waiting once _unacked() reaches this
        # a REQUEST's headers -> the same with the ``acks`` flag: this client reads an
        # ACK naming several msgids, so our broker sends one per turn, not one per job
        self._flagged: dict[bytes, bytes] = {}
        # REQUESTS: the broker's ACKs said it reads them (``MARK``); the jobs waiting
        # to go as one (records: protocol/batch.py), how many, their bodies' bytes
        # and when the first came; the thread that sends them after COALESCE_WAIT
        self._coalesce = False
        self._buf: list[bytes] = []
        self._buf_jobs = 0
        self._buf_bytes = 0
        self._buf_since = 0.0
        self._last_send = 0.0  # when a send last went at once, or a buffer left
        # REQUESTS sent and not yet acknowledged, oldest first: (their msgids joined
        # by LF, how many, when the first was buffered), and how many jobs in all.
        # Not one _pending entry per job: our broker ACKs a turn's jobs in one frame,
        # the same bytes as the messages' msgids joined, so that a whole message is
        # acknowledged by comparing bytes. Any other ACK (a part of a message, one
        # frame each, a refusal) first moves them into _pending (_settle).
        self._sent: deque[tuple[bytes, int, float]] = deque()
        self._sent_jobs = 0
        self._flusher: _Flusher | None = None
        # the last jobs sent without reply and without waiting for their ACK: a
        # refused job is always among the last ``window`` sent (a refusal is looked
        # up here, which costs a scan of it: refusals are rare; the send costs an
        # append); their refusals, raised by the next call (JobsRefused)
        self._noreply: deque[bytes] = deque(maxlen=2 * window + COALESCE_JOBS)
        self._refused: list[tuple[str, str, str]] = []
        self._refused_count = 0
        # the broker's incarnation (a fresh one each time it starts), asked on each new
        # connection; ``broker_changes`` counts the times it changed: a plain job sent
        # before a change, and acknowledged by then, is lost (JobLost)
        self.broker_changes = 0
        self._incarnation = b""
        # how its ACKs' msgids start: MARK and the incarnation (none known yet: no match)
        self._ack_head = _MARK + b"?"
        self._handshakes = 0
        self._unacked_at_change: frozenset[bytes] = frozenset()
        _clients.add(self)

    # ---- sending ------------------------------------------------------------

    def new_id(self) -> str:
        with self._lock:
            return self._ids.text()

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
                head = _pack_head(len(msgid), len(queue), len(headers), len(body))
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
        head = _pack_head(len(msgid), len(queue), len(headers), len(body))
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
        frames = [b"", _PROTOCOL, _REQUESTS, self._ids(), data]
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

    def send_many(
        self, queue: str, headers: bytes, bodies: list[bytes], *, confirm: bool = False
    ) -> list[str]:
        """``send_batch`` under new ids; returns them."""
        ids = [self.new_id() for _ in bodies]
        self.send_batch(queue, headers, bodies, ids, confirm=confirm)
        return ids

    def send_batch(
        self,
        queue: str,
        headers: bytes,
        bodies: Sequence[bytes],
        job_ids: Sequence[str],
        *,
        confirm: bool = False,
        results: Sequence[Any] = (),
        noreply: bool = False,
    ) -> None:
        """Send one REQUEST per body, pipelined, under ``job_ids`` (one each, chosen
        before sending). With ``confirm``, return once the broker has ACKed them
        all (it journals them in a few transactions, not one each).

        When ACKs stop coming (the broker crashed and restarts), the jobs not yet
        acknowledged are sent again under the same ids every quarter of
        ``ack_timeout``: the broker drops those it already has. After
        ``ack_timeout`` without a single ACK it raises ``BatchUnacknowledged``,
        whose ``job_ids`` are exactly the jobs that may not have arrived and whose
        ``resend()`` sends them again under the same ids. Raises ``JobRefused`` /
        ``QueueFull`` for a job the broker refused (with ``confirm``)."""
        if len(job_ids) != len(bodies):
            raise ValueError("one job id per body")
        batch = _Batch(queue.encode(), F.with_acks_flag(headers), bodies, job_ids)
        with self._lock:
            if self._refused:
                self._raise_refused(not_sent=True)
            if noreply and not confirm:
                self._noreply.extend(batch.msgids)
            try:
                self._send_batch(batch, confirm)
            except BrokerUnavailable as exc:
                # a refused handshake stays the cause: its reason is in the message too
                cause = exc if isinstance(exc, HandshakeRefused) else None
                raise self._batch_failed(batch, exc, queue, confirm, results) from cause
            finally:
                self._answered = None
            if confirm:
                refused = [m for m in batch.msgids if m in self._errors]
                if refused:
                    raise _refusal(self._errors.pop(refused[0]))

    def _send_batch(self, batch: _Batch, confirm: bool) -> None:
        sock = self._socket()
        self._flush_buffer()
        self._drain(sock)
        if self._pending or self._sent:
            self._check_overdue()
        if not self._confirmed and batch.msgids:
            # the socket's first message waits: a missing broker is reported at once
            self.send(batch.queue.decode(), batch.headers, batch.bodies[0], confirm=confirm,
                      job_id=batch.msgids[0].decode())  # fmt: skip
            batch.sent = 1
        self._answered = []
        for k in range(batch.sent, len(batch.msgids)):
            self._send_frames(sock, batch.frames(k))
            self._pending[batch.msgids[k]] = time.monotonic()
            batch.unanswered.add(batch.msgids[k])
            batch.sent = k + 1
            if self._unacked() >= self.window:
                self._wait_batch(batch, lambda: self._unacked() < self.window // 2)
        if confirm:
            self._wait_batch(batch, lambda: not batch.unanswered)

    def _wait_batch(self, batch: _Batch, done: Callable[[], bool]) -> None:
        """Wait until ``done()``; resend the batch's unanswered jobs while no ACK
        comes, and raise ``BrokerUnavailable`` after ``ack_timeout`` without one."""
        sock = self._socket()
        step = self.ack_timeout / 4
        last_progress = time.monotonic()
        next_resend = last_progress + step
        while True:
            self._note_answers(batch)
            if done():
                return
            now = time.monotonic()
            if now - last_progress >= self.ack_timeout:
                raise BrokerUnavailable(
                    f"the broker at {self.url} acknowledged nothing for {self.ack_timeout:g} s"
                )
            if now >= next_resend:
                self._check_handshake()
                for msgid in list(batch.unanswered):
                    self._send_frames(sock, batch.frames(batch.index[msgid]))
                next_resend = now + step
            wait = min(next_resend, last_progress + self.ack_timeout) - now
            if self._poll(sock, int(wait * 1000) + 1):
                self._drain(sock, ready=True)
                if self._answered:
                    last_progress = time.monotonic()
                    next_resend = last_progress + step

    def _note_answers(self, batch: _Batch) -> None:
        if self._answered:
            for msgid in self._answered:
                batch.unanswered.discard(msgid)
            self._answered.clear()

    def _batch_failed(
        self,
        batch: _Batch,
        exc: BrokerUnavailable,
        queue: str,
        confirm: bool,
        results: Sequence[Any],
    ) -> BatchUnacknowledged:
        if self._answered is not None:
            self._note_answers(batch)
        if batch.sent <= 1 and not batch.unanswered:
            # it failed before or on the first message: none of them is acknowledged
            missing = list(range(len(batch.msgids)))
        else:
            missing = [k for k, m in enumerate(batch.msgids) if m in batch.unanswered]
            missing += range(batch.sent, len(batch.msgids))
        if self._sock is not None:
            self._reset()
        ids = [batch.msgids[k].decode() for k in missing]
        bodies = [batch.bodies[k] for k in missing]

        def resend() -> Sequence[Any]:
            self.send_batch(queue, batch.headers, bodies, ids, confirm=confirm, results=results)
            return results

        return BatchUnacknowledged(
            f"{exc}; {len(ids)} of {len(batch.msgids)} jobs may not have arrived: "
            "BatchUnacknowledged.resend() sends them again under the same ids",
            ids,
            results,
            resend,
        )

    def send_frames(self, frames: list[bytes], msgid: bytes, *, confirm: bool = True) -> None:
        """Send any client command (SCHEDULE, PUBLISH, ...) that carries ``msgid``."""
        with self._lock:
            sock = self._socket()
            self._flush_buffer()
            self._drain(sock)
            self._send_frames(sock, frames)
            self._pending[msgid] = time.monotonic()
            if confirm or not self._confirmed:
                self._wait_ack(msgid)

    def cancel(self, job_id: str) -> bool:
        """Cancel a job; True if it was cancelled or is being stopped. A job that
        has not started is removed; a running one has its worker process killed (its
        ``get()`` raises ``Cancelled``). Only a job running on an EventMQ job manager
        cannot be stopped (False; it will not be retried). Asks the broker's monitor
        channel (``EMQ_MONITOR_URL``); raises ``BrokerUnavailable``."""
        import json

        from emq_django.conf import cached_settings
        from emq_django.monitor_client import query

        if not job_id or not job_id.isprintable() or " " in job_id:
            raise ValueError(f"not a job id: {job_id!r}")
        self._sent_before(job_id.encode())
        settings = cached_settings()
        answer = query(settings.MONITOR_URL, b"CANCEL " + job_id.encode(), settings.MONITOR_TIMEOUT)
        if answer.startswith(b"ERROR"):
            raise JobRefused(answer.decode(errors="replace"))
        states = json.loads(answer)
        return job_id in states["cancelled"] or job_id in states.get("stopping", ())

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the broker has answered everything sent so far; raises
        ``BrokerUnavailable``, and ``JobsRefused`` for ``noreply`` jobs it refused."""
        with self._lock:
            if self._sock is not None:
                self._wait_below(1, timeout)
            if self._refused:
                self._raise_refused()

    def _raise_refused(self, not_sent: bool = False) -> None:
        refused, count = self._refused, self._refused_count
        self._refused, self._refused_count = [], 0
        raise JobsRefused(refused, count, not_sent)

    def _sent_before(self, msgid: bytes) -> None:
        """Make sure the broker has job ``msgid`` if this client sent it (a cancel
        goes by the monitor channel, another connection, and must not overtake
        it): send the buffer, then wait for the job's ACK if it has none yet."""
        with self._lock:
            if self._sock is not None:
                self._flush_buffer()
                self._settle()
                if msgid in self._pending:
                    self._wait_ack(msgid)

    # ---- replies ------------------------------------------------------------

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
                if sent_at_change is not None and self.broker_changes > sent_at_change:
                    self._check_lost(msgid)
                remaining = None if deadline is None else deadline - _monotonic()
                if remaining is not None and remaining <= 0:
                    raise ResultTimeout(f"no result for job {msgid.decode()} within {timeout} s")
                # other threads may need the socket: wait in short slices
                slice_ms = 20 if threading.active_count() > 1 + _Flusher.alive else 1000
                wait = slice_ms if remaining is None else min(slice_ms, remaining * 1000)
                sock = self._socket()
                if _zmq_poll([(sock, _POLLIN)], max(int(wait), 1)):
                    self._drain(sock, ready=True)
                else:  # a quiet slice: was the broker refusing us, or is it gone?
                    if self._watch is not None:
                        self._check_handshake()
                    if self._pending or self._sent:
                        self._check_overdue()

    def _check_lost(self, msgid: bytes) -> None:
        """Raise ``JobLost`` if the plain job ``msgid``, sent before the broker's
        incarnation changed, had been acknowledged by then: the broker that took it
        is gone, and its successor never had it (one not acknowledged then may have
        reached the new one, or ``ack_timeout`` says it did not)."""
        from emq_django.exceptions import JobLost

        if msgid in self._unacked_at_change or msgid in self._pending:
            return
        raise JobLost(
            JobLost.TYPE,
            f"job {msgid.decode(errors='replace')} was a plain job (not guaranteed) that "
            f"the broker at {self.url} had accepted, and that broker has restarted since "
            "(a new incarnation): it kept the job in memory only, so the job is lost and "
            "may or may not have run. Send it again if it must run; jobs that must "
            "survive a broker restart are sent with guarantee=True",
        )

    def _ask_incarnation(self, sock: zmq.Socket[Any]) -> None:
        """Ask the broker for its incarnation (a HEARTBEAT, which it answers with one
        naming it): on each new connection."""
        try:
            wire.send(sock, F.encode_heartbeat(self._ids(), time.time()))
        except zmq.Again:
            pass  # full: the next connection asks again, or ACK timeouts say more

    def _ack_from(self, ack_id: bytes) -> None:
        """Our broker's ACK names its incarnation (``B.ack_id``): note a change."""
        incarnation = B.ack_incarnation(ack_id)
        if incarnation is not None and incarnation != self._incarnation:
            self._note_incarnation(incarnation)

    def _note_incarnation(self, incarnation: bytes) -> None:
        """The broker said which incarnation it is. Another than before: the plain
        jobs acknowledged until now are lost (``_check_lost``)."""
        if self._incarnation and incarnation != self._incarnation:
            self._settle()
            self._unacked_at_change = frozenset(self._pending)
            self.broker_changes += 1
            log.warning(
                "the broker at %s restarted (a new incarnation): the plain jobs it had "
                "accepted are lost, and their get() raises JobLost",
                self.url,
            )
        self._incarnation = incarnation
        self._ack_head = _MARK + incarnation

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
        from emq_django.exceptions import ResultTimeout

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flush_buffer()
        while True:
            with self._lock:
                item = self._take_streamed(msgid)
                if item is not None:
                    return item
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ResultTimeout(f"nothing from job {msgid.decode()} within {timeout} s")
                slice_ms = 20 if threading.active_count() > 1 + _Flusher.alive else 1000
                wait = slice_ms if remaining is None else min(slice_ms, remaining * 1000)
                sock = self._socket()
                if _zmq_poll([(sock, _POLLIN)], max(int(wait), 1)):
                    self._drain(sock, ready=True)
                elif self._watch is not None:
                    self._check_handshake()  # a quiet slice: was the broker refusing us?

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

    # ---- socket -------------------------------------------------------------

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            context = self._context or zmq.Context.instance()
            # no high-water marks: the ACK window bounds what is queued
            curve = resolve(self.curve)
            options = SocketOptions(linger=1000, sndhwm=0, rcvhwm=0, curve=curve)
            self._sock, self._watch = transport.connect_watched(
                context, zmq.DEALER, self.url, options, role="client"
            )
            self._handshakes = 0
        return self._sock

    def _reset(self) -> None:
        self._close_watch()  # (first: HandshakeWatch.close)
        if self._sock is not None:
            self._sock.close(linger=0)  # drop what was queued: the caller was told it failed
        self._sock = None
        self._pending.clear()
        self._sent.clear()
        self._sent_jobs = 0
        self._confirmed = False
        self._drain_at = 0
        self._buf = []  # never sent: the caller is told the broker is unavailable
        self._buf_jobs = self._buf_bytes = 0

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._flush_buffer()
                except BrokerUnavailable:
                    log.warning("closed with jobs unsent: the broker took nothing")
                self._close_watch()  # (first: HandshakeWatch.close)
                self._sock.close()
            self._sock = None
            flusher, self._flusher = self._flusher, None
            if flusher is not None:
                flusher.wake.set()  # it sees it is no longer this client's, and ends

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._watch = None

    # ---- handshakes ---------------------------------------------------------

    def _check_handshake(self) -> None:
        """Raise ``HandshakeRefused`` (the socket reset: the next call makes a fresh
        one) when the watch says the broker refused this socket's handshake."""
        watch = self._watch
        if watch is None:
            return
        try:
            watch.check()
        except HandshakeRefused:
            self._reset()
            raise
        if watch.handshakes > max(self._handshakes, 1) and self._sock is not None:
            # connected again: the same broker? (the first connection's says so in
            # its ACKs; a client waiting for a result sends nothing to be ACKed)
            self._ask_incarnation(self._sock)
        self._handshakes = watch.handshakes

    def _poll(self, sock: zmq.Socket[Any], timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a message on ``sock``; True when one waits.
        Until the broker has answered once, the handshake watch is polled too: a
        refused handshake raises ``HandshakeRefused`` as soon as libzmq reports it."""
        watch = self._watch
        if watch is None or self._confirmed:
            return bool(_zmq_poll([(sock, _POLLIN)], timeout_ms))
        ready = _zmq_poll([(sock, _POLLIN), (watch.pair, _POLLIN)], timeout_ms)
        if ready and ready[-1][0] is watch.pair:
            self._check_handshake()
        return bool(ready) and ready[0][0] is sock

    def _send_frames(self, sock: zmq.Socket[Any], frames: list[bytes]) -> None:
        """Send one message, never blocking for ever on a socket the broker refused:
        raises ``HandshakeRefused`` then, and ``BrokerUnavailable`` when the socket
        takes nothing for ``ack_timeout``."""
        try:
            wire.send(sock, frames)
        except zmq.Again:
            self._send_blocked(sock, frames)

    def _send_blocked(self, sock: zmq.Socket[Any], frames: list[bytes]) -> None:
        """The socket took nothing now: wait for room, or for the watch to say why."""
        watch = self._watch
        assert watch is not None  # made with the socket
        try:
            sent = watch.send(sock, frames, int(self.ack_timeout * 1000))
        except HandshakeRefused:
            self._reset()
            raise
        if not sent:
            self._unavailable()

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
            self._pending.pop(cmd.ref_msgid, None)
            if self._answered is not None:
                self._answered.append(cmd.ref_msgid)
            self._errors[cmd.ref_msgid] = cmd
            if len(self._errors) > MAX_KEPT_REPLIES:
                self._errors.popitem(last=False)
            if cmd.ref_msgid in self._noreply:  # nobody will call its get()
                self._refused_count += 1
                if len(self._refused) < JobsRefused.MAX_NAMED:
                    ref = cmd.ref_msgid.decode(errors="replace")
                    self._refused.append((ref, cmd.code, cmd.reason))
            log.warning(
                "the broker refused job %s: %s", cmd.ref_msgid.decode(errors="replace"), cmd.reason
            )

    def _wait_ack(self, msgid: bytes, resend: list[bytes] | None = None) -> None:
        """Wait for ``msgid``'s ACK. With ``resend``, send the same message again
        every quarter of the timeout: a broker that crashed and came back never got
        it, and one that did get it de-duplicates by msgid."""
        self._flush_buffer()
        start = time.monotonic()
        deadline = start + self.ack_timeout
        step = self.ack_timeout / 4
        next_resend = start + step
        sock = self._socket()
        while msgid in self._pending:
            now = time.monotonic()
            if now >= deadline:
                self._unavailable()
            if resend is not None and now >= next_resend:
                self._check_handshake()
                self._send_frames(sock, resend)
                next_resend = now + step
            wait = min(deadline, next_resend if resend is not None else deadline) - now
            if self._poll(sock, int(wait * 1000) + 1):
                self._drain(sock, ready=True)
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
                if self._unacked() >= limit:
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
                self._unavailable()

    def _unavailable(self) -> None:
        self._check_handshake()  # a refusal says why better than the time-out
        count = self._unacked()
        self._reset()
        raise BrokerUnavailable(
            f"the broker at {self.url} did not acknowledge within {self.ack_timeout:g} s "
            f"({count} message(s) unacknowledged); is `manage.py emq_broker` running there?"
        )


class _Batch:
    """The jobs of one ``send_batch``: their frames, and which are unanswered."""

    def __init__(
        self, queue: bytes, headers: bytes, bodies: Sequence[bytes], job_ids: Sequence[str]
    ) -> None:
        self.queue = queue
        self.headers = headers
        self.bodies = bodies
        self.msgids = [i.encode() for i in job_ids]
        self.index = {m: k for k, m in enumerate(self.msgids)}
        self.unanswered: set[bytes] = set()  # sent, neither ACKed nor refused yet
        self.sent = 0  # bodies[:sent] went out at least once

    def frames(self, k: int) -> list[bytes]:
        return F.encode_request(self.msgids[k], self.queue, self.headers, self.bodies[k])


class _Flusher(threading.Thread):
    """Sends a client's buffered jobs COALESCE_WAIT after the first (one daemon
    thread per client that coalesces; it sleeps on ``wake`` while nothing waits)."""

    alive = 0  # such threads in this process (not "other threads" for the waits)

    def __init__(self, client: Client) -> None:
        super().__init__(name="emq-client-flusher", daemon=True)
        self.wake = threading.Event()
        self.idle = True  # waits on ``wake`` (set and read under the client's lock)
        self._client = weakref.ref(client)
        self._pid = os.getpid()

    def run(self) -> None:
        _Flusher.alive += 1
        try:
            while True:
                self.wake.wait()
                self.wake.clear()  # before looking: a job buffered later sets it again
                client = self._client()
                if client is None or client._flusher is not self or _pid != self._pid:
                    return
                client._flush_due(self)
                del client
        finally:
            _Flusher.alive -= 1


def _refusal(error: F.Error) -> JobRefused | QueueFull:
    cls: type[JobRefused | QueueFull] = QueueFull if error.code == "queue-full" else JobRefused
    return cls(error.reason)


_client: Client | None = None
_client_pid = 0
_client_lock = threading.Lock()
_orphans: list[Client] = []  # a parent's clients, never touched in a forked child
_pid = os.getpid()  # this process's, kept by the fork hook: no system call per job


_clients: weakref.WeakSet[Client] = weakref.WeakSet()  # every client: fork and exit


def _after_fork_in_child() -> None:
    """A child never sends its parent's buffered jobs (the parent does), and has
    none of its threads: each client forgets its buffer, flusher and lock."""
    global _pid
    _pid = os.getpid()
    _Flusher.alive = 0
    for client in list(_clients):
        client._buf = []
        client._buf_jobs = client._buf_bytes = 0
        client._flusher = None
        client._lock = threading.RLock()  # a parent's thread may have held it


def _send_at_exit() -> None:
    """The interpreter is ending: send what is buffered, and wait (EXIT_WAIT at
    most) for the broker's ACK of every pipelined send, so that no job sent by
    ``delay()`` just before the end is lost with the process's queues."""
    for client in list(_clients):
        if not client._lock.acquire(timeout=EXIT_WAIT):
            continue
        try:
            if client._sock is not None and client._unacked():
                client._wait_below(1, EXIT_WAIT)
            if client._refused:
                client._raise_refused()
        except JobsRefused as exc:  # the end of the process: say so, do not raise
            log.error("at exit: %s", exc)
        except Exception as exc:  # the end of the process: say so, do not raise
            log.warning("at exit, jobs may not have reached the broker: %s", exc)
        finally:
            client._lock.release()


atexit.register(_send_at_exit)


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_client() -> Client:
    """This process's client, created on first use (again after a fork)."""
    global _client, _client_pid
    client = _client
    if client is not None and _client_pid == _pid:
        return client
    with _client_lock:
        if _client is None or _client_pid != os.getpid():
            from emq_django.conf import cached_settings

            s = cached_settings()
            if _client is not None:
                _orphans.append(_client)
            _client = Client(s.BROKER_URL, ack_timeout=s.ACK_TIMEOUT, window=s.ACK_WINDOW)
            _client_pid = os.getpid()
        return _client


def reset_client(**kwargs: Any) -> None:
    """Forget this process's client (after settings change, in tests)."""
    global _client
    with _client_lock:
        if _client is not None and _client_pid == os.getpid():
            _client.close()
        _client = None


def current_client() -> Client | None:
    """This process's client if one was made (or installed), without making one."""
    return _client if _client_pid == _pid else None


def install_client(client: Any) -> Callable[[], None]:
    """Make ``client`` this process's client until the returned function is called:
    ``get_client()`` returns it, so ``delay()``, ``apply_async()``, ``map()`` and the
    result handles go through it. The seam ``emq_django.testing`` puts its in-memory
    broker's client in; ``client`` has ``Client``'s sending and reply methods."""
    global _client, _client_pid
    with _client_lock:
        saved = (_client, _client_pid)
        _client, _client_pid = client, _pid

    def restore() -> None:
        global _client, _client_pid
        with _client_lock:
            if _client is client:
                _client, _client_pid = saved

    return restore
