"""Metrics from job and attempt facts: per queue (x task) x minute, per job
manager x minute, failures by error, slowest tasks. Pure DataFrame -> DataFrame."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from emq_django.analytics.schema import (
    LATENCIES,
    PERCENTILE_NAMES,
    PERCENTILE_SKETCH_K,
    PERCENTILES,
    SUCCEEDED,
    TIMED_OUT,
)


def _sketch(column: str) -> Column:
    """A KLL sketch of ``column``'s values in the group (nulls left out)."""
    return F.kll_sketch_agg_bigint(F.col(column), PERCENTILE_SKETCH_K)


def _quantiles(sketch: Column) -> Column:
    """``PERCENTILES`` of a sketch, as an array (null for a sketch of no values, as
    percentile_approx gives for a group of nulls)."""
    values = [F.kll_sketch_get_quantile_bigint(sketch, F.lit(p)) for p in PERCENTILES]
    return F.when(F.kll_sketch_get_n_bigint(sketch) > 0, F.array(*values))


def _latency_percentiles() -> list[Column]:
    return [_sketch(f"{name}_us").alias(f"_{name}") for name in LATENCIES]


def _explode_percentiles(df: DataFrame, keys: list[str]) -> DataFrame:
    out = [F.col(c) for c in df.columns if not c.startswith("_")]
    quantiles = {name: _quantiles(F.col(f"_{name}")) for name in LATENCIES}
    for name in LATENCIES:
        for i, pname in enumerate(PERCENTILE_NAMES):
            out.append(quantiles[name][i].alias(f"{name}_{pname}_us"))
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
    run_total_us, and ``{wait,run,e2e}_{p50,p95,p99}_us`` (approximate: see
    ``schema.PERCENTILE_SKETCH_K``)."""
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
        _sketch("run_us").alias("_sketch"),
        F.max("run_us").alias("run_max_us"),
    )
    run = _quantiles(F.col("_sketch"))
    ranked = per_task.select(
        "date",
        "queue",
        "task",
        "jobs",
        "run_mean_us",
        *[run[i].alias(f"run_{p}_us") for i, p in enumerate(PERCENTILE_NAMES)],
        "run_max_us",
    )
    order = Window.partitionBy("date").orderBy(
        F.col("run_p95_us").desc(), F.col("queue"), F.col("task")
    )
    return ranked.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= limit)
