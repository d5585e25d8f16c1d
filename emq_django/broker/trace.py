"""The trace log: one JSON line per job state change, in hourly files.

The one source for the job history and the analytics (docs/trace-format.md).
The broker core buffers events as tuples; ``TraceWriter.write`` formats and
appends them once per loop turn, so tracing costs no system call per job. A
write that fails (a full disk) is logged and counted, never raised: the trace
must not stop the broker.

Formatting is on the broker's hot path (three events per job), so lines are
built with f-strings rather than ``json.dumps`` of a dict: the strings that
repeat (task, queue, job manager, error) are JSON-quoted once and cached, and a
job id made of letters and digits (every id our client makes) needs no quoting
work at all. The output is the same JSON, field for field, as ``json.dumps``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import IO

# (event, now, job id, attempt, queue, task, job manager, error, enqueued at, dispatched at,
#  extra: the retry delay for "retried")
TraceEvent = tuple[str, float, bytes, int, str, str, str, str, float, float, float]

log = logging.getLogger(__name__)

_quote = json.JSONEncoder(ensure_ascii=False).encode
_QUOTED_CACHE_LIMIT = 10_000  # distinct task/queue/manager/error strings kept quoted
_quoted: dict[str, str] = {"": "null"}
_FINISHED = frozenset(("succeeded", "failed", "timed_out"))
# (task, queue, job manager) -> '"task":...,"queue":...,"jm":...'
_where: dict[tuple[str, str, str], str] = {}


def _us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _q(text: str) -> str:
    """``text`` as a JSON string (``null`` for ''); cached, they repeat on every job."""
    quoted = _quoted.get(text)
    if quoted is None:
        if len(_quoted) >= _QUOTED_CACHE_LIMIT:
            _quoted.clear()
            _quoted[""] = "null"
        quoted = _quoted[text] = _quote(text)
    return quoted


def where_fields(task: str, queue: str, manager: str) -> str:
    """``"task":...,"queue":...,"jm":...``, cached: they repeat on every job."""
    key = (task, queue, manager)
    fields = _where.get(key)
    if fields is None:
        if len(_where) >= _QUOTED_CACHE_LIMIT:
            _where.clear()
        fields = _where[key] = f'"task":{_q(task)},"queue":{_quote(queue)},"jm":{_q(manager)}'
    return fields


def _job(job_id: bytes) -> str:
    if job_id.isalnum():  # ASCII letters and digits: nothing to escape
        return f'"{job_id.decode("ascii")}"'
    return _quote(job_id.decode("utf-8", "replace"))


def trace_file_name(wall: float) -> str:
    """``trace-YYYYMMDD-HH.jsonl`` in UTC, the hour of ``wall``."""
    return time.strftime("trace-%Y%m%d-%H.jsonl", time.gmtime(wall))


def format_event(event: TraceEvent, wall_offset: float) -> str:
    """One line of docs/trace-format.md, without the newline."""
    kind, now, job_id, attempt, queue, task, manager, error, enqueued, dispatched, extra = event
    return format_line(
        kind,
        now,
        wall_offset,
        job_fields(job_id, attempt),
        where_fields(task, queue, manager),
        error,
        enqueued,
        dispatched,
        extra,
    )


def job_fields(job_id: bytes, attempt: int) -> str:
    """``"job":...,"attempt":N``: the same in every line of one attempt (the broker
    keeps it with the job)."""
    return f'"job":{_job(job_id)},"attempt":{attempt}'


def format_line(
    kind: str,
    now: float,
    wall_offset: float,
    job: str,
    where: str,
    error: str,
    enqueued: float,
    dispatched: float,
    extra: float,
) -> str:
    """``format_event`` from the parts the broker keeps: ``job`` from
    ``job_fields``, ``where`` from ``where_fields``."""
    if kind == "dispatched":
        tail = f',"wait_us":{round((now - enqueued) * 1_000_000)}'
    elif kind in _FINISHED:
        tail = (
            f',"run_us":{round((now - dispatched) * 1_000_000)}'
            f',"total_us":{round((now - enqueued) * 1_000_000)}'
        )
    elif kind == "retried":
        tail = f',"delay_us":{round(extra * 1_000_000)}'
    else:
        tail = ""
    end = f',"error":{_q(error)}}}' if error else "}"
    ts = round((now + wall_offset) * 1_000_000)
    return f'{{"ts":{ts},"event":"{kind}",{job},{where}{tail}{end}'


class TraceWriter:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._name = ""
        self._file: IO[str] | None = None
        self._hour_ends = 0.0  # wall clock when the current file's hour is over
        self.written = 0
        self.dropped = 0

    def write(self, lines: list[str]) -> None:
        """Append ``lines`` (from ``format_event``, without newlines)."""
        if not lines:
            return
        lines.append("")  # the last line's newline
        try:
            file = self._open(time.time())
            file.write("\n".join(lines))
            file.flush()
            self.written += len(lines) - 1
        except OSError as exc:
            self.dropped += len(lines) - 1
            log.error(
                "could not write %d trace events to %s: %s (%d dropped so far)",
                len(lines) - 1,
                self.directory,
                exc,
                self.dropped,
            )
            self._close()

    def _open(self, wall: float) -> IO[str]:
        if self._file is not None and wall < self._hour_ends:
            return self._file
        name = trace_file_name(wall)
        if self._file is None or name != self._name:
            self._close()
            self._file = open(self.directory / name, "a", encoding="utf-8")  # noqa: SIM115
            self._name = name
        self._hour_ends = (wall // 3600 + 1) * 3600
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
