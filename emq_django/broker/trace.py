"""The trace log: one JSON line per job state change, in hourly files.

The one source for the job history and the analytics (docs/trace-format.md).
The broker core formats each event as it happens and buffers the lines; the
server has ``TraceWriter.write`` append them at most every 20 ms (server.py),
so tracing costs no system call per job. A
write that fails (a full disk) is logged and counted, never raised: the trace
must not stop the broker.

Formatting is on the broker's hot path (three events per job), so lines are
built with f-strings rather than ``json.dumps`` of a dict: the strings that
repeat (task, queue, job manager, error) are JSON-quoted once and cached, and a
job id made of letters and digits (every id our client makes) needs no quoting
work at all; the broker keeps a job's quoted id and its task/queue/job manager
fields with the job. The three lines every job has (enqueued, dispatched,
succeeded) have a function each. The output is the same JSON, field for field,
as ``json.dumps``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from emq_django.broker.state import show_identity
from emq_django.protocol.headers import trace_id_of

if TYPE_CHECKING:
    from emq_django.broker.state import Job, Peer

log = logging.getLogger(__name__)

_quote = json.JSONEncoder(ensure_ascii=False).encode
_QUOTED_CACHE_LIMIT = 10_000  # distinct task/queue/manager/error strings kept quoted
_quoted: dict[str, str] = {"": "null"}
_FINISHED = frozenset(("succeeded", "failed", "timed_out"))
# the lines with run_us and total_us: an attempt's end, and the dead letter its
# failure made (the same times: one line for the job's facts)
_TIMED = _FINISHED | {"dead_lettered"}
# (task, queue, job manager) -> '"task":...,"queue":...,"jm":...'
_where: dict[tuple[str, str, str], str] = {}


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


def job_json(job_id: bytes) -> str:
    """The job id as a JSON string (the broker keeps it with the job)."""
    if job_id.isalnum():  # ASCII letters and digits: nothing to escape
        return f'"{job_id.decode("ascii")}"'
    return _quote(job_id.decode("utf-8", "replace"))


def trace_file_name(wall: float) -> str:
    """``trace-YYYYMMDD-HH.jsonl`` in UTC, the hour of ``wall``."""
    return time.strftime("trace-%Y%m%d-%H.jsonl", time.gmtime(wall))


def end_fields(final: bool, retries: int = 0, requeues: int = 0) -> str:
    """The fields of a line that ends an attempt: ``"final"``, whether it also ends
    the job, and on a final line the job's ``retries`` and ``requeues`` (each
    only when not 0). docs/trace-format.md."""
    if not final:
        return ',"final":false'
    if not (retries or requeues):
        return ',"final":true'
    out = ',"final":true'
    if retries:
        out += f',"retries":{retries}'
    if requeues:
        out += f',"requeues":{requeues}'
    return out


def job_counts(job: Job, failed_now: bool) -> tuple[int, int]:
    """(retries, requeues) of ``job`` as its attempt ends: every failure before
    this attempt's was retried (``failed_now``: ``job.failures`` counts this
    attempt's too), and every other new attempt was a requeue."""
    retries = job.failures - 1 if failed_now else job.failures
    retries = max(retries, 0)
    return retries, max(job.attempt - 1 - retries, 0)


def format_line(
    kind: str,
    now: float,
    wall_offset: float,
    job: str,
    attempt: int,
    where: str,
    error: str,
    enqueued: float,
    dispatched: float,
    extra: float,
    partials: int = 0,
    final: bool | None = None,
    retries: int = 0,
    requeues: int = 0,
) -> str:
    """One line of docs/trace-format.md, without the newline, from the parts the
    broker keeps: ``job`` from ``job_json``, ``where`` from ``where_fields``.
    The three lines every job has are made by
    ``enqueued_line``, ``dispatched_line`` and ``succeeded_line``, which are the
    same as this, only faster (no choosing)."""
    if kind == "dispatched":
        tail = f',"wait_us":{round((now - enqueued) * 1_000_000)}'
    elif kind in _TIMED:
        tail = (
            f',"run_us":{round((now - dispatched) * 1_000_000)}'
            f',"total_us":{round((now - enqueued) * 1_000_000)}'
        )
    elif kind == "retried":
        tail = f',"delay_us":{round(extra * 1_000_000)}'
    else:
        tail = ""
    if final is not None:
        tail += end_fields(final, retries, requeues)
    if partials:  # the attempt's partial results (PARTIAL), on the line that ends it
        tail += f',"partials":{partials}'
    end = f',"error":{_q(error)}}}' if error else "}"
    ts = round((now + wall_offset) * 1_000_000)
    return f'{{"ts":{ts},"event":"{kind}","job":{job},"attempt":{attempt},{where}{tail}{end}'


def enqueued_line(wall: float, job: str, attempt: int, where: str) -> str:
    return (
        f'{{"ts":{round(wall * 1_000_000)},"event":"enqueued","job":{job},'
        f'"attempt":{attempt},{where}}}'
    )


def dispatched_line(wall: float, job: str, attempt: int, where: str, wait: float) -> str:
    return (
        f'{{"ts":{round(wall * 1_000_000)},"event":"dispatched","job":{job},'
        f'"attempt":{attempt},{where},"wait_us":{round(wait * 1_000_000)}}}'
    )


def succeeded_line(
    wall: float,
    job: str,
    attempt: int,
    where: str,
    run: float,
    total: float,
    partials: int = 0,
    retries: int = 0,
    requeues: int = 0,
) -> str:
    """Always the job's final line; ``retries``, ``requeues``: its counts."""
    if retries or requeues:
        tail = end_fields(True, retries, requeues)
        tail += f',"partials":{partials}}}' if partials else "}"
    elif partials:
        tail = f',"final":true,"partials":{partials}}}'
    else:
        tail = ',"final":true}'
    return (
        f'{{"ts":{round(wall * 1_000_000)},"event":"succeeded","job":{job},'
        f'"attempt":{attempt},{where},"run_us":{round(run * 1_000_000)},'
        f'"total_us":{round(total * 1_000_000)}{tail}'
    )


class JobTracer:
    """The core's trace events, formatted as they happen and kept in ``lines``
    until the server writes them. Lines are formatted now, not when written: a
    loop turn that writes thousands of events at once would keep the broker from
    its sockets."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.wall_offset = 0.0  # wall clock minus the core's monotonic ``now``

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines

    def event(
        self,
        event: str,
        job: Job,
        now: float,
        error: str = "",
        peer: Peer | None = None,
        extra: float = 0.0,
        final: bool | None = None,
        failed_now: bool = False,
    ) -> None:
        """Any line; the three every job has go through the faster
        ``enqueued``, ``dispatched`` and ``succeeded``. ``final``: on a line that
        ends an attempt or the job, whether it ends the job (the job's counts
        follow on a final line, ``job_counts(job, failed_now)``)."""
        if peer is None:
            peer = job.peer
        retries = requeues = 0
        if final:
            retries, requeues = job_counts(job, failed_now)
        where = where_fields(job.headers.task, job.queue, trace_name(peer))
        self.lines.append(
            format_line(
                event,
                now,
                self.wall_offset,
                job.trace[0] or _trace_id(job),
                job.attempt,
                where,
                error,
                job.enqueued_at,
                job.dispatched_at,
                extra,
                job.partials,
                final,
                retries,
                requeues,
            )
        )

    def enqueued(self, job: Job, now: float) -> None:
        # not kept on the job yet: a job waiting in a backlog would hold it for
        # nothing; dispatched() keeps it for the attempt's lines
        where = where_fields(job.headers.task, job.queue, "")
        if job.headers.extra:  # (an empty tuple for almost every job)
            trace_id = trace_id_of(job.headers)
            if trace_id:  # the job's OpenTelemetry trace, for the admin's link
                where += f',"otel":"{trace_id}"'
        self.lines.append(
            enqueued_line(
                now + self.wall_offset, job.trace[0] or job_json(job.id), job.attempt, where
            )
        )

    def dispatched(self, job: Job, now: float, peer: Peer) -> None:
        where = where_fields(job.headers.task, job.queue, trace_name(peer))
        job.trace = (job.trace[0] or job_json(job.id), where)
        self.lines.append(
            dispatched_line(
                now + self.wall_offset,
                job.trace[0],
                job.attempt,
                where,
                now - job.enqueued_at,
            )
        )

    def succeeded(self, job: Job, now: float) -> None:
        """Its job manager is the one it was dispatched to (``Job.trace``)."""
        trace_id, where = job.trace
        if not where:  # never dispatched here (no such job yet)
            self.event("succeeded", job, now, final=True)
            return
        failures = job.failures
        if failures or job.attempt > 1:
            retries, requeues = job_counts(job, False)
        else:
            retries = requeues = 0
        self.lines.append(
            succeeded_line(
                now + self.wall_offset,
                trace_id or _trace_id(job),
                job.attempt,
                where,
                now - job.dispatched_at,
                now - job.enqueued_at,
                job.partials,
                retries,
                requeues,
            )
        )


def _trace_id(job: Job) -> str:
    trace_id = job_json(job.id)
    job.trace = (trace_id, job.trace[1])
    return trace_id


def trace_name(peer: Peer | None) -> str:
    """A peer's ``jm`` in the trace: its job manager's name, or its identity."""
    if peer is None:
        return ""
    if peer.trace_name is None:
        peer.trace_name = peer.manager_name or show_identity(peer.identity)
    return peer.trace_name


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
        """Append ``lines`` (from ``format_line`` and co., without newlines)."""
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
