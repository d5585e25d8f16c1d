"""A worker process's (or the job manager's) side of the recorder process: a
PUSH socket that never blocks, and the records it could not send yet."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from emq_django import transport
from emq_django.transport import SocketOptions
from emq_django.worker.kept_records import SlotRecords
from emq_django.worker.record_batch import RecordBatch

log = logging.getLogger(__name__)

SEND_HWM = 1000  # batches queued for the recorder process before a worker keeps them
ERROR_LOG_INTERVAL = 60.0


class RecordForwarder:
    """How a worker process (or the job manager) hands its records to the recorder
    process. ``add`` is all a job costs; ``flush`` sends them as one message and
    never blocks: what cannot be sent is kept for the next one."""

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        max_buffer: int,
        manager: str,
        kept: SlotRecords | None = None,
    ) -> None:
        self.sock = transport.connect(
            context, zmq.PUSH, endpoint, SocketOptions(linger=-1, sndhwm=SEND_HWM)
        )
        self.max_buffer = max_buffer
        self.batch = RecordBatch(manager)
        # a worker process's records are kept in shared memory too (kept_records.py)
        self.kept = kept
        self.add = self.batch.add if kept is None else self._add_kept  # no extra call
        self._next_error_log = 0.0
        self.sent = 0
        self.dropped = 0
        self.not_kept = 0  # records too large for the shared memory (lost if it dies)

    def _add_kept(
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
    ) -> None:
        """``RecordBatch.add``, and the record kept in shared memory too."""
        row = (attempt_id, task, queue, started_us, finished_us, failed, error_type,
               retry_count, request, reply, lost, partials)  # fmt: skip
        self.batch.add(*row)
        kept = self.kept
        assert kept is not None
        if kept.add(*row):
            return
        self.flush()  # the area is full: hand the records over, then keep this one
        if kept.add(*row):
            return
        self.not_kept += 1
        if self.not_kept == 1 or self.not_kept % 1000 == 0:
            log.warning(
                "%d job records could not be kept in shared memory (too large, or the "
                "recorder process is not taking records): they are lost if this worker "
                "process dies before it hands them over",
                self.not_kept,
            )

    def __len__(self) -> int:
        return len(self.batch)

    def flush(self) -> None:
        if not self.batch.rows:
            return
        try:
            self.sock.send_multipart(self.batch.encode(), zmq.NOBLOCK)
        except zmq.Again:
            self._keep()
            return
        self.sent += len(self.batch)
        self.batch.clear()
        if self.kept is not None:
            self.kept.handed_over()

    def _keep(self) -> None:
        excess = len(self.batch) - self.max_buffer
        if excess > 0:
            self.batch.drop_oldest(excess)
            self.dropped += excess
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + ERROR_LOG_INTERVAL
            log.warning(
                "the recorder process is not taking job records; %d kept, %d dropped so far",
                len(self.batch),
                self.dropped,
            )

    def close(self, linger: float = 5.0) -> None:
        """Send what is left; wait up to ``linger`` seconds for it to be taken."""
        if self.sock.closed:
            return
        self.flush()
        if self.batch.rows:
            log.warning(
                "%d job records not recorded: the recorder process is gone", len(self.batch)
            )
        self.sock.close(linger=int(linger * 1000))
