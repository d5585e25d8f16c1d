"""A table in shared memory where each worker process says what it is running.

The job manager reads it to enforce time limits and to answer for a worker
process that died mid-job (with the job's task and queue, for the history),
without a message per job between the processes. It also marks a job cancelled
there, so that a worker process whose job returns during the kill grace reports
it cancelled, not succeeded. And a process that holds the REPLYs of finished jobs
back to send several in one message (eMQP's "batch" extension) keeps them here
until they leave, and every process keeps here the answers it sent last: a
message still in its socket's queue (or its kernel's) dies with the process. Its
job manager sends both again after its death, so a job that ran is never run
again for want of its answer (the broker drops an answer it already has).
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_failure

# started (monotonic), timeout, retries, lengths of attempt id, queue, task, body, flags
_HEADER = struct.Struct("=ddiHHHHB")
SLOT_SIZE = 8192
MAX_ATTEMPT_ID = 255
MAX_QUEUE = 255
MAX_TASK = 480
# the job's body, when it fits, so that the history row of a job whose process died
# has its arguments (and the admin's Retry sends them); a larger one is left out
MAX_BODY = SLOT_SIZE - _HEADER.size - MAX_ATTEMPT_ID - MAX_QUEUE - MAX_TASK
_FLAGS = _HEADER.size - 1  # offset of the flags byte
GUARANTEED = 1
_IDLE = _HEADER.pack(0.0, 0.0, 0, 0, 0, 0, 0, 0)  # a cleared slot's header
CANCELLED = 2
# answers held back per slot: (used bytes) then (ref, status, body lengths, the three)
HELD_SIZE = 16384
_USED = struct.Struct("=I")
_ANSWER = struct.Struct("=HHI")
# answers sent last, per slot: (answers recorded so far) then a ring of records of
# (monotonic time sent, lengths of ref, status and body, the three); a body too large
# for its record is not kept (NOT_KEPT), its job's id and status are
RECENT = 200  # records per slot by default: more than a process can have in flight
RECENT_RECORD = 1024
_COUNT = struct.Struct("=Q")
_RECENT = struct.Struct("=dBBH")
NOT_KEPT = 0xFFFF
# attempts cancelled that no process was running (jobs sent ahead to a busy
# process): (entries written so far) then a ring of (length, attempt id) records,
# written by the job manager, read by every process before it starts a job
CANCELS = 64
_CANCEL_RECORD = 1 + MAX_ATTEMPT_ID
# a process's answers sent this long ago or less are sent again when it may have lost
# them (it died, or connected again): older ones reached the broker, unless it read
# nothing from that process for this long (the broker drops those it has)
RESEND_WINDOW = 60.0
WORKER_LOST = "emq_django.exceptions.WorkerLost"


class Running(NamedTuple):
    attempt_id: bytes
    started: float
    timeout: float
    queue: str = ""
    task: str = ""
    retries: int = 0
    guaranteed: bool = False
    cancelled: bool = False
    body: bytes = b""  # b"" when it did not fit


class SlotTable:
    def __init__(self, count: int, recent: int = RECENT) -> None:
        """``recent``: how many answers each slot's process keeps after sending them;
        its job manager sends them again if it dies (the last ``recent - 1``)."""
        self.count = count
        self._mem = mmap.mmap(-1, SLOT_SIZE * max(count, 1))  # shared with forked children
        self._held = mmap.mmap(-1, HELD_SIZE * max(count, 1))
        self.recent_count = max(recent, 2)
        self._recent_stride = _COUNT.size + self.recent_count * RECENT_RECORD
        self._recent = mmap.mmap(-1, self._recent_stride * max(count, 1))
        self._cancels = mmap.mmap(-1, _COUNT.size + CANCELS * _CANCEL_RECORD)
        self._names: dict[tuple[str, str], tuple[bytes, int, int]] = {}

    def start(
        self,
        slot: int,
        attempt_id: bytes,
        started: float,
        timeout: float,
        queue: str = "",
        task: str = "",
        retries: int = 0,
        guaranteed: bool = False,
        body: bytes = b"",
    ) -> None:
        aid = attempt_id[:MAX_ATTEMPT_ID]
        names = self._names.get((queue, task))
        if names is None:
            names = self._encode_names(queue, task)
        qt, n_queue, n_task = names
        b = body if len(body) <= MAX_BODY else b""
        base = slot * SLOT_SIZE
        data = base + _HEADER.size
        self._mem[data : data + len(aid) + len(qt) + len(b)] = aid + qt + b
        _HEADER.pack_into(
            self._mem,
            base,
            started,
            timeout,
            retries,
            len(aid),
            n_queue,
            n_task,
            len(b),
            GUARANTEED if guaranteed else 0,
        )

    def _encode_names(self, queue: str, task: str) -> tuple[bytes, int, int]:
        """Queue and task as the slot stores them, encoded once per pair: the same
        few repeat on every job."""
        q = queue.encode()[:MAX_QUEUE]
        t = task.encode()[:MAX_TASK]
        if len(self._names) >= 1024:
            self._names.clear()
        names = self._names[(queue, task)] = (q + t, len(q), len(t))
        return names

    def clear(self, slot: int) -> None:
        base = slot * SLOT_SIZE
        self._mem[base : base + _HEADER.size] = _IDLE

    def hold(self, slot: int, ref: bytes, status: bytes, body: bytes) -> bool:
        """Keep an answer the slot's process has not sent yet; False (nothing kept)
        when it does not fit: the process sends it, and what it holds, now."""
        base = slot * HELD_SIZE
        mem = self._held
        (used,) = _USED.unpack_from(mem, base)
        start = base + _USED.size + used
        size = _ANSWER.size + len(ref) + len(status) + len(body)
        if _USED.size + used + size > HELD_SIZE:
            return False
        _ANSWER.pack_into(mem, start, len(ref), len(status), len(body))
        data = start + _ANSWER.size
        mem[data : data + size - _ANSWER.size] = ref + status + body
        _USED.pack_into(mem, base, used + size)  # last: a half-written one is not there
        return True

    def release(self, slot: int) -> None:
        """The held answers left (or were given up)."""
        _USED.pack_into(self._held, slot * HELD_SIZE, 0)

    def held(self, slot: int) -> list[tuple[bytes, bytes, bytes]]:
        """The answers the slot's process holds, (ref, status, body), oldest first."""
        base = slot * HELD_SIZE
        mem = self._held
        (used,) = _USED.unpack_from(mem, base)
        out = []
        at = base + _USED.size
        end = at + min(used, HELD_SIZE - _USED.size)
        while at + _ANSWER.size <= end:
            n_ref, n_status, n_body = _ANSWER.unpack_from(mem, at)
            at += _ANSWER.size
            raw = bytes(mem[at : at + n_ref + n_status + n_body])
            at += n_ref + n_status + n_body
            out.append((raw[:n_ref], raw[n_ref : n_ref + n_status], raw[n_ref + n_status :]))
        return out

    def sent(self, slot: int, ref: bytes, status: bytes, body: bytes, at: float) -> None:
        """Keep an answer the slot's process sends now (``at``: monotonic), over the
        oldest one kept. Written before the send: killed in between, the process's
        answer still reaches the broker, through its job manager."""
        if len(ref) > 255 or len(status) > 255:  # (longer ones the broker refuses)
            ref, status = ref[:255], status[:255]
        base = slot * self._recent_stride
        mem = self._recent
        (n,) = _COUNT.unpack_from(mem, base)
        start = base + _COUNT.size + (n % self.recent_count) * RECENT_RECORD
        if len(body) > RECENT_RECORD - _RECENT.size - len(ref) - len(status):
            record = _RECENT.pack(at, len(ref), len(status), NOT_KEPT) + ref + status
        else:
            record = _RECENT.pack(at, len(ref), len(status), len(body)) + ref + status + body
        mem[start : start + len(record)] = record
        _COUNT.pack_into(mem, base, n + 1)  # last: a half-written record is not counted

    def recent(self, slot: int, since: float = 0.0) -> list[tuple[bytes, bytes, bytes | None]]:
        """The answers the slot's process sent last, (ref, status, body), oldest
        first, those sent at ``since`` (monotonic) or later; body None: too large
        to keep. The oldest record is left out: it may be the one the process was
        writing over when it died."""
        base = slot * self._recent_stride
        mem = self._recent
        (n,) = _COUNT.unpack_from(mem, base)
        out = []
        for i in range(max(0, n - self.recent_count + 1), n):
            start = base + _COUNT.size + (i % self.recent_count) * RECENT_RECORD
            at, n_ref, n_status, n_body = _RECENT.unpack_from(mem, start)
            if at < since:
                continue
            data = start + _RECENT.size
            kept = n_body != NOT_KEPT
            raw = bytes(mem[data : data + n_ref + n_status + (n_body if kept else 0)])
            ref, status = raw[:n_ref], raw[n_ref : n_ref + n_status]
            out.append((ref, status, raw[n_ref + n_status :] if kept else None))
        return out

    def forget_recent(self, slot: int) -> None:
        """The answers kept were sent again (or a fresh process takes the slot)."""
        _COUNT.pack_into(self._recent, slot * self._recent_stride, 0)

    def cancel_unstarted(self, attempt_id: bytes) -> None:
        """The job manager: ``attempt_id`` is cancelled; a process that holds it
        unstarted (sent ahead while it ran another job) must not start it. Written
        before the job manager looks for a process running it: a process writes
        its slot (``start``) before it looks here, so one of the two sees the other."""
        n = _COUNT.unpack_from(self._cancels, 0)[0]
        aid = attempt_id[:MAX_ATTEMPT_ID]
        at = _COUNT.size + (n % CANCELS) * _CANCEL_RECORD
        self._cancels[at : at + 1 + len(aid)] = bytes((len(aid),)) + aid
        _COUNT.pack_into(self._cancels, 0, n + 1)

    def cancel_count(self) -> int:
        """How many ``cancel_unstarted`` so far (a process compares it with the count
        it has read, one look per job)."""
        return int(_COUNT.unpack_from(self._cancels, 0)[0])

    def cancels_since(self, seen: int) -> tuple[int, list[bytes]]:
        """(the count now, the attempt ids cancelled since ``seen``; at most the ring's
        last ``CANCELS``: a process further behind than that misses the oldest)."""
        n = self.cancel_count()
        out = []
        for i in range(max(seen, n - CANCELS), n):
            at = _COUNT.size + (i % CANCELS) * _CANCEL_RECORD
            length = self._cancels[at]
            out.append(bytes(self._cancels[at + 1 : at + 1 + length]))
        return n, out

    def mark_cancelled(self, slot: int) -> None:
        base = slot * SLOT_SIZE
        self._mem[base + _FLAGS] = self._mem[base + _FLAGS] | CANCELLED

    def cancelled(self, slot: int) -> bool:
        return bool(self._mem[slot * SLOT_SIZE + _FLAGS] & CANCELLED)

    def read(self, slot: int) -> tuple[bytes, float, float]:
        """(attempt id, started, timeout); an empty id when the slot is idle."""
        running = self.running(slot)
        if running is None:
            return b"", 0.0, 0.0
        return running.attempt_id, running.started, running.timeout

    def running(self, slot: int) -> Running | None:
        """What the slot runs, or None when it is idle."""
        base = slot * SLOT_SIZE
        started, timeout, retries, n_id, n_queue, n_task, n_body, flags = _HEADER.unpack_from(
            self._mem, base
        )
        if not n_id:
            return None
        data = base + _HEADER.size
        raw = bytes(self._mem[data : data + n_id + n_queue + n_task + n_body])
        q_end = n_id + n_queue
        t_end = q_end + n_task
        return Running(
            raw[:n_id],
            started,
            timeout,
            raw[n_id:q_end].decode("utf-8", "replace"),
            raw[q_end:t_end].decode("utf-8", "replace"),
            retries,
            bool(flags & GUARANTEED),
            bool(flags & CANCELLED),
            raw[t_end:],
        )


def answers_again(table: SlotTable, slot: int) -> list[tuple[bytes, bytes, bytes]]:
    """(ref, status, body) of the answers the slot's process sent last, to send
    again without their credit: one whose body was too large to keep goes as a
    WorkerLost failure (the job ran; its answer may be lost)."""
    out = []
    for ref, status, body in table.recent(slot, since=time.monotonic() - RESEND_WINDOW):
        if body is None:
            body = encode_failure(
                WORKER_LOST,
                "the job ran, but its answer may not have reached the broker (its worker "
                "process died or connected again; an answer this large is not kept to "
                "send again)",
                "",
            )
            status = F.status_frame(True, WORKER_LOST)
        out.append((ref, F.without_ready(status), body))
    return out
