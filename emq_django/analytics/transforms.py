"""Pure DataFrame -> DataFrame transforms over trace events (docs/trace-format.md).

Times stay in microseconds here; ``minute`` is the UTC minute of a job's final
event (a timestamp truncated to the minute) and ``date`` its UTC date, the
partition key of every output. Null tasks become ``""``.

- ``job_facts(events)``: one row per job with its outcome (null while open).
- ``attempt_facts(events)``: one row per finished attempt (for utilisation).
- ``task_minute_metrics`` / ``queue_minute_metrics(jobs)``: counts, throughput,
  p50/p95/p99 of wait, run and end-to-end time per queue (x task) x minute.
- ``jm_minute_metrics(attempts)``: busy time and utilisation per job manager x minute.
- ``failures_by_error(jobs)``: failed jobs per queue x task x error x minute.
- ``slowest_tasks(jobs, limit)``: per date, the tasks with the highest p95 run time.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from emq_django.analytics.schema import (
    DEAD_LETTERED,
    ENQUEUED,
    EVENT_RANK,
    FINAL_EVENTS,
    FINISH_EVENTS,
    LATENCIES,
    PERCENTILE_NAMES,
    PERCENTILES,
    REQUEUED,
    RETRIED,
    SUCCEEDED,
    TIMED_OUT,
)

EVENT_SCHEMA = StructType(
    [
        StructField("ts", LongType()),
        StructField("event", StringType()),
        StructField("job", StringType()),
        StructField("attempt", IntegerType()),
        StructField("task", StringType()),
        StructField("queue", StringType()),
        StructField("jm", StringType()),
        StructField("wait_us", LongType()),
        StructField("run_us", LongType()),
        StructField("total_us", LongType()),
        StructField("error", StringType()),
        StructField("delay_us", LongType()),
    ]
)
EVENT_COLUMNS = [f.name for f in EVENT_SCHEMA.fields]


def clean_events(raw: DataFrame) -> DataFrame:
    """Drop lines that are not events (malformed JSON, no job, no time, unknown kind)."""
    return raw.select(*EVENT_COLUMNS).where(
        F.col("ts").isNotNull() & F.col("job").isNotNull() & F.col("event").isin(list(EVENT_RANK))
    )


def _minute(ts_us: Column) -> Column:
    return F.date_trunc("minute", F.timestamp_micros(ts_us))


def _rank() -> Column:
    rank = F.lit(None).cast("int")
    for name, value in EVENT_RANK.items():
        rank = F.when(F.col("event") == name, F.lit(value)).otherwise(rank)
    return rank


def _order(*extra: str) -> Column:
    """Sort key of an event within its job: time, attempt, then the kind's rank."""
    return F.struct(
        F.col("ts").alias("ts"),
        F.coalesce(F.col("attempt"), F.lit(0)).alias("attempt"),
        _rank().alias("rank"),
        *[F.col(c).alias(c) for c in extra],
    )


def job_facts(events: DataFrame) -> DataFrame:
    """One row per job id.

    ``outcome`` is the final event (succeeded, failed, timed_out, dead_lettered),
    or null while the job is still open (its last event is anything else).
    ``run_us`` and ``e2e_us`` come from the last finished attempt; ``wait_us`` is
    ``e2e_us - run_us``: that attempt's dispatch minus the enqueue, which is the
    ``wait_us`` the broker wrote on that dispatch (so it needs no other event).
    """
    is_finish = F.col("event").isin(list(FINISH_EVENTS))
    grouped = events.groupBy("job").agg(
        F.max(_order("event")).alias("_last"),
        F.max(F.when(is_finish, _order("run_us", "total_us", "jm", "error"))).alias("_fin"),
        F.max(F.when(F.col("event") == DEAD_LETTERED, _order("error"))).alias("_dead"),
        F.max("queue").alias("queue"),
        F.max("task").alias("task"),
        F.max("attempt").alias("attempts"),
        F.sum(F.when(F.col("event") == RETRIED, 1).otherwise(0)).alias("retries"),
        F.sum(F.when(F.col("event") == REQUEUED, 1).otherwise(0)).alias("requeues"),
        F.min(F.when(F.col("event") == ENQUEUED, F.col("ts"))).alias("enqueued_ts"),
        F.max("ts").alias("last_ts"),
        F.count(F.lit(1)).alias("events"),
    )
    last_event = F.col("_last.event")
    finished = last_event.isin(list(FINAL_EVENTS))
    outcome = F.when(finished, last_event)
    error = (
        F.when(outcome == DEAD_LETTERED, F.coalesce(F.col("_dead.error"), F.col("_fin.error")))
        .when(outcome == SUCCEEDED, F.lit(None).cast("string"))
        .otherwise(F.col("_fin.error"))
    )
    finished_ts = F.when(finished, F.col("_last.ts"))
    return grouped.select(
        "job",
        "queue",
        F.coalesce(F.col("task"), F.lit("")).alias("task"),
        F.col("_fin.jm").alias("jm"),
        outcome.alias("outcome"),
        error.alias("error"),
        F.coalesce(F.col("attempts"), F.lit(0)).alias("attempts"),
        F.col("retries").cast("int").alias("retries"),
        F.col("requeues").cast("int").alias("requeues"),
        (F.col("_fin.total_us") - F.col("_fin.run_us")).alias("wait_us"),
        F.col("_fin.run_us").alias("run_us"),
        F.col("_fin.total_us").alias("e2e_us"),
        "enqueued_ts",
        finished_ts.alias("finished_ts"),
        "last_ts",
        "events",
        _minute(finished_ts).alias("minute"),
        F.to_date(_minute(finished_ts)).alias("date"),
    )


def attempt_facts(events: DataFrame) -> DataFrame:
    """One row per finished attempt (succeeded, failed or timed_out event)."""
    return events.where(F.col("event").isin(list(FINISH_EVENTS))).select(
        "job",
        "attempt",
        "queue",
        F.coalesce(F.col("task"), F.lit("")).alias("task"),
        F.coalesce(F.col("jm"), F.lit("")).alias("jm"),
        F.col("event").alias("outcome"),
        "run_us",
        "ts",
        _minute(F.col("ts")).alias("minute"),
        F.to_date(_minute(F.col("ts"))).alias("date"),
    )


def dedupe_jobs(jobs: DataFrame) -> DataFrame:
    """Keep each job's latest finished row (a job reopened by a later retry)."""
    latest = Window.partitionBy("job").orderBy(F.col("finished_ts").desc(), F.col("events").desc())
    return jobs.withColumn("_n", F.row_number().over(latest)).where("_n = 1").drop("_n")


def _latency_percentiles() -> list[Column]:
    cols = []
    for name in LATENCIES:
        pcts = F.percentile(F.col(f"{name}_us"), list(PERCENTILES))
        cols.append(pcts.alias(f"_{name}"))
    return cols


def _explode_percentiles(df: DataFrame, keys: list[str]) -> DataFrame:
    out = [F.col(c) for c in df.columns if not c.startswith("_")]
    for name in LATENCIES:
        for i, pname in enumerate(PERCENTILE_NAMES):
            out.append(F.col(f"_{name}")[i].alias(f"{name}_{pname}_us"))
    return df.select(*out)


def _minute_metrics(jobs: DataFrame, keys: list[str]) -> DataFrame:
    done = jobs.where(F.col("outcome").isNotNull())
    grouped = done.groupBy(*keys, "minute", "date").agg(
        F.count(F.lit(1)).alias("jobs"),
        F.sum(F.when(F.col("outcome") == SUCCEEDED, 1).otherwise(0)).alias("succeeded"),
        F.sum(F.when(F.col("outcome") != SUCCEEDED, 1).otherwise(0)).alias("failed"),
        F.sum(F.when(F.col("outcome") == TIMED_OUT, 1).otherwise(0)).alias("timed_out"),
        F.sum(F.when(F.col("retries") > 0, 1).otherwise(0)).alias("retried"),
        (F.count(F.lit(1)) / 60.0).alias("throughput"),
        F.sum("run_us").alias("run_total_us"),
        *_latency_percentiles(),
    )
    return _explode_percentiles(grouped, keys)


def task_minute_metrics(jobs: DataFrame) -> DataFrame:
    """Per queue x task x minute: jobs, succeeded, failed (every outcome but
    succeeded), timed_out, retried (jobs with a retry), throughput (jobs / 60 s),
    run_total_us, and ``{wait,run,e2e}_{p50,p95,p99}_us`` (exact, interpolated)."""
    return _minute_metrics(jobs, ["queue", "task"])


def queue_minute_metrics(jobs: DataFrame) -> DataFrame:
    """``task_minute_metrics`` over all the tasks of each queue."""
    return _minute_metrics(jobs, ["queue"])


def jm_minute_metrics(attempts: DataFrame) -> DataFrame:
    """Per job manager x minute of finishing: attempts, succeeded, failed, busy_us
    (their run time) and utilisation = busy_us / 60 s, the mean number of busy
    worker processes in that minute (each attempt counted in its finish minute)."""
    return attempts.groupBy("jm", "minute", "date").agg(
        F.count(F.lit(1)).alias("attempts"),
        F.sum(F.when(F.col("outcome") == SUCCEEDED, 1).otherwise(0)).alias("succeeded"),
        F.sum(F.when(F.col("outcome") != SUCCEEDED, 1).otherwise(0)).alias("failed"),
        F.coalesce(F.sum("run_us"), F.lit(0)).alias("busy_us"),
        (F.coalesce(F.sum("run_us"), F.lit(0)) / 60e6).alias("utilisation"),
    )


def failures_by_error(jobs: DataFrame) -> DataFrame:
    """Per queue x task x error x minute: failed jobs (error "" when unknown)."""
    failed = jobs.where(F.col("outcome").isNotNull() & (F.col("outcome") != SUCCEEDED))
    return (
        failed.withColumn("error", F.coalesce(F.col("error"), F.lit("")))
        .groupBy("queue", "task", "error", "minute", "date")
        .agg(F.count(F.lit(1)).alias("failures"))
    )


def slowest_tasks(jobs: DataFrame, limit: int = 20) -> DataFrame:
    """Per date, the ``limit`` queue x task pairs with the highest p95 run time:
    jobs, run mean, p50/p95/p99 and max (µs), ``rank`` 1 = slowest."""
    done = jobs.where(F.col("outcome").isNotNull() & F.col("run_us").isNotNull())
    per_task = done.groupBy("date", "queue", "task").agg(
        F.count(F.lit(1)).alias("jobs"),
        F.avg("run_us").alias("run_mean_us"),
        F.percentile(F.col("run_us"), list(PERCENTILES)).alias("_run"),
        F.max("run_us").alias("run_max_us"),
    )
    ranked = per_task.select(
        "date",
        "queue",
        "task",
        "jobs",
        "run_mean_us",
        *[F.col("_run")[i].alias(f"run_{p}_us") for i, p in enumerate(PERCENTILE_NAMES)],
        "run_max_us",
    )
    order = Window.partitionBy("date").orderBy(
        F.col("run_p95_us").desc(), F.col("queue"), F.col("task")
    )
    return ranked.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= limit)
