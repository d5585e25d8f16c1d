"""Job and attempt facts from events, through partials merged by job (the
incremental path: ``job_facts``, ``attempt_facts``, the ``Dictionary`` of hashed
strings). Pure DataFrame -> DataFrame."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from emq_django.analytics.events import (
    _CODE_BITS,
    _FINAL_CODES,
    _STRINGS,
    FACT_COLUMNS,
    MAP_LOOKUP_LIMIT,
    _hash,
    _minute,
    _name_of,
    _order_code,
    _ts_of,
)
from emq_django.analytics.schema import (
    DEAD_LETTERED,
    ENQUEUED,
    FINISH_EVENTS,
    REQUEUED,
    RETRIED,
    SUCCEEDED,
)

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
