"""A table in shared memory where each worker process says what it is running.

The job manager reads it to enforce time limits and to answer for a worker
process that died mid-job (with the job's task and queue, for the history),
without a message per job between the processes. It also marks a job cancelled
there, so that a worker process whose job returns during the kill grace reports
it cancelled, not succeeded. And a process that holds the REPLYs of finished jobs
back to send several in one message (eMQP's "batch" extension) keeps them here
until they leave, so that its job manager sends them if the process dies first:
a job that ran is never run again for want of its answer.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

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
    def __init__(self, count: int) -> None:
        self.count = count
        self._mem = mmap.mmap(-1, SLOT_SIZE * max(count, 1))  # shared with forked children
        self._held = mmap.mmap(-1, HELD_SIZE * max(count, 1))
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
