"""One job's story from the broker's trace log (``EMQ_TRACE_DIR``), for its admin page.

The history row (``JobResult``) holds the last attempt only; the trace log holds
every state change: when the job was enqueued, each attempt's job manager, the
retries. Reading it costs a scan of a few hourly files, so it is done for one job
page at a time, never for a list, and files above ``MAX_FILE_BYTES`` are skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 512 * 1024 * 1024
HOURS_BEFORE = 3  # a job's events start at most this many hours before it finished
HOURS_AFTER = 1


@dataclass
class Attempt:
    number: int
    job_manager: str = ""
    dispatched: dt.datetime | None = None
    finished: dt.datetime | None = None
    outcome: str = ""  # succeeded, failed, timed_out, requeued, running
    run_seconds: float | None = None
    error: str = ""


@dataclass
class JobStory:
    events: list[dict[str, Any]] = field(default_factory=list)
    enqueued: dt.datetime | None = None
    attempts: list[Attempt] = field(default_factory=list)
    final: str = ""  # the last event's name
    task: str = ""  # from the first event that names them (null for EventMQ's clients)
    queue: str = ""


def _when(ts_us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts_us / 1_000_000, dt.UTC)


def trace_files(directory: str, around: dt.datetime) -> list[Path]:
    """The hourly files that may hold a job that finished at ``around``, oldest first."""
    base = around.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    hours = range(-HOURS_BEFORE, HOURS_AFTER + 1)
    names = [f"trace-{base + dt.timedelta(hours=h):%Y%m%d-%H}.jsonl" for h in hours]
    return [Path(directory) / n for n in names if (Path(directory) / n).is_file()]


def _lines_with(path: Path, needle: bytes) -> list[bytes]:
    size = path.stat().st_size
    if size == 0 or size > MAX_FILE_BYTES:
        return []
    found = []
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(needle)
        while at >= 0:
            start = m.rfind(b"\n", 0, at) + 1
            end = m.find(b"\n", at)
            end = len(m) if end < 0 else end
            found.append(bytes(m[start:end]))
            at = m.find(needle, end)
    return found


def events_of(job_id: str, directory: str, around: dt.datetime) -> list[dict[str, Any]]:
    if not directory or not os.path.isdir(directory):
        return []
    needle = b'"job":' + json.dumps(job_id).encode() + b","
    events = []
    for path in trace_files(directory, around):
        for line in _lines_with(path, needle):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(event, dict) and event.get("job") == job_id:
                events.append(event)
    return events


def story(events: list[dict[str, Any]]) -> JobStory:
    """Fold the events (in the order written) into the enqueue time and the attempts."""
    out = JobStory(events=events)
    by_number: dict[int, Attempt] = {}
    for e in events:
        kind, number, ts = e.get("event", ""), int(e.get("attempt") or 0), int(e.get("ts") or 0)
        out.final = kind
        out.task = out.task or e.get("task") or ""
        out.queue = out.queue or e.get("queue") or ""
        if kind == "enqueued":
            out.enqueued = out.enqueued or _when(ts)
            continue
        if number <= 0:
            continue
        attempt = by_number.setdefault(number, Attempt(number))
        if kind == "dispatched":
            attempt.dispatched, attempt.job_manager = _when(ts), e.get("jm") or ""
            attempt.outcome = attempt.outcome or "running"
            if out.enqueued is None and number == 1 and "wait_us" in e:
                out.enqueued = _when(ts - int(e["wait_us"]))
        elif kind in ("succeeded", "failed", "timed_out", "requeued", "cancelled"):
            attempt.finished, attempt.outcome = _when(ts), kind
            attempt.job_manager = attempt.job_manager or e.get("jm") or ""
            attempt.error = e.get("error") or ""
            if "run_us" in e:
                attempt.run_seconds = int(e["run_us"]) / 1_000_000
        elif kind in ("retried", "dead_lettered"):
            attempt.outcome = f"{attempt.outcome or 'failed'}, {kind.replace('_', ' ')}"
    out.attempts = [by_number[n] for n in sorted(by_number)]
    return out


def job_story(job_id: str, around: dt.datetime) -> JobStory:
    from emq_django.conf import cached_settings

    return story(events_of(job_id, cached_settings().TRACE_DIR, around))
