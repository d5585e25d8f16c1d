"""Batches: many REQUESTs sent at once under ids chosen first (``Task.map()``,
the scheduler), resent while the broker does not answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from emq_django.client.inbox import _refusal
from emq_django.client.sending import COALESCE_BYTES, Sending
from emq_django.client.state import COALESCE_JOBS
from emq_django.exceptions import (
    BatchUnacknowledged,
    BrokerUnavailable,
    HandshakeRefused,
)
from emq_django.protocol import frames as F
from emq_django.protocol.batch import MAX_HEADERS_LENGTH, record_head, requests_frames

log = logging.getLogger(__name__)


class Batches(Sending):
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
        ``ack_timeout``, and at once when the socket connects again (failover: a
        standby took over): the broker drops those it already has. After
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
            self._resending.update(batch.msgids)
            # with a reply: each job is awaited from its ACK on, not from the end of
            # the batch, so that a broker replaced meanwhile has the ones it had
            # acknowledged claimed from its successor (``_broker_replaced``)
            batch.replies = confirm and b"reply-requested" in batch.headers.split(b",")
            self._batch = batch
            try:
                self._send_batch(batch, confirm)
            except BrokerUnavailable as exc:
                # a refused handshake stays the cause: its reason is in the message too
                cause = exc if isinstance(exc, HandshakeRefused) else None
                raise self._batch_failed(batch, exc, queue, confirm, results) from cause
            finally:
                self._batch = None
                self._answered = None
                self._resending.difference_update(batch.msgids)
            if confirm:
                refused = [m for m in batch.msgids if m in self._errors]
                if refused:
                    raise _refusal(self._errors.pop(refused[0]))
                if batch.replies:
                    awaiting = self._awaiting
                    for k, msgid in enumerate(batch.msgids):
                        if msgid not in awaiting:  # (the first job: its own send's)
                            self._await_reply(msgid, batch.frames(k))

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
        # guaranteed jobs: a sliding window, every ACK makes room for one more at
        # once (as publisher confirms; the ACKs of one journal commit come together,
        # so this is a wait per commit). Plain jobs, ACKed as they come, refill at
        # half the window: a wait per few ACKs cost them ~20% more CPU per job.
        low = self.window if confirm else self.window // 2
        msgids, n = batch.msgids, len(batch.msgids)
        # once the broker's ACKs said it reads REQUESTS, what fits in the window goes
        # as one (up to COALESCE_JOBS jobs or COALESCE_BYTES of bodies): per job, 7
        # frames sent here and read by the broker cost about as much as the rest of
        # the producer's work for a guaranteed job (bench/README.md, Guaranteed jobs)
        records = batch.records_fit()
        k = batch.sent
        while k < n:
            room = self.window - self._unacked()
            if records and self._coalesce and room > 1 and k + 1 < n:
                end = self._send_records(sock, batch, k, min(n, k + room, k + COALESCE_JOBS))
            else:
                self._send_frames(sock, batch.frames(k))
                end = k + 1
            now = time.monotonic()
            for msgid in msgids[k:end]:
                self._pending[msgid] = now
            batch.unanswered.update(msgids[k:end])
            batch.sent = k = end
            if self._unacked() >= self.window:
                self._wait_batch(batch, lambda: self._unacked() < low)
        if confirm:
            self._wait_batch(batch, lambda: not batch.unanswered)

    def _send_records(self, sock: Any, batch: _Batch, k: int, end: int) -> int:
        """Jobs ``k`` to ``end`` (fewer once their bodies reach COALESCE_BYTES) as one
        REQUESTS message; returns the index after the last one sent."""
        parts: list[bytes] = []
        tail, size = batch.queue + batch.headers, 0
        for j in range(k, end):
            msgid, body = batch.msgids[j], batch.bodies[j]
            parts += (record_head(len(msgid), batch.queue, batch.headers, body), msgid, tail, body)
            size += len(body)
            if size >= COALESCE_BYTES:
                end = j + 1
                break
        self._send_frames(sock, requests_frames(self._ids(), b"".join(parts)))
        self._last_send = time.monotonic()
        return end

    def _wait_batch(self, batch: _Batch, done: Callable[[], bool]) -> None:
        """Wait until ``done()``; resend the batch's unanswered jobs while no ACK
        comes, and raise ``BrokerUnavailable`` after ``ack_timeout`` without one."""
        sock = self._socket()
        step = self.ack_timeout / 4
        last_progress = time.monotonic()
        next_resend = last_progress + step
        connected = self._connected
        while True:
            self._note_answers(batch)
            if done():
                return
            now = time.monotonic()
            if self._connected != connected:  # another broker, perhaps: at once
                connected = self._connected
                next_resend = last_progress = now
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
        """The batch's jobs ACKed or refused since last asked; those ACKed whose
        reply the caller waits for are awaited at once (``_await_reply``)."""
        answered = self._answered
        if answered:
            for msgid in answered:
                batch.unanswered.discard(msgid)
                if batch.replies and msgid in batch.index:
                    self._await_reply(msgid, batch.frames(batch.index[msgid]))
            answered.clear()

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
        self.replies = False  # guaranteed (confirmed) jobs whose replies are awaited

    def frames(self, k: int) -> list[bytes]:
        return F.encode_request(self.msgids[k], self.queue, self.headers, self.bodies[k])

    def records_fit(self) -> bool:
        """The jobs may go as REQUESTS records (protocol/batch.py: lengths of one
        byte for the msgid and the queue, two for the headers, four for a body)."""
        return (
            0 < len(self.queue) < 256
            and len(self.headers) <= MAX_HEADERS_LENGTH
            and all(len(m) < 256 for m in self.msgids)
            and all(len(b) < 1 << 32 for b in self.bodies)
        )
