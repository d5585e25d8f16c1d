"""Trace events as Spark reads them (``EVENT_SCHEMA``, ``clean_events``) and
their order codes: an event's time, kind and attempt packed in one long. Pure."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from emq_django.analytics.schema import (
    DURATIONS,
    EVENT_RANK,
    FINAL_EVENTS,
    FINISH_EVENTS,
    MAX_US,
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
        # on the lines that end an attempt, in traces of brokers since they were added
        StructField("final", BooleanType()),
        StructField("retries", IntegerType()),
        StructField("requeues", IntegerType()),
    ]
)
EVENT_COLUMNS = [f.name for f in EVENT_SCHEMA.fields]
# What the job and attempt facts of the full path read (a dispatch's wait_us is
# e2e_us - run_us, a retry's delay_us no metric uses): what it carries over.
FACT_COLUMNS = [
    c for c in EVENT_COLUMNS if c not in ("wait_us", "delay_us", "final", "retries", "requeues")
]
# What the final path reads, of the lines that end an attempt or a job.
END_COLUMNS = [*FACT_COLUMNS, "final", "retries", "requeues"]


def clean_events(raw: DataFrame) -> DataFrame:
    """Drop lines that are not events (malformed JSON, no job, no time or one out of
    range, unknown kind); a duration out of range is null (``schema.MAX_US``)."""
    ts = F.col("ts")
    durations = {d: F.when((F.col(d) > -MAX_US) & (F.col(d) < MAX_US), F.col(d)) for d in DURATIONS}
    return (
        raw.select(*EVENT_COLUMNS)
        .where(
            ts.isNotNull()
            & (ts >= 0)
            & (ts < MAX_US)
            & F.col("job").isNotNull()
            & F.col("event").isin(list(EVENT_RANK))
        )
        .withColumns(durations)
    )


def _minute(ts_us: Column) -> Column:
    return F.date_trunc("minute", F.timestamp_micros(ts_us))


# Within one job, events are ordered by (ts, attempt, rank, name): the rank of
# docs/trace-format.md, then the name (alphabetical, as the reference does) for
# the outcomes that share rank 3. That order is packed into one long, the
# *order code* ``ts << 11 | min(attempt, 63) << 5 | event code``, so that the
# per-job aggregate keeps only fixed-width buffers (longs): Spark then runs it
# as a hash aggregate, where structs or strings in the buffers force a sort of
# every event. ``ts`` fits below 2**52 µs (the year 2112).
EVENT_CODES = {
    name: rank * 4 + sum(1 for o in EVENT_RANK if EVENT_RANK[o] == rank and o < name)
    for name, rank in EVENT_RANK.items()
}
_ATTEMPT_BITS, _CODE_BITS = 6, 5


def _code_of(column: str) -> Column:
    """``column`` (an event name) -> its event code, null for unknown names."""
    code = F.lit(None).cast("long")
    for name, value in EVENT_CODES.items():
        code = F.when(F.col(column) == name, F.lit(value).cast("long")).otherwise(code)
    return code


def _name_of(code: Column) -> Column:
    """An order code -> the event name it ends with."""
    low = code.bitwiseAND((1 << _CODE_BITS) - 1)
    name = F.lit(None).cast("string")
    for event, value in EVENT_CODES.items():
        name = F.when(low == value, F.lit(event)).otherwise(name)
    return name


def _order_code() -> Column:
    attempt = F.least(F.coalesce(F.col("attempt"), F.lit(0)), F.lit((1 << _ATTEMPT_BITS) - 1))
    return (
        F.shiftleft(F.col("ts"), _ATTEMPT_BITS + _CODE_BITS)
        + F.shiftleft(attempt.cast("long"), _CODE_BITS)
        + _code_of("event")
    )


TS_SHIFT = _ATTEMPT_BITS + _CODE_BITS


def _ts_of(code: Column) -> Column:
    return F.shiftright(code, TS_SHIFT)


# Strings (queue, task, job manager, error) enter the aggregate as their 64-bit
# hash and are looked up afterwards in a small dictionary of the distinct values
# (a few hundred: queues, tasks, job managers, error types).
_STRINGS = ("queue", "task", "jm", "error")
# Up to this many strings, the look-up is a map literal in the projection; beyond
# it, a broadcast join per column.
MAP_LOOKUP_LIMIT = 1024
_FINISH_CODES = [EVENT_CODES[e] for e in FINISH_EVENTS]
_FINAL_CODES = [EVENT_CODES[e] for e in FINAL_EVENTS]


def _hash(column: str) -> Column:
    return F.when(F.col(column).isNotNull(), F.xxhash64(F.col(column)))
