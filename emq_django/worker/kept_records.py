"""Job records a worker process has not handed to the recorder process, kept in
shared memory as well, so that they survive the death of the process.

A worker process hands its records over in batches (every ``EMQ_RECORD_INTERVAL``
seconds, ``record_forwarder.RecordForwarder``); a process killed in between (for
its time limit, a cancel, a crash, the OOM killer) took the outcomes of the jobs
it had finished with it. Each record is therefore also written here, in one of
two areas per slot: the records not handed over yet, and those of the last
batch handed over (that message may still sit in the dead process's socket
queue). When a process ends, its job manager reads both areas and sends their
records to the recorder process itself; the recorder process drops those it
already has (``RecorderProcess``), so nothing is written twice.

Per job this costs one struct pack and one copy of the bodies into the area,
as the slot table already does for each answer (``slots.SlotTable.sent``).
"""

from __future__ import annotations

import logging
import mmap
import struct
from typing import Any

log = logging.getLogger(__name__)

AREA_SIZE = 1 << 20  # bytes per area; two areas per slot (anonymous memory: lazily used)
_ACTIVE = struct.Struct("=Q")  # per slot: the area records go to (0 or 1)
_USED = struct.Struct("=I")  # per area: bytes used after this field
# started_us, finished_us, retry_count, partials, failed, lost, then the lengths of
# the attempt id, task, queue, error type, request body and reply body
_ROW = struct.Struct("=qqiiBBHHHHII")
_MAX_SHORT = 0xFFFF

# RecordBatch.add's arguments, in its order
Row = tuple[bytes, str, str, int, int, bool, str, int, bytes, bytes, bool, int]


class KeptRecords:
    """The areas of every slot of one job manager (made before it forks)."""

    def __init__(self, count: int, area_size: int = AREA_SIZE) -> None:
        self.count = count
        self.area_size = area_size
        self._stride = _ACTIVE.size + 2 * area_size
        self._mem = mmap.mmap(-1, self._stride * max(count, 1))

    def writer(self, slot: int) -> SlotRecords:
        """What the process in ``slot`` writes its records with."""
        self.take(slot)  # a fresh process: nothing of an earlier one is its own
        return SlotRecords(self._mem, slot * self._stride, self.area_size)

    def take(self, slot: int) -> list[Row]:
        """The records kept for ``slot`` (both areas, oldest area first); empties them."""
        base = slot * self._stride
        (active,) = _ACTIVE.unpack_from(self._mem, base)
        rows: list[Row] = []
        for area in (1 - active, active) if active in (0, 1) else (0, 1):
            at = base + _ACTIVE.size + area * self.area_size
            rows += _decode_area(self._mem, at, self.area_size)
            _USED.pack_into(self._mem, at, 0)
        _ACTIVE.pack_into(self._mem, base, 0)
        return rows


class SlotRecords:
    """One slot's areas, as its worker process writes them."""

    __slots__ = ("_mem", "_base", "_size", "_area", "_used", "_data", "_limit", "_names")

    def __init__(self, mem: mmap.mmap, base: int, size: int) -> None:
        self._mem = mem
        self._base = base
        self._size = size
        self._area = 0
        self._used = 0  # bytes used in the active area (this process is its only writer)
        self._data = base + _ACTIVE.size + _USED.size  # where the active area's records start
        self._limit = size - _USED.size  # bytes of records an area holds
        # (task, queue, error type) -> the three encoded, with their lengths: the
        # same few repeat on every job
        self._names: dict[tuple[str, str, str], tuple[bytes, int, int, int]] = {}

    def add(
        self,
        attempt_id: bytes,
        task: str,
        queue: str,
        started_us: int,
        finished_us: int,
        failed: bool,
        error_type: str,
        retry_count: int,
        request: bytes,
        reply: bytes,
        lost: bool = False,
        partials: int = 0,
    ) -> bool:
        """Keep one record; False (nothing kept) when the active area is full."""
        names = self._names.get((task, queue, error_type))
        if names is None:
            names = self._encode(task, queue, error_type)
        text, n_task, n_queue, n_error = names
        data = attempt_id + text + request + reply
        used = self._used
        if used + _ROW.size + len(data) > self._limit or len(attempt_id) > _MAX_SHORT:
            return False
        mem = self._mem
        at = self._data + used
        _ROW.pack_into(
            mem, at, started_us, finished_us, retry_count, partials, failed, lost,
            len(attempt_id), n_task, n_queue, n_error, len(request), len(reply),
        )  # fmt: skip
        at += _ROW.size
        mem[at : at + len(data)] = data
        self._used = used = used + _ROW.size + len(data)
        _USED.pack_into(
            mem, self._data - _USED.size, used
        )  # last: a half-written record is not there
        return True

    def _encode(self, task: str, queue: str, error_type: str) -> tuple[bytes, int, int, int]:
        t, q, e = task.encode()[:_MAX_SHORT], queue.encode()[:_MAX_SHORT], error_type.encode()
        e = e[:_MAX_SHORT]
        if len(self._names) >= 1024:
            self._names.clear()
        names = self._names[(task, queue, error_type)] = (t + q + e, len(t), len(q), len(e))
        return names

    def handed_over(self) -> None:
        """The records of the active area were handed over: the other area (the
        batch before, surely gone by now) is emptied and takes the next ones."""
        other = 1 - self._area
        area = self._base + _ACTIVE.size + other * self._size
        _USED.pack_into(self._mem, area, 0)
        _ACTIVE.pack_into(self._mem, self._base, other)
        self._area, self._used, self._data = other, 0, area + _USED.size


def _decode_area(mem: Any, at: int, size: int) -> list[Row]:
    (used,) = _USED.unpack_from(mem, at)
    end = at + _USED.size + min(used, size - _USED.size)
    at += _USED.size
    rows: list[Row] = []
    while at + _ROW.size <= end:
        started, finished, retries, partials, failed, lost, *lengths = _ROW.unpack_from(mem, at)
        at += _ROW.size
        raw = bytes(mem[at : at + sum(lengths)])
        at += sum(lengths)
        parts, pos = [], 0
        for n in lengths:
            parts.append(raw[pos : pos + n])
            pos += n
        aid, t, q, e, request, reply = parts
        rows.append(
            (aid, t.decode("utf-8", "replace"), q.decode("utf-8", "replace"), started, finished,
             bool(failed), e.decode("utf-8", "replace"), retries, request, reply, bool(lost),
             partials)
        )  # fmt: skip
    return rows
