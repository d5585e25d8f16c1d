"""The trace log: one JSON line per job state change, in hourly files.

The one source for the job history and the analytics (docs/trace-format.md).
The broker core buffers events as tuples; ``TraceWriter.write`` formats and
appends them once per loop turn, so tracing costs no system call per job. A
write that fails (a full disk) is logged and counted, never raised: the trace
must not stop the broker.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from emq_django.broker.core import TraceEvent

log = logging.getLogger(__name__)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def trace_file_name(wall: float) -> str:
    """``trace-YYYYMMDD-HH.jsonl`` in UTC, the hour of ``wall``."""
    return time.strftime("trace-%Y%m%d-%H.jsonl", time.gmtime(wall))


def format_event(event: TraceEvent, wall_offset: float) -> str:
    kind, now, job_id, attempt, queue, task, manager, error, enqueued, dispatched = event
    line: dict[str, object] = {
        "ts": _us(now + wall_offset),
        "event": kind,
        "job": job_id.decode("utf-8", "replace"),
        "attempt": attempt,
        "task": task or None,
        "queue": queue,
        "jm": manager or None,
    }
    if kind == "dispatched":
        line["wait_us"] = _us(now - enqueued)
    elif kind in ("succeeded", "failed", "timed_out"):
        line["run_us"] = _us(now - dispatched)
        line["total_us"] = _us(now - enqueued)
    if error:
        line["error"] = error
    return _dumps(line)


class TraceWriter:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._name = ""
        self._file: IO[str] | None = None
        self.written = 0
        self.dropped = 0

    def write(self, events: Iterable[TraceEvent], wall_offset: float) -> None:
        lines = [format_event(e, wall_offset) for e in events]
        if not lines:
            return
        try:
            self._open(time.time()).write("\n".join(lines) + "\n")
            assert self._file is not None
            self._file.flush()
            self.written += len(lines)
        except OSError as exc:
            self.dropped += len(lines)
            log.error(
                "could not write %d trace events to %s: %s (%d dropped so far)",
                len(lines),
                self.directory,
                exc,
                self.dropped,
            )
            self._close()

    def _open(self, wall: float) -> IO[str]:
        name = trace_file_name(wall)
        if self._file is None or name != self._name:
            self._close()
            self._file = open(self.directory / name, "a", encoding="utf-8")  # noqa: SIM115
            self._name = name
        return self._file

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
        self._file = None

    def close(self) -> None:
        self._close()
