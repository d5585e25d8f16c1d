"""The incremental run: new trace bytes -> job facts -> metrics -> Parquet and the DB.

One batch:
1. the checkpoint plans the new byte ranges of the trace files;
2. their events, plus the saved events of the jobs still open, become job facts;
3. the events of jobs still open are saved for the next batch (dropped once
   ``open_job_ttl`` older than the newest event: the rest of them was lost);
4. every date that received a finished job or attempt is recomputed from the
   stored ``jobs/`` and ``attempts/`` rows of that date plus this batch's (still in
   memory) and overwritten in the metric tables; then this batch's finished jobs
   and attempts are appended to ``jobs/`` and ``attempts/``, and the metric rows of
   those dates replace the Django models' rows;
5. the checkpoint records the new offsets.

The trace is parsed once per batch: its events are cached, and the job facts
(one hash aggregate), the attempts and the open jobs' events come from that cache.

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

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from emq_django.analytics import io, transforms
from emq_django.analytics.checkpoint import Checkpoint, stage, stage_all

log = logging.getLogger(__name__)

# Open jobs are usually a few (those in flight at the end of the trace): their ids
# are broadcast to pick out their events; beyond this many, Spark joins.
BROADCAST_OPEN_JOBS = 500_000

METRIC_TABLES = ("task_minute", "queue_minute", "jm_minute", "failures", "slowest_tasks")


@dataclass(frozen=True)
class AnalyzeConfig:
    trace_dir: Path
    output: Path
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    update_db: bool = True
    open_job_ttl: float = 24 * 3600.0  # seconds
    slowest_limit: int = 20


@dataclass
class BatchResult:
    sources: int = 0
    bytes: int = 0
    events: int = 0
    finished_jobs: int = 0
    open_jobs: int = 0
    dates: list[dt.date] = field(default_factory=list)
    db_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        if not self.sources and not self.events:
            return "no new trace data"
        days = ", ".join(d.isoformat() for d in self.dates) or "none"
        return (
            f"{self.events} events from {self.sources} trace ranges ({self.bytes} bytes): "
            f"{self.finished_jobs} jobs finished, {self.open_jobs} still open; "
            f"dates recomputed: {days}; in {self.seconds:.1f} s"
        )


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
        staging = self.out / "_staging" / f"batch-{self.checkpoint.batch + 1}"
        try:
            paths = stage(sources, staging)
            io.tune_partitions(self.spark, sum(s.end - s.start for s in sources))
            result = self.process(io.read_events(self.spark, paths))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        with self._lock:
            self.checkpoint.commit(sources)
            self.checkpoint.save()
        result.sources = len(sources)
        result.bytes = sum(s.end - s.start for s in sources)
        result.seconds = time.monotonic() - started
        return result

    def process(self, events: DataFrame) -> BatchResult:
        """Steps 2-4 for ``events`` (already cleaned); saves the checkpoint's open jobs.

        The events are parsed once, into a cached narrow form (``encode_events``:
        longs and the job id); the strings' dictionary is observed during that
        same pass. The job facts, the attempts and the open jobs' events all come
        from that cache, and the metrics from the job facts, not from Parquet
        written and read back in the same run."""
        cfg = self.config
        events = io.window_events(events, cfg.since, cfg.until).select(*transforms.FACT_COLUMNS)
        events = events.withColumn("_new", F.lit(True))
        with self._lock:
            batch = self.checkpoint.batch + 1
            old_open = self.checkpoint.open_dir
        all_events = events
        if old_open and (self.out / old_open).is_dir():
            carried = self.spark.read.parquet(str(self.out / old_open))
            carried = carried.select(*transforms.FACT_COLUMNS).withColumn("_new", F.lit(False))
            all_events = events.unionByName(carried)
        strings = Observation(f"strings-{batch}-{uuid.uuid4().hex}")
        observed = all_events.observe(strings, *transforms.string_observations())
        encoded = transforms.encode_events(observed).persist()
        try:
            codes = transforms.job_codes(encoded.drop("_new")).persist()
            try:
                return self._process(encoded, codes, strings, batch, old_open)
            finally:
                codes.unpersist()
        finally:
            encoded.unpersist()

    def _process(
        self,
        encoded: DataFrame,
        codes: DataFrame,
        strings: Observation,
        batch: int,
        old_open: str,
    ) -> BatchResult:
        finished_ts = F.when(transforms.is_finished(codes), F.col("_last"))
        # The first action: it parses the trace into the cache, observes the
        # strings and fills the job codes' cache.
        summary = codes.agg(
            F.sum("events").alias("n"),
            F.max("_last").alias("max_code"),
            F.count(finished_ts).alias("finished"),
            F.count(F.lit(1)).alias("jobs"),
        ).first()
        assert summary is not None
        result = BatchResult(events=int(summary["n"] or 0))
        if not result.events:
            return result
        words = [w for values in strings.get.values() for w in values or ()]
        dictionary = transforms.Dictionary(self.spark, words)
        result.finished_jobs = int(summary["finished"])
        result.open_jobs = int(summary["jobs"]) - result.finished_jobs
        new_open = ""
        if result.open_jobs:
            max_ts = int(summary["max_code"]) >> transforms.TS_SHIFT
            cutoff = (max_ts - int(self.config.open_job_ttl * 1_000_000)) << transforms.TS_SHIFT
            still_open = codes.where(~transforms.is_finished(codes) & (F.col("_last") >= cutoff))
            open_ids = still_open.select("job")
            if result.open_jobs <= BROADCAST_OPEN_JOBS:
                open_ids = F.broadcast(open_ids)
            new_open = f"_open/batch-{batch}"
            open_events = encoded.join(open_ids, "job", "left_semi")
            open_events = transforms.decode_events(open_events, dictionary)
            open_events.coalesce(1).write.mode("overwrite").parquet(str(self.out / new_open))
        # Decoded once: the metrics and the append each read these two caches.
        finished = transforms.decode_jobs(codes.where(transforms.is_finished(codes)), dictionary)
        finished = finished.persist()
        new_events = encoded.where(F.col("_new")).drop("_new")
        attempts = transforms.encoded_attempt_facts(new_events, dictionary).persist()
        try:
            # Dates of finished jobs and of attempts; this fills both caches.
            dated = finished.select("date").union(attempts.select("date")).distinct()
            result.dates = sorted(r["date"] for r in dated.collect() if r["date"] is not None)
            if result.dates:
                self._write_metrics(result.dates, finished, attempts)
            io.append(finished, self.out / "jobs", unique="job")
            io.append(attempts, self.out / "attempts", unique="job")
        finally:
            attempts.unpersist()
            finished.unpersist()
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
        self._write_metrics(dates, None, None)
        if not self.config.update_db:
            return {}
        return self._update_db(dates)

    def _write_metrics(
        self, dates: list[dt.date], new_jobs: DataFrame | None, new_attempts: DataFrame | None
    ) -> None:
        """The metric tables for ``dates``: the stored facts of those dates plus
        ``new_jobs`` / ``new_attempts`` (this batch's, not stored yet)."""
        jobs = _union(io.read_dates(self.spark, self.out / "jobs", dates), new_jobs)
        attempts = _union(io.read_dates(self.spark, self.out / "attempts", dates), new_attempts)
        frames: dict[str, DataFrame] = {}
        reused: DataFrame | None = None
        if jobs is not None:
            if new_jobs is None or jobs is not new_jobs:
                # Stored rows: a job finished again by a later batch is there twice.
                jobs = reused = transforms.dedupe_jobs(jobs).persist()
            frames["task_minute"] = transforms.task_minute_metrics(jobs)
            frames["queue_minute"] = transforms.queue_minute_metrics(jobs)
            frames["failures"] = transforms.failures_by_error(jobs)
            frames["slowest_tasks"] = transforms.slowest_tasks(jobs, self.config.slowest_limit)
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
            df = io.read_dates(self.spark, self.out / table, dates)
            if df is None:
                continue
            rows = df.withColumn("minute", F.unix_micros("minute")).drop("date")
            objects = (build(r.asDict()) for r in rows.toLocalIterator())
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


def _union(stored: DataFrame | None, new: DataFrame | None) -> DataFrame | None:
    if stored is None or new is None:
        return new if stored is None else stored
    return stored.unionByName(new.select(*stored.columns))
