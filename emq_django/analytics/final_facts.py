"""The final path: job and attempt facts as projections of the lines that end a
job (``final_job_facts``). Pure DataFrame -> DataFrame."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from emq_django.analytics.schema import (
    DEAD_LETTERED,
    FINAL_EVENTS,
    SUCCEEDED,
    TIMED_OUT,
)

# ---- the final path: facts from the lines that end a job ---------------------
#
# Since the broker writes ``final`` (docs/trace-format.md), the line that ends a
# job holds all of its facts: its outcome, the last attempt's times, job manager
# and error, the attempt number and the job's retries and requeues. Job facts
# are then a projection of those lines, with no shuffle and nothing carried from
# one batch to the next. Each attempt end is a job's final line or the failure
# just before a dead letter (whose line repeats its times), so the attempt facts
# are a projection of the job facts: such job rows say so (``final_line``) and
# their attempts are not stored again in ``attempts/``.


def final_job_facts(ends: DataFrame) -> DataFrame:
    """The lines that end a job (``final`` true) -> job facts, the columns of
    ``job_facts``. ``enqueued_ts`` is the line's time minus ``total_us`` (the
    broker's clock, rounded to the µs: within 1 µs of the ``enqueued`` line's);
    ``events`` is what the broker wrote for such a job: ``enqueued``, a
    ``dispatched`` and an end (``requeued``, ``retried`` or the outcome) per
    attempt, and the dead letter."""
    done = ends.where(F.col("final") & F.col("event").isin(list(FINAL_EVENTS)))
    outcome = F.col("event")
    ts = F.col("ts")
    attempts = F.coalesce(F.col("attempt"), F.lit(0))
    retries = F.coalesce(F.col("retries"), F.lit(0))
    requeues = F.coalesce(F.col("requeues"), F.lit(0))
    dead = (outcome == DEAD_LETTERED).cast("int")
    events = F.lit(2) + attempts + retries + requeues + dead
    # the UTC minute and date by arithmetic (as _minute and to_date give them in a
    # UTC session, without a time zone's rules for every line)
    minute = F.timestamp_micros(ts - F.pmod(ts, F.lit(60_000_000)))
    day = F.date_from_unix_date(F.floor(ts / F.lit(86_400_000_000)).cast("int"))
    return done.select(
        "job",
        "queue",
        F.coalesce(F.col("task"), F.lit("")).alias("task"),
        "jm",
        outcome.alias("outcome"),
        F.when(outcome != SUCCEEDED, F.col("error")).alias("error"),
        attempts.alias("attempts"),
        retries.alias("retries"),
        requeues.alias("requeues"),
        (F.col("total_us") - F.col("run_us")).alias("wait_us"),
        "run_us",
        F.col("total_us").alias("e2e_us"),
        (ts - F.col("total_us")).alias("enqueued_ts"),
        ts.alias("finished_ts"),
        ts.alias("last_ts"),
        events.cast("long").alias("events"),
        minute.alias("minute"),
        F.lit(True).alias("final_line"),
        day.alias("date"),
    )


def final_attempt_facts(jobs: DataFrame) -> DataFrame:
    """Job facts of the final path (``final_line``) -> the attempt facts of the same
    lines, the columns of ``attempt_facts``: one per job, its last attempt (a
    dead-lettered job's ended as ``timed_out`` when its error is
    ``TimeoutError``, as the broker names it, else ``failed``)."""
    outcome = F.col("outcome")
    attempt_outcome = F.when(
        outcome == DEAD_LETTERED,
        F.when(F.col("error") == "TimeoutError", F.lit(TIMED_OUT)).otherwise(F.lit("failed")),
    ).otherwise(outcome)
    return jobs.select(
        F.col("attempts").alias("attempt"),
        "queue",
        "task",
        F.coalesce(F.col("jm"), F.lit("")).alias("jm"),
        attempt_outcome.alias("outcome"),
        "run_us",
        F.col("finished_ts").alias("ts"),
        "minute",
        "date",
    )


def all_attempts(jobs: DataFrame | None, attempts: DataFrame | None) -> DataFrame | None:
    """The attempt facts of stored rows: ``attempts/`` and those of the job rows
    made from final lines (``final_line``; a table from before it has none)."""
    if jobs is not None and "final_line" in jobs.columns:
        derived = final_attempt_facts(jobs.where(F.col("final_line")))
        if attempts is None:
            return derived
        return attempts.select(*derived.columns).unionByName(derived)
    return attempts


def end_observations() -> list[Column]:
    """For ``DataFrame.observe`` on the lines that end an attempt or a job: how
    many, how many are final, and how many lack ``final`` (an older broker's)."""
    return [
        F.count(F.lit(1)).alias("ends"),
        F.count(F.when(F.col("final"), 1)).alias("final"),
        F.count(F.when(F.col("final").isNull(), 1)).alias("legacy"),
    ]


def dedupe_jobs(jobs: DataFrame) -> DataFrame:
    """Keep each job's latest finished row (a job reopened by a later retry)."""
    latest = Window.partitionBy("job").orderBy(F.col("finished_ts").desc(), F.col("events").desc())
    return jobs.withColumn("_n", F.row_number().over(latest)).where("_n = 1").drop("_n")
