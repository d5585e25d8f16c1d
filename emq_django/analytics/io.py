"""Reading the trace, reading and writing the Parquet tables, the Spark session.

Output layout (every table partitioned by ``date``, the UTC date of its minute):

- ``jobs/``, ``attempts/``: facts, appended once per batch (the final path's
  job rows have ``final_line`` and their attempts are derived from them, not
  stored in ``attempts/``, which has no job id column);
- ``task_minute/``, ``queue_minute/``, ``jm_minute/``, ``failures/``,
  ``slowest_tasks/``: metrics, the dates a batch touched recomputed and
  overwritten (dynamic partition overwrite);
- ``_open/batch-N/``: the jobs still open after batch N, one merged row each
  (``transforms.carry_partials``; an earlier version kept their events, which a
  later batch still reads);
- ``_checkpoint.json``: see ``checkpoint``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F

from emq_django.analytics.transforms import EVENT_SCHEMA, clean_events

DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.ui.showConsoleProgress": "false",
    # the percentile sketches run in an object hash aggregate, which Spark turns into a
    # sort of every row beyond 128 groups per task; a day has a few thousand
    # queue x task x minute groups, and their sketches together hold no more than
    # the task's own values.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
    # adaptive execution: shuffle partitions coalesced to what the data needs
    "spark.sql.adaptive.enabled": "true",
    # The tables are partitioned by date and a batch holds a few dates: a writer
    # per date, rather than a sort of every row by date before writing (which
    # Spark plans by default); beyond this many dates in one task, it sorts.
    "spark.sql.optimizer.plannedWrite.enabled": "false",
    "spark.sql.maxConcurrentOutputFileWriters": "8",
}


LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
LOCAL_GC_OPTIONS = "-XX:+UseParallelGC"


def java_options(master: str, log_level: str = "ERROR") -> str:
    """The driver JVM's options (``spark.driver.extraJavaOptions``) for ``master``."""
    options = (
        f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} -Demq.spark.level={log_level.lower()}"
    )
    if master.startswith("local"):
        # The driver runs the tasks, a batch job: the throughput (parallel)
        # collector, which does no concurrent marking beside them, not G1 (the
        # JVM's default, tuned for short pauses).
        options += " " + LOCAL_GC_OPTIONS
    return options


def build_session(
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "emq_analyze",
    log_level: str = "ERROR",
) -> SparkSession:
    """A SparkSession on ``master`` (``local[*]``, ``spark://host:port``, ...) whose
    driver logs at ``log_level`` (ERROR, WARN, INFO) from its start, so a local run
    prints none of Spark's start-up warnings."""
    settings = {
        "spark.driver.extraJavaOptions": java_options(master, log_level),
        **DEFAULT_CONF,
        **(conf or {}),
    }
    if master.startswith("local"):
        # The final path's pass runs in Python workers (endpass): this interpreter,
        # which has pyarrow, rather than whatever "python3" is first on the PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


# Shuffle partitions per byte of trace read in one batch (unless the session was
# given spark.sql.shuffle.partitions): Spark's default of 200 is far too many for
# a local[2] run over a few MB, and 8 too few for gigabytes.
BYTES_PER_PARTITION = 128 << 20
MAX_PARTITIONS = 200


def tune_partitions(spark: SparkSession, trace_bytes: int) -> None:
    """Shuffle partitions for a batch of ``trace_bytes``: one per 128 MB, at least
    the default parallelism; left alone when the session's conf sets them."""
    key = "spark.sql.shuffle.partitions"
    if spark.sparkContext.getConf().contains(key):
        return
    floor = spark.sparkContext.defaultParallelism
    wanted = max(floor, min(MAX_PARTITIONS, -(-trace_bytes // BYTES_PER_PARTITION)))
    spark.conf.set(key, str(wanted))


def read_events(spark: SparkSession, paths: Sequence[Path | str]) -> DataFrame:
    """Trace events from JSON-lines files; malformed lines are dropped."""
    raw = spark.read.schema(EVENT_SCHEMA).option("mode", "PERMISSIVE").json([str(p) for p in paths])
    return clean_events(raw)


def window_events(
    events: DataFrame, since: dt.datetime | None, until: dt.datetime | None
) -> DataFrame:
    if since is not None:
        events = events.where(F.col("ts") >= int(since.timestamp() * 1_000_000))
    if until is not None:
        events = events.where(F.col("ts") < int(until.timestamp() * 1_000_000))
    return events


def table_exists(path: Path) -> bool:
    return path.is_dir() and any(p.name.startswith("date=") for p in path.iterdir())


def existing_dates(path: Path, dates: Iterable[dt.date]) -> list[dt.date]:
    """Those of ``dates`` that the date-partitioned table at ``path`` has."""
    return [d for d in dates if (path / f"date={d.isoformat()}").is_dir()]


def read_dates(
    spark: SparkSession, path: Path, dates: Iterable[dt.date], merge_schema: bool = False
) -> DataFrame | None:
    """Rows of a date-partitioned table for ``dates`` (partition pruning), or None.
    ``merge_schema``: the files may differ in columns (one added later): the union."""
    wanted = existing_dates(path, dates)
    if not wanted:
        return None
    reader = spark.read.option("basePath", str(path))
    if merge_schema:
        reader = reader.option("mergeSchema", "true")
    df = reader.parquet(*[str(path / f"date={d.isoformat()}") for d in wanted])
    return df


# Parquet writer options of the fact tables (``jobs/``, ``attempts/``), the
# largest writes of a batch (3.26M job rows at 10M events). Page checksums and
# the size statistics (parquet 1.15+: histograms per page for query planners)
# are written by default and read by nobody here; the time columns (µs, nearly
# every value distinct) get no dictionary, which parquet-mr would fill up to its
# page size for every column chunk and then drop. Readers see the same columns
# and types; files written before still read the same.
FACT_WRITER_OPTIONS = {
    "parquet.page.write-checksum.enabled": "false",
    "parquet.size.statistics.enabled": "false",
}


def _no_dictionary(column: str) -> bool:
    """A fact column whose values (nearly) never repeat: a time in µs."""
    return column in ("ts", "job") or column.endswith(("_us", "_ts"))


def fact_writer(df: DataFrame, mode: str, unique: str | None = None) -> DataFrameWriter:
    """A writer of ``df`` as a fact table partitioned by ``date`` (see
    ``FACT_WRITER_OPTIONS``). ``unique``: one more column whose values (nearly)
    never repeat, such as job ids, written without a Parquet dictionary."""
    writer = df.write.mode(mode).partitionBy("date").options(**FACT_WRITER_OPTIONS)
    for column in df.columns:
        if column == unique or _no_dictionary(column):
            writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    return writer


def append(df: DataFrame, path: Path, unique: str | None = None) -> None:
    """Append ``df`` to the date-partitioned fact table at ``path`` (``unique`` as in
    ``fact_writer``)."""
    fact_writer(df, "append", unique).parquet(str(path))


def write_dates(df: DataFrame, path: Path, unique: str | None = None) -> None:
    """``df`` as a new date-partitioned fact table at ``path`` (``unique`` as in
    ``fact_writer``)."""
    fact_writer(df, "overwrite", unique).parquet(str(path))


def partition_dates(path: Path) -> list[dt.date]:
    """The dates of a date-partitioned table's partitions (none if no table)."""
    if not path.is_dir():
        return []
    prefix = "date="
    return sorted(
        dt.date.fromisoformat(p.name[len(prefix) :])
        for p in path.iterdir()
        if p.is_dir() and p.name.startswith(prefix)
    )


def move_partitions(source: Path, target: Path) -> None:
    """Append the table at ``source`` to the one at ``target`` (the same columns
    and partitioning) by moving its data files: names unique per write."""
    for part in source.iterdir():
        if not (part.is_dir() and part.name.startswith("date=")):
            continue
        into = target / part.name
        into.mkdir(parents=True, exist_ok=True)
        for f in part.iterdir():
            if not f.name.startswith((".", "_")):
                f.rename(into / f.name)


def overwrite_dates(df: DataFrame, path: Path) -> None:
    """Replace the date partitions present in ``df``; other dates stay."""
    df.write.mode("overwrite").partitionBy("date").parquet(str(path))
