"""``DatabaseRecorder``: the job history, written by each job manager's recorder process.

Why from the job managers and not from a command that tails the trace log: the
worker processes already hold everything the history needs (the arguments, the
return value, the traceback), while the broker's trace deliberately carries none
of it (the broker never decodes a job's body). The worker processes pass their
records to their job manager's recorder process (``worker/recorder_process.py``,
which says why one process writes for all of them), and that process runs this
class: no second decode of the jobs, no process to deploy and watch besides the
job manager; the trace log stays what the analytics read.

Cost: ``record()`` only keeps the record. ``flush()`` writes everything gathered
since the last flush as one transaction: one multi-row upsert into ``JobResult``
(keyed by the job id, so a later attempt replaces an earlier one and never the
reverse) and one into ``JobStat``. Under load a flush carries many jobs.

The recorder uses its own database connection, not Django's per-thread one, so
that nothing else in the process (a worker closes Django's after every job) makes
it reconnect. When the database is down the records are kept (up to
``EMQ_RESULTS_MAX_BUFFER``) and written at a later flush; jobs never wait for the
database.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, connections

from emq_django.results.conf import results_settings
from emq_django.results.models import JobResult, JobStat, Status
from emq_django.results.pruning import prune
from emq_django.worker.recording import CANCELLED, JobRecord, will_retry

log = logging.getLogger(__name__)

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=repr).encode
_VALUE_PREFIX = b'{"value":'
ERROR_LOG_INTERVAL = 60.0

COLUMNS = (
    "id",
    "task",
    "queue",
    "status",
    "args",
    "kwargs",
    "result",
    "error_type",
    "error",
    "traceback",
    "attempts",
    "enqueued_at",
    "started_at",
    "finished_at",
    "runtime",
    "job_manager",
    "partials",
)
# A job manager answering for a lost worker process knows neither task, queue nor
# arguments: keep what an earlier attempt wrote.
_KEEP_WHEN_UNKNOWN = ("task", "queue", "args", "kwargs")


def upsert_sql(table: str, quote: Any) -> str:
    t = quote(table)
    cols = ", ".join(quote(c) for c in COLUMNS)
    marks = ", ".join(["%s"] * len(COLUMNS))
    sets = []
    for c in COLUMNS[1:]:
        q = quote(c)
        if c in _KEEP_WHEN_UNKNOWN:
            known = "task" if c in ("args", "kwargs") else c
            sets.append(
                f"{q} = CASE WHEN excluded.{quote(known)} = '' THEN {t}.{q} ELSE excluded.{q} END"
            )
        elif c == "enqueued_at":
            sets.append(f"{q} = COALESCE(excluded.{q}, {t}.{q})")
        else:
            sets.append(f"{q} = excluded.{q}")
    return (
        f"INSERT INTO {t} ({cols}) VALUES ({marks}) ON CONFLICT ({quote('id')}) "
        f"DO UPDATE SET {', '.join(sets)} WHERE excluded.attempts >= {t}.attempts"
    )


def stats_sql(table: str, quote: Any) -> str:
    t = quote(table)
    return (
        f"INSERT INTO {t} (bucket, queue, succeeded, failed, run_sum, run_max) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (bucket, queue) DO UPDATE SET "
        f"succeeded = {t}.succeeded + excluded.succeeded, "
        f"failed = {t}.failed + excluded.failed, "
        f"run_sum = {t}.run_sum + excluded.run_sum, "
        f"run_max = CASE WHEN excluded.run_max > {t}.run_max "
        f"THEN excluded.run_max ELSE {t}.run_max END"
    )


def time_adapter(db: Any) -> Callable[[float], Any]:
    """Epoch seconds -> what ``db`` stores in a DateTimeField column.

    SQLite stores UTC text (``YYYY-MM-DD HH:MM:SS.ffffff``, as Django writes it);
    the seconds part is formatted once per second, not once per job.
    """
    if db.vendor != "sqlite":
        adapt = db.ops.adapt_datetimefield_value
        return lambda ts: adapt(datetime.fromtimestamp(ts, UTC))
    seconds: dict[int, str] = {}

    def sqlite_text(ts: float) -> str:
        whole = int(ts)
        prefix = seconds.get(whole)
        if prefix is None:
            if len(seconds) > 1000:
                seconds.clear()
            prefix = seconds[whole] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole))
        return f"{prefix}.{int((ts - whole) * 1_000_000):06d}"

    return sqlite_text


def status_of(record: JobRecord) -> str:
    if not record.failed:
        return Status.SUCCEEDED
    if record.error_type == CANCELLED:
        return Status.CANCELLED
    if will_retry(record):
        return Status.RETRYING
    if record.error_type == "TimeoutError":
        return Status.TIMED_OUT
    return Status.LOST if record.lost else Status.FAILED


def outcome_of(record: JobRecord) -> tuple[str, str, str]:
    """(result JSON, error message, traceback) from the REPLY body."""
    body = record.body
    if not record.failed and body.startswith(_VALUE_PREFIX) and body.endswith(b"}"):
        return body[len(_VALUE_PREFIX) : -1].decode("utf-8", "replace"), "", ""
    try:
        data = json.loads(body)
    except ValueError:
        return "", body[:2000].decode("utf-8", "replace"), ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return "", str(err.get("message", "")), str(err.get("traceback", ""))
    if isinstance(data, dict) and "value" in data:
        return _encode(data["value"]), "", ""
    return _encode(data), "", ""


class DatabaseRecorder:
    """``EMQ_RECORDER = "emq_django.results.recorder.DatabaseRecorder"``."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.settings = results_settings()
        self._pending: dict[str, JobRecord] = {}  # job id -> its latest record
        self._db: Any = None
        self._next_prune = time.monotonic() + random.uniform(0, self.settings.prune_interval)
        self._next_error_log = 0.0
        self.written = 0
        self.dropped = 0

    # ---- JobRecorder ---------------------------------------------------------

    def record(self, record: JobRecord) -> None:
        previous = self._pending.get(record.job_id)
        if previous is None or previous.attempt <= record.attempt:
            self._pending[record.job_id] = record

    def flush(self) -> None:
        if self._pending:
            self._write()
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + self.settings.prune_interval
            self._prune()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # ---- writing -----------------------------------------------------------------

    def _connection(self) -> Any:
        if self._db is None:
            db = connections.create_connection(self.using)
            quote = db.ops.quote_name
            self._upsert = upsert_sql(JobResult._meta.db_table, quote)
            self._stats = stats_sql(JobStat._meta.db_table, quote)
            self._begin = "BEGIN IMMEDIATE" if db.vendor == "sqlite" else "BEGIN"
            self._adapt = time_adapter(db)
            self._db = db
        return self._db

    def _write(self) -> None:
        records = list(self._pending.values())
        try:
            db = self._connection()
            rows, stats = self._rows(records, self._adapt)
            with db.cursor() as cursor:
                cursor.execute(self._begin)
                try:
                    cursor.executemany(self._upsert, rows)
                    cursor.executemany(self._stats, stats)
                    cursor.execute("COMMIT")
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise
        except DatabaseError as exc:
            self._failed(exc, len(records))
            return
        self._pending.clear()
        self.written += len(records)

    def _rows(
        self, records: list[JobRecord], adapt: Callable[[float], Any]
    ) -> tuple[list[Any], list[Any]]:
        rows = []
        buckets: dict[tuple[int, str], list[float]] = {}
        width = JobStat.BUCKET_SECONDS
        for r in records:
            result, message, tb = outcome_of(r)
            runtime = r.finished - r.started
            enqueued = getattr(r, "enqueued", 0.0)  # not in JobRecord yet (docs: admin)
            rows.append(
                (
                    r.job_id,
                    r.task,
                    r.queue,
                    status_of(r),
                    _encode(r.args) if r.args else "[]",
                    _encode(r.kwargs) if r.kwargs else "{}",
                    result,
                    r.error_type,
                    message,
                    tb,
                    r.attempt,
                    adapt(enqueued) if enqueued else None,
                    adapt(r.started),
                    adapt(r.finished),
                    runtime,
                    r.manager,
                    r.partials,
                )
            )
            key = (int(r.finished // width) * width, r.queue)
            stat = buckets.get(key)
            if stat is None:
                stat = buckets[key] = [0, 0, 0.0, 0.0]
            stat[1 if r.failed else 0] += 1
            stat[2] += runtime
            stat[3] = max(stat[3], runtime)
        stats = [(adapt(b), q, s[0], s[1], s[2], s[3]) for (b, q), s in buckets.items()]
        return rows, stats

    def _failed(self, exc: Exception, count: int) -> None:
        self.close()  # a fresh connection next time
        excess = len(self._pending) - self.settings.max_buffer
        if excess > 0:
            for job_id in list(self._pending)[:excess]:
                del self._pending[job_id]
            self.dropped += excess
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + ERROR_LOG_INTERVAL
            log.error(
                "could not record %d finished jobs in the database (%s); they are kept and "
                "written later (%d dropped so far). Is the database up and migrated "
                "(manage.py migrate)?",
                count,
                exc,
                self.dropped,
            )

    def _prune(self) -> None:
        try:
            deleted = prune(self._connection(), self.settings.retention)
        except DatabaseError as exc:
            log.warning("could not prune the job history: %s", exc)
            self.close()
            return
        if deleted:
            log.info("pruned %d job results older than %g s", deleted, self.settings.retention)
