"""A worker process's hand-over of job records to its job manager's recorder
process (recorder_process.py): one record per finished job, flushed every
``record_interval`` seconds or every ``record_batch`` records."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from emq_django.protocol.headers import Headers
from emq_django.worker.execution import Outcome
from emq_django.worker.kept_records import SlotRecords
from emq_django.worker.record_forwarder import RecordForwarder

log = logging.getLogger(__name__)


class SlotRecording:
    """The records of one worker process, on their way to the recorder process."""

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        buffer: int,
        manager: str,
        kept: SlotRecords | None,
        interval: float,
        batch: int,
    ) -> None:
        # (its job manager hands the kept records over if this process dies)
        self.recorder = RecordForwarder(context, endpoint, buffer, manager, kept)
        self.interval = interval
        self.batch = batch
        self._unflushed = 0  # records given to the recorder since its last flush
        self._flush_at = 0.0  # monotonic: when those must be written at the latest

    def add(
        self, msgid: bytes, queue: str, h: Headers, body: bytes, outcome: Outcome, elapsed: float
    ) -> None:
        spec = outcome.spec
        finished = time.time_ns() // 1000
        try:
            self.recorder.add(
                msgid,
                h.task or (spec.task_name if spec else ""),
                queue,
                finished - int(elapsed * 1_000_000),
                finished,
                outcome.failed,
                outcome.error_type,
                h.retry_count,
                body,
                outcome.body,
                partials=outcome.partials,
            )
        except Exception:
            log.exception("the job recorder failed on job %r", msgid)
        if not self._unflushed:
            self._flush_at = time.monotonic() + self.interval
        self._unflushed += 1
        if self._unflushed >= self.batch:
            self.flush()

    def turn(self, wait: float) -> float:
        """Hand records over when due; returns how long the loop may wait for work
        (at most ``wait``).

        Records go out every ``record_interval`` seconds (or every
        ``record_batch`` records), not every time the process runs out of work,
        which under load is after every few no-op jobs. With nothing new
        recorded, ``flush`` still runs every turn: it sends what an earlier flush
        had to keep because the recorder process was behind.
        """
        if self._unflushed:
            left = self._flush_at - time.monotonic()
            if left > 0:
                return min(wait, left)
        self.flush()
        return wait

    def flush(self) -> None:
        self._unflushed = 0
        try:
            self.recorder.flush()
        except Exception:
            log.exception("the job recorder failed to flush")

    def close(self) -> None:
        """Hands over what it still holds."""
        try:
            self.recorder.close()
        except Exception:
            log.exception("could not hand the last job records over")
