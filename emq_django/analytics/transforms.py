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

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession, Window
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
    DEAD_LETTERED,
    DURATIONS,
    ENQUEUED,
    EVENT_RANK,
    FINAL_EVENTS,
    FINISH_EVENTS,
    LATENCIES,
    MAX_US,
    PERCENTILE_NAMES,
    PERCENTILE_SKETCH_K,
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


# Job and attempt facts are aggregates of *partials*: rows of the same columns as
# the aggregate's result, so that events, aggregated events and the partial rows
# carried over for the jobs still open all merge with one function
# (``merge_partials``). An event is the partial of itself. Every column merges by
# max, min, sum or max_by, so merging is associative: one row per job x attempt
# (``a``: the attempt; the ``enqueued`` event, attempt 0, joins attempt 1), then
# one per job, gives the same as one row per job straight from the events.
#
# - ``last``: the order code of the last event; ``enq``: of the enqueue;
# - ``fin``: of the last attempt end (succeeded, failed, timed_out), and that
#   event's ``run``, ``total`` (µs), ``jm`` and ``ferr`` (error hash);
# - ``dead``: of the dead letter, and its error hash ``derr``;
# - ``q``, ``t``: the highest queue and task hashes; ``attempt``: the highest;
# - ``retries``, ``requeues``, ``events``: counts; ``newfin``: attempt ends read
#   in this batch (a carried partial has none: its attempts are stored already).
PARTIAL_COLUMNS = (
    "job",
    "a",
    "last",
    "enq",
    "fin",
    "run",
    "total",
    "jm",
    "ferr",
    "dead",
    "derr",
    "q",
    "t",
    "attempt",
    "retries",
    "requeues",
    "events",
    "newfin",
)
# The strings of a carried partial (``carried_partials``), by hash column.
CARRIED_STRINGS = {"q": "queue", "t": "task", "jm": "jm", "ferr": "error", "derr": "dead_error"}


def event_partials(events: DataFrame, new: bool = True) -> DataFrame:
    """Events (``FACT_COLUMNS``) -> one partial each. ``new``: events read in
    this batch (their attempt ends are this batch's attempts)."""
    code = _order_code()
    event = F.col("event")
    finish = event.isin(list(FINISH_EVENTS))
    error = _hash("error")
    return events.select(
        "job",
        F.when(event == ENQUEUED, F.lit(1)).otherwise(F.col("attempt")).alias("a"),
        code.alias("last"),
        F.when(event == ENQUEUED, code).alias("enq"),
        F.when(finish, code).alias("fin"),
        F.col("run_us").alias("run"),
        F.col("total_us").alias("total"),
        _hash("jm").alias("jm"),
        error.alias("ferr"),
        F.when(event == DEAD_LETTERED, code).alias("dead"),
        error.alias("derr"),
        _hash("queue").alias("q"),
        _hash("task").alias("t"),
        "attempt",
        (event == RETRIED).cast("long").alias("retries"),
        (event == REQUEUED).cast("long").alias("requeues"),
        F.lit(1).cast("long").alias("events"),
        (finish if new else F.lit(False)).cast("long").alias("newfin"),
    )


def merge_partials(partials: DataFrame, keys: list[str]) -> DataFrame:
    """Partials -> one partial per ``keys`` (``["job", "a"]`` or ``["job"]``): a
    hash aggregate, its buffers all longs."""
    fin, dead = F.col("fin"), F.col("dead")
    aggs = [
        F.max("last").alias("last"),
        F.min("enq").alias("enq"),
        F.max(fin).alias("fin"),
        F.max_by("run", fin).alias("run"),
        F.max_by("total", fin).alias("total"),
        F.max_by("jm", fin).alias("jm"),
        F.max_by("ferr", fin).alias("ferr"),
        F.max(dead).alias("dead"),
        F.max_by("derr", dead).alias("derr"),
        F.max("q").alias("q"),
        F.max("t").alias("t"),
        F.max("attempt").alias("attempt"),
        F.sum("retries").alias("retries"),
        F.sum("requeues").alias("requeues"),
        F.sum("events").alias("events"),
        F.sum("newfin").alias("newfin"),
    ]
    if "a" not in keys:
        aggs.insert(0, F.max("a").alias("a"))
    return partials.groupBy(*keys).agg(*aggs).select(*PARTIAL_COLUMNS)


def carried_partials(carried: DataFrame) -> DataFrame:
    """The rows ``carry_partials`` wrote back to partials (strings hashed again)."""
    hashed = {h: _hash(name) for h, name in CARRIED_STRINGS.items()}
    return (
        carried.withColumns(hashed)
        .withColumn("newfin", F.lit(0).cast("long"))
        .select(*PARTIAL_COLUMNS)
    )


def carry_partials(partials: DataFrame, dictionary: Dictionary) -> DataFrame:
    """Partials -> rows to keep for the next batch, their strings decoded (the next
    batch's dictionary need not hold them)."""
    out = dictionary.decode(partials.drop("newfin"), dict(CARRIED_STRINGS))
    return out.select(*[CARRIED_STRINGS.get(c, c) for c in PARTIAL_COLUMNS if c != "newfin"])


def carried_strings(carried: DataFrame) -> list[str]:
    """The distinct strings of carried rows (few: the jobs still open)."""
    words = carried.select(F.explode(F.array(*CARRIED_STRINGS.values())).alias("s"))
    return [r["s"] for r in words.where(F.col("s").isNotNull()).distinct().collect()]


def date_of(code: Column) -> Column:
    """An order code -> the UTC date of its time (the ``date`` of the facts)."""
    return F.to_date(F.timestamp_micros(_ts_of(code)))


def attempt_dates() -> Column:
    """For ``DataFrame.observe`` on job x attempt partials: the dates of the
    attempts that ended in this batch."""
    return F.collect_set(F.when(F.col("newfin") > 0, date_of(F.col("fin")))).alias("dates")


def string_observations() -> list[Column]:
    """Aggregates for ``DataFrame.observe`` on the events: the distinct strings of
    each column, gathered during a pass that runs anyway (no scan of their own)."""
    return [F.collect_set(c).alias(c) for c in _STRINGS]


def string_values(events: DataFrame) -> list[str]:
    """The distinct strings of ``_STRINGS`` in ``events`` (one scan)."""
    combos = events.select(*_STRINGS).distinct()
    words = combos.select(F.explode(F.array(*_STRINGS)).alias("s")).where(F.col("s").isNotNull())
    return [r["s"] for r in words.distinct().collect()]


class Dictionary:
    """Hash -> string for the hashed columns: ``decode(column)`` is a column
    expression (a map literal look-up), or, for many strings, a broadcast join."""

    def __init__(self, spark: SparkSession, words: Iterable[str]) -> None:
        unique = sorted(set(words))
        # Literals in the JVM (no Python worker, which a loaded machine is slow
        # to start): the same hash as the columns'.
        literal = (
            F.array(*[F.lit(w) for w in unique]) if unique else F.array().cast("array<string>")
        )
        self.frame = spark.range(1).select(F.explode(literal).alias("s"))
        self.frame = self.frame.select(F.xxhash64("s").alias("h"), "s")
        self.pairs = [(int(r["h"]), str(r["s"])) for r in self.frame.collect()] if unique else []
        self.small = len(self.pairs) <= MAP_LOOKUP_LIMIT

    def decode(self, df: DataFrame, columns: dict[str, str]) -> DataFrame:
        """``df`` with each hash column of ``columns`` (hash -> name) replaced by its string."""
        if self.small:
            if not self.pairs:
                lookup = F.create_map().cast("map<bigint,string>")
            else:
                lookup = F.create_map(*[x for h, s in self.pairs for x in (F.lit(h), F.lit(s))])
            exprs = {name: F.try_element_at(lookup, F.col(h)) for h, name in columns.items()}
            return df.withColumns(exprs).drop(*[h for h in columns if h not in columns.values()])
        for h, name in columns.items():
            key = h if h != name else f"_{h}_hash"
            df = df.withColumnRenamed(h, key)
            table = F.broadcast(self.frame.select(F.col("h").alias(key), F.col("s").alias(name)))
            df = df.join(table, key, "left").drop(key)
        return df


def is_finished(partials: DataFrame) -> Column:
    """On job partials: the job has its final outcome."""
    return F.col("last").bitwiseAND((1 << _CODE_BITS) - 1).isin(_FINAL_CODES)


def decode_jobs(partials: DataFrame, dictionary: Dictionary) -> DataFrame:
    """Job partials (one per job) -> job facts (see ``job_facts``)."""
    jobs = dictionary.decode(
        partials,
        {"q": "queue", "t": "task", "jm": "_jm", "ferr": "_fin_err", "derr": "_dead_err"},
    )
    last_event = _name_of(F.col("last"))
    finished = is_finished(partials)
    outcome = F.when(finished, last_event)
    error = (
        F.when(outcome == DEAD_LETTERED, F.coalesce(F.col("_dead_err"), F.col("_fin_err")))
        .when(outcome == SUCCEEDED, F.lit(None).cast("string"))
        .otherwise(F.col("_fin_err"))
    )
    finished_ts = F.when(finished, _ts_of(F.col("last")))
    return jobs.select(
        "job",
        "queue",
        F.coalesce(F.col("task"), F.lit("")).alias("task"),
        F.col("_jm").alias("jm"),
        outcome.alias("outcome"),
        error.alias("error"),
        F.coalesce(F.col("attempt"), F.lit(0)).alias("attempts"),
        F.col("retries").cast("int").alias("retries"),
        F.col("requeues").cast("int").alias("requeues"),
        (F.col("total") - F.col("run")).alias("wait_us"),
        F.col("run").alias("run_us"),
        F.col("total").alias("e2e_us"),
        _ts_of(F.col("enq")).alias("enqueued_ts"),
        finished_ts.alias("finished_ts"),
        _ts_of(F.col("last")).alias("last_ts"),
        "events",
        _minute(finished_ts).alias("minute"),
        F.to_date(_minute(finished_ts)).alias("date"),
    )


def job_facts(events: DataFrame, dictionary: Dictionary | None = None) -> DataFrame:
    """One row per job id.

    ``outcome`` is the final event (succeeded, failed, timed_out, dead_lettered),
    or null while the job is still open (its last event is anything else).
    ``run_us`` and ``e2e_us`` come from the last finished attempt; ``wait_us`` is
    ``e2e_us - run_us``: that attempt's dispatch minus the enqueue, which is the
    ``wait_us`` the broker wrote on that dispatch (so it needs no other event).
    ``queue`` and ``task``: the broker writes the same on every event of a job;
    should they differ, the one with the highest hash is taken. ``dictionary``:
    the strings of ``events`` (by default, gathered here with one scan).
    """
    if dictionary is None:
        dictionary = Dictionary(events.sparkSession, string_values(events))
    partials = event_partials(events.select(*FACT_COLUMNS))
    return decode_jobs(merge_partials(partials, ["job"]), dictionary)


def decode_attempts(partials: DataFrame, dictionary: Dictionary) -> DataFrame:
    """Job x attempt partials -> attempt facts (see ``attempt_facts``), for the
    attempts that ended in this batch."""
    done = partials.where(F.col("newfin") > 0)
    done = dictionary.decode(done, {"q": "queue", "t": "task", "jm": "_jm"})
    ts = _ts_of(F.col("fin"))
    return done.select(
        F.col("a").alias("attempt"),
        "queue",
        F.coalesce(F.col("task"), F.lit("")).alias("task"),
        F.coalesce(F.col("_jm"), F.lit("")).alias("jm"),
        _name_of(F.col("fin")).alias("outcome"),
        F.col("run").alias("run_us"),
        ts.alias("ts"),
        _minute(ts).alias("minute"),
        F.to_date(_minute(ts)).alias("date"),
    )


def attempt_facts(events: DataFrame, dictionary: Dictionary | None = None) -> DataFrame:
    """One row per finished attempt of a job (the attempt's succeeded, failed or
    timed_out event: the broker writes one; should a trace hold two, the later
    counts). ``queue`` and ``task`` as in ``job_facts``, over the attempt's events."""
    if dictionary is None:
        dictionary = Dictionary(events.sparkSession, string_values(events))
    partials = event_partials(events.select(*FACT_COLUMNS))
    return decode_attempts(merge_partials(partials, ["job", "a"]), dictionary)


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
