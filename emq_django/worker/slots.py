"""A table in shared memory where each worker process says what it is running.

The job manager reads it to enforce time limits and to answer for a worker
process that died mid-job, without a message per job between the processes.
"""

from __future__ import annotations

import mmap
import struct

_HEADER = struct.Struct("=ddB")  # started (monotonic), timeout, attempt id length
SLOT_SIZE = 512
MAX_ATTEMPT_ID = SLOT_SIZE - _HEADER.size


class SlotTable:
    def __init__(self, count: int) -> None:
        self.count = count
        self._mem = mmap.mmap(-1, SLOT_SIZE * max(count, 1))  # shared with forked children

    def start(self, slot: int, attempt_id: bytes, started: float, timeout: float) -> None:
        attempt_id = attempt_id[:MAX_ATTEMPT_ID]
        base = slot * SLOT_SIZE
        self._mem[base + _HEADER.size : base + _HEADER.size + len(attempt_id)] = attempt_id
        _HEADER.pack_into(self._mem, base, started, timeout, len(attempt_id))

    def clear(self, slot: int) -> None:
        _HEADER.pack_into(self._mem, slot * SLOT_SIZE, 0.0, 0.0, 0)

    def read(self, slot: int) -> tuple[bytes, float, float]:
        """(attempt id, started, timeout); an empty id when the slot is idle."""
        base = slot * SLOT_SIZE
        started, timeout, length = _HEADER.unpack_from(self._mem, base)
        if not length:
            return b"", 0.0, 0.0
        return (
            bytes(self._mem[base + _HEADER.size : base + _HEADER.size + length]),
            started,
            timeout,
        )
