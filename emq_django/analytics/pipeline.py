"""The incremental run: new trace bytes -> job facts -> metrics -> Parquet and the DB.

One batch:
1. the checkpoint plans the new byte ranges of the trace files;
2. their events, plus the merged rows of the jobs still open, become job and
   attempt facts;
3. the jobs still open are saved, one merged row each, for the next batch
   (dropped once ``open_job_ttl`` older than the newest event: the rest of them
   was lost);
4. this batch's finished jobs and attempts are appended to ``jobs/`` and
   ``attempts/``; every date that received one is recomputed from those tables
   and overwritten in the metric tables, and the metric rows of those dates
   replace the Django models' rows;
5. the checkpoint records the new offsets.

Two paths for step 2-3:

- the *final path*, when every line of the batch that ends an attempt carries
  ``final`` (brokers since it was added, docs/trace-format.md): each job's final
  line is its job fact, and its attempt fact is derived from that row; no
  shuffle, no open jobs to carry. ``run_once`` takes it over the trace files in
  one pass in Spark's Python workers (``endpass``): the job facts are written and
  the metrics merged from partials computed beside them, with nothing read back
  (unless the batch's dates already have stored rows: then they are recomputed
  from ``jobs/``). ``process`` (a DataFrame of events, as ``follow``'s
  micro-batches) takes it with the Spark transforms: only those lines are parsed
  in full (the reader skips the rest of any other line once its ``event`` is
  read) and written as they are read, and the metrics are computed from ``jobs/``;
- the *full path*, for older traces (and for a batch with no attempt end): the
  trace is parsed into partials merged per job x attempt (one shuffle, by job;
  cached on disk); the jobs, the attempts and the open jobs come from that cache.

A batch with no new bytes does nothing. ``follow`` copies new bytes into an inbox
directory that a Structured Streaming query reads; each micro-batch is step 2-4.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from emq_django.analytics import endpass, io, transforms
from emq_django.analytics.checkpoint import Checkpoint, stage, stage_all
from emq_django.analytics.schema import FINAL_EVENTS

log = logging.getLogger(__name__)

# The job x attempt partials are read three times (the jobs, the attempts, the
# jobs left open): kept on disk, not in the heap, where a large batch would crowd
# a small driver and the garbage collector would walk them over and over.
CACHE_LEVEL = StorageLevel.DISK_ONLY

METRIC_TABLES = ("task_minute", "queue_minute", "jm_minute", "failures", "slowest_tasks")
# The metric tables that have a Django model (the admin's Metrics page).
_DB_TABLES = ("queue_minute", "task_minute", "jm_minute", "failures")


@dataclass(frozen=True)
class AnalyzeConfig:
    trace_dir: Path
    output: Path
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    update_db: bool = True
    open_job_ttl: float = 24 * 3600.0  # seconds
    slowest_limit: int = 20
    # take the final path when the batch allows it (False: always the full path)
    final_path: bool = True


@dataclass
class BatchResult:
    sources: int = 0
    bytes: int = 0
    events: int = 0
    finished_jobs: int = 0
    open_jobs: int | None = 0  # None: not counted (the final path keeps no open jobs)
    dates: list[dt.date] = field(default_factory=list)
    db_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        if not self.sources and not self.events:
            return "no new trace data"
        days = ", ".join(d.isoformat() for d in self.dates) or "none"
        if self.open_jobs is None:
            what = f"{self.events} attempt and job ends"
            still = "(final lines: no open jobs kept)"
        else:
            what = f"{self.events} events"
            still = f"{self.open_jobs} still open"
        return (
            f"{what} from {self.sources} trace ranges ({self.bytes} bytes): "
            f"{self.finished_jobs} jobs finished, {still}; "
            f"dates recomputed: {days}; in {self.seconds:.1f} s"
        )


_END_MARKS = tuple(f'"event":"{e}"'.encode() for e in FINAL_EVENTS)
PROBE_BYTES = 1 << 16


def legacy_lines(path: Path, size: int = PROBE_BYTES) -> bool:
    """Whether the first ``size`` bytes of a trace file hold a line that ends an
    attempt without ``final`` (an older broker's): then the batch takes the full
    path at once, rather than finding out in the final path's pass."""
    with open(path, "rb") as f:
        head = f.read(size)
    lines = head.split(b"\n")
    if len(head) == size:
        lines.pop()  # cut short
    for line in lines:
        if any(mark in line for mark in _END_MARKS) and b'"final":' not in line:
            return True
    return False


class Analyzer:
    def __init__(self, spark: SparkSession, config: AnalyzeConfig) -> None:
        self.spark = spark
        self.config = config
        self.out = config.output
        self.checkpoint = Checkpoint.load(self.out / "_checkpoint.json")
        self._lock = threading.Lock()

    # ---- batch ------------------------------------------------------------

    def run_once(self, now: dt.datetime | None = None) -> BatchResult:
        """Process the trace bytes not seen yet; nothing when there are none."""
        started = time.monotonic()
        cfg = self.config
        sources = self.checkpoint.plan(cfg.trace_dir, cfg.since, cfg.until, now)
        if not sources:
            return BatchResult()
        self._clear_staging()
        staging = self.out / "_staging" / f"batch-{self.checkpoint.batch + 1}"
        try:
            paths = stage(sources, staging)
            io.tune_partitions(self.spark, sum(s.end - s.start for s in sources))
            final_path = cfg.final_path and not any(legacy_lines(p) for p in paths)
            result = self._process_files(paths) if final_path else None
            if result is None:
                # an older broker's lines, or no attempt end: the full path
                result = self.process(io.read_events(self.spark, paths), final_path=False)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        with self._lock:
            self.checkpoint.commit(sources)
            self.checkpoint.save()
        result.sources = len(sources)
        result.bytes = sum(s.end - s.start for s in sources)
        result.seconds = time.monotonic() - started
        return result

    def _clear_staging(self) -> None:
        """Remove what an earlier run left in ``_staging`` (a run killed in its batch:
        copied trace ranges, a pass's files not yet moved into ``jobs/``). One
        analyzer at a time writes an output directory (its checkpoint says so)."""
        root = self.out / "_staging"
        if not root.is_dir():
            return
        for left in root.iterdir():
            log.info("removing %s, left by an earlier run that did not finish", left)
            if left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)

    def _process_files(self, paths: list[Path]) -> BatchResult | None:
        """The final path over trace files, in one pass (``endpass``): the job facts
        are written and the metrics merged from partials computed beside them, with
        nothing read back; None (having written nothing) when a line that ends an
        attempt lacks ``final``, or there is none. When ``jobs/`` or ``attempts/``
        already hold rows of a date this batch touches, those dates' metrics are
        recomputed from the stored rows (``_write_metrics``, which keeps a job's
        latest row) instead."""
        cfg = self.config
        with self._lock:
            batch = self.checkpoint.batch + 1
            old_open = self.checkpoint.open_dir
        work = self.out / "_staging" / f"pass-{batch}-{uuid.uuid4().hex}"
        try:
            done = endpass.run(
                self.spark,
                paths,
                work,
                since_us=None if cfg.since is None else int(cfg.since.timestamp() * 1_000_000),
                until_us=None if cfg.until is None else int(cfg.until.timestamp() * 1_000_000),
            )
            if done.counts.legacy or not done.counts.ends:
                return None
            dates = done.dates
            result = BatchResult(
                events=done.counts.ends,
                finished_jobs=done.counts.final,
                open_jobs=None,
                dates=dates,
            )
            stored = bool(
                io.existing_dates(self.out / "jobs", dates)
                or io.existing_dates(self.out / "attempts", dates)
            )
            if (work / "jobs").is_dir():
                (self.out / "jobs").mkdir(parents=True, exist_ok=True)
                io.move_partitions(work / "jobs", self.out / "jobs")
            if dates and stored:
                self._write_metrics(dates, dedupe=True)
                if cfg.update_db:
                    result.db_rows = self._update_db(dates)
            elif dates:
                tables = endpass.merge(work, cfg.slowest_limit)
                for name in METRIC_TABLES:
                    endpass.write_metric_table(
                        tables[name], endpass.METRIC_SCHEMAS[name], self.out / name, dates
                    )
                if cfg.update_db:
                    result.db_rows = self._store_rows(dates, tables)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._end_final_batch(batch, old_open)
        return result

    def _end_final_batch(self, batch: int, old_open: str) -> None:
        """A final-path batch is done: the checkpoint keeps no open jobs, and those a
        full path left open end with final lines (nothing to add): dropped."""
        with self._lock:
            self.checkpoint.batch = batch
            self.checkpoint.open_dir = ""
            self.checkpoint.save()
        if old_open:
            shutil.rmtree(self.out / old_open, ignore_errors=True)

    def process(self, events: DataFrame, final_path: bool = True) -> BatchResult:
        """Steps 2-4 for ``events`` (already cleaned): the final path if the batch
        allows it (and ``final_path``), else the full path."""
        events = io.window_events(events, self.config.since, self.config.until)
        with self._lock:
            batch = self.checkpoint.batch + 1
            old_open = self.checkpoint.open_dir
        if final_path and self.config.final_path:
            result = self._process_final(events, batch, old_open)
            if result is not None:
                return result
        return self._process_full(events, batch, old_open)

    def _process_final(self, events: DataFrame, batch: int, old_open: str) -> BatchResult | None:
        """The final path; None (having written nothing) when the batch has a line
        that ends an attempt without ``final``, or none at all.

        One pass over the trace: the lines that end an attempt or a job (a pushed
        filter: the JSON reader stops parsing any other line at its ``event``),
        observed (how many, how many lack ``final``), and of those the jobs' final
        lines, written as job facts to a staging directory, then moved into
        ``jobs/`` once the batch is known to be all final lines. Their attempt
        facts are not written again: the metrics derive them from those rows
        (``transforms.all_attempts``)."""
        staging = self.out / "_staging" / f"final-{batch}-{uuid.uuid4().hex}"
        ends = events.where(F.col("event").isin(list(FINAL_EVENTS))).select(*transforms.END_COLUMNS)
        seen = Observation(f"ends-{batch}-{uuid.uuid4().hex}")
        jobs = transforms.final_job_facts(ends.observe(seen, *transforms.end_observations()))
        try:
            io.write_dates(jobs, staging, unique="job")
            counts = seen.get
            if counts["legacy"] or not counts["ends"]:
                return None
            dates = io.partition_dates(staging)
            result = BatchResult(
                events=int(counts["ends"]),
                finished_jobs=int(counts["final"]),
                open_jobs=None,
                dates=dates,
            )
            stored_jobs = bool(io.existing_dates(self.out / "jobs", dates))
            io.move_partitions(staging, self.out / "jobs")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if dates:
            self._write_metrics(dates, dedupe=stored_jobs)
        if dates and self.config.update_db:
            result.db_rows = self._update_db(dates)
        self._end_final_batch(batch, old_open)
        return result

    def _process_full(self, events: DataFrame, batch: int, old_open: str) -> BatchResult:
        """The full path; saves the checkpoint's open jobs.

        The trace is read once: each event becomes a partial (longs, string
        hashes and the job id; ``transforms.event_partials``), the partials are
        hash-partitioned by job and merged into one row per job x attempt, which
        is cached (a few columns of longs, about one row per job); the strings'
        dictionary is observed during that same pass. The jobs (one more merge,
        within each partition: no shuffle), the attempts and the jobs left open
        all come from that cache; the metrics are computed from the fact tables
        once this batch's rows are appended (read back by date, a few columns)."""
        events = events.select(*transforms.FACT_COLUMNS)
        strings = Observation(f"strings-{batch}-{uuid.uuid4().hex}")
        partials = transforms.event_partials(
            events.observe(strings, *transforms.string_observations())
        )
        carried_words: list[str] = []
        if old_open and (self.out / old_open).is_dir():
            carried = self.spark.read.parquet(str(self.out / old_open))
            if "event" in carried.columns:
                # Saved by an earlier version: the open jobs' events.
                carried = carried.select(*transforms.FACT_COLUMNS)
                carried_words = transforms.string_values(carried)
                carried_partials = transforms.event_partials(carried, new=False)
            else:
                carried_words = transforms.carried_strings(carried)
                carried_partials = transforms.carried_partials(carried)
            partials = partials.unionByName(carried_partials)
        # Every partial of a job in one partition: the job merge needs no shuffle.
        partials = partials.repartition("job")
        dates = Observation(f"dates-{batch}-{uuid.uuid4().hex}")
        attempts = transforms.merge_partials(partials, ["job", "a"])
        attempts = attempts.observe(dates, transforms.attempt_dates()).persist(CACHE_LEVEL)
        try:
            return self._process(attempts, strings, dates, carried_words, batch, old_open)
        finally:
            attempts.unpersist()

    def _process(
        self,
        attempt_partials: DataFrame,
        strings: Observation,
        dates: Observation,
        carried_words: list[str],
        batch: int,
        old_open: str,
    ) -> BatchResult:
        codes = transforms.merge_partials(attempt_partials, ["job"])
        finished = transforms.is_finished(codes)
        # The first action: it parses the trace, merges the partials into the
        # cache and observes the strings and the attempts' dates.
        summary = codes.agg(
            F.sum("events").alias("n"),
            F.max("last").alias("max_code"),
            F.count(F.when(finished, 1)).alias("finished"),
            F.count(F.lit(1)).alias("jobs"),
            F.collect_set(F.when(finished, transforms.date_of(F.col("last")))).alias("dates"),
        ).first()
        assert summary is not None
        result = BatchResult(events=int(summary["n"] or 0))
        if not result.events:
            return result
        words = [w for values in strings.get.values() for w in values or ()]
        dictionary = transforms.Dictionary(self.spark, [*words, *carried_words])
        result.finished_jobs = int(summary["finished"])
        result.open_jobs = int(summary["jobs"]) - result.finished_jobs
        result.dates = sorted({*summary["dates"], *(dates.get.get("dates") or ())})
        new_open = ""
        if result.open_jobs:
            max_ts = int(summary["max_code"]) >> transforms.TS_SHIFT
            cutoff = (max_ts - int(self.config.open_job_ttl * 1_000_000)) << transforms.TS_SHIFT
            still_open = codes.where(~finished & (F.col("last") >= cutoff))
            new_open = f"_open/batch-{batch}"
            carry = transforms.carry_partials(still_open, dictionary)
            carry.coalesce(1).write.mode("overwrite").parquet(str(self.out / new_open))
        # Jobs of these dates stored by an earlier batch: some may be there twice
        # once this batch's are appended (finished again, or a batch redone).
        stored_jobs = bool(io.existing_dates(self.out / "jobs", result.dates))
        jobs = transforms.decode_jobs(codes.where(finished), dictionary)
        io.append(jobs, self.out / "jobs", unique="job")
        io.append(transforms.decode_attempts(attempt_partials, dictionary), self.out / "attempts")
        if result.dates:
            self._write_metrics(result.dates, dedupe=stored_jobs)
        if result.dates and self.config.update_db:
            result.db_rows = self._update_db(result.dates)
        with self._lock:
            self.checkpoint.batch = batch
            self.checkpoint.open_dir = new_open
            self.checkpoint.save()
        if old_open and old_open != new_open:
            shutil.rmtree(self.out / old_open, ignore_errors=True)
        return result

    def recompute(self, dates: list[dt.date]) -> dict[str, int]:
        """Recompute and overwrite the metric tables (and models) for ``dates`` from
        the stored ``jobs/`` and ``attempts/`` tables."""
        self._write_metrics(dates, dedupe=True)
        if not self.config.update_db:
            return {}
        return self._update_db(dates)

    def _write_metrics(self, dates: list[dt.date], dedupe: bool) -> None:
        """The metric tables for ``dates``, from the stored facts of those dates.
        ``dedupe``: the jobs table may hold a job twice (a job finished again by a
        later batch, a batch appended twice): keep each job's latest row."""
        jobs = io.read_dates(self.spark, self.out / "jobs", dates, merge_schema=True)
        stored_attempts = io.read_dates(self.spark, self.out / "attempts", dates)
        frames: dict[str, DataFrame] = {}
        reused: DataFrame | None = None
        if jobs is not None:
            if dedupe:
                jobs = reused = transforms.dedupe_jobs(jobs).persist()
            frames["task_minute"] = transforms.task_minute_metrics(jobs)
            frames["queue_minute"] = transforms.queue_minute_metrics(jobs)
            frames["failures"] = transforms.failures_by_error(jobs)
            frames["slowest_tasks"] = transforms.slowest_tasks(jobs, self.config.slowest_limit)
        attempts = transforms.all_attempts(jobs, stored_attempts)
        if attempts is not None:
            frames["jm_minute"] = transforms.jm_minute_metrics(attempts)
        try:
            for name, df in frames.items():
                # A few thousand rows a day: one file per date.
                io.overwrite_dates(df.coalesce(1), self.out / name)
        finally:
            if reused is not None:
                reused.unpersist()

    def _update_db(self, dates: list[dt.date]) -> dict[str, int]:
        """The models' rows of ``dates``, read from the metric tables."""
        rows: dict[str, Any] = {}
        for table in _DB_TABLES:
            df = io.read_dates(self.spark, self.out / table, dates)
            if df is not None:
                df = df.withColumn("minute", F.unix_micros("minute")).drop("date")
                rows[table] = (r.asDict() for r in df.toLocalIterator())
        return self._store_rows(dates, rows)

    def _store_rows(self, dates: list[dt.date], tables: dict[str, Any]) -> dict[str, int]:
        """Replace the models' rows of ``dates`` with ``tables``' rows (dicts, minute
        in µs), table by table; a table not in ``tables`` is left alone."""
        from emq_django.analytics import store
        from emq_django.analytics.models import (
            FailureMetric,
            JobManagerMetric,
            QueueMetric,
            TaskMetric,
        )

        targets: list[tuple[str, Any, Any]] = [
            ("queue_minute", QueueMetric, store.queue_metric),
            ("task_minute", TaskMetric, store.task_metric),
            ("jm_minute", JobManagerMetric, store.jm_metric),
            ("failures", FailureMetric, store.failure_metric),
        ]
        written = {}
        for table, model, build in targets:
            if table not in tables:
                continue
            objects = (build(r) for r in tables[table])
            written[table] = store.replace_dates(model, dates, objects)
        return written

    # ---- follow (Structured Streaming) -----------------------------------------

    def follow(self, interval: float, stop: threading.Event) -> None:
        """Stage new trace bytes into ``_inbox`` every ``interval`` s; a streaming
        query processes each new inbox file once (its own checkpoint in ``_stream``)."""
        inbox = self.out / "_inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        io.tune_partitions(self.spark, 0)  # micro-batches are small
        stream = (
            self.spark.readStream.schema(transforms.EVENT_SCHEMA)
            .option("cleanSource", "delete")
            .option("maxFilesPerTrigger", 64)
            .json(str(inbox))
        )
        query = (
            stream.writeStream.foreachBatch(self._micro_batch)
            .option("checkpointLocation", str(self.out / "_stream"))
            .trigger(processingTime=f"{max(interval, 0.5)} seconds")
            .start()
        )
        try:
            while not stop.is_set() and query.isActive:
                sources = self.checkpoint.plan(
                    self.config.trace_dir, self.config.since, self.config.until
                )
                if sources:
                    stage_all(sources, inbox)
                    with self._lock:
                        self.checkpoint.commit(sources)
                        self.checkpoint.save()
                stop.wait(interval)
            error = query.exception()
            if error is not None:
                raise RuntimeError(f"the streaming query failed: {error}")
        finally:
            query.stop()

    def _micro_batch(self, df: DataFrame, batch_id: int) -> None:
        result = self.process(transforms.clean_events(df))
        if result.events:
            log.info("micro-batch %d: %s", batch_id, result.describe())
