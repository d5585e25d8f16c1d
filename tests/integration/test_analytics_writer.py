"""The fact tables' Parquet writer (``io.fact_writer``): what it writes reads back the
same, next to files an earlier writer made, and its options reach the files."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from emq_django.analytics import io, transforms  # noqa: E402
from emq_django.analytics.synth import SynthConfig, TaskProfile, generate, write_trace  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROFILES = (
    TaskProfile("app.fast", "default", 5, 0.001, 0.5, 0.05, ("ValueError", "KeyError")),
    TaskProfile("app.mail", "email", 3, 0.05, 0.8, 0.2, ("ConnectionError",), 2, 0.4, 0.5),
    TaskProfile(None, "legacy", 1, 0.02, 0.5, 0.1, ("Exception",)),
)


@pytest.fixture(scope="module")
def jobs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> DataFrame:
    """The final path's job facts of a synthetic trace across two dates."""
    trace = tmp_path_factory.mktemp("trace")
    # 23:58 UTC: the jobs finish on both sides of midnight
    cfg = SynthConfig(jobs=800, start=1_772_409_480.0, rate=4.0, seed=3, profiles=PROFILES)
    write_trace(generate(cfg), trace)
    events = io.read_events(spark, sorted(trace.glob("trace-*.jsonl")))
    facts = transforms.final_job_facts(events.select(*transforms.END_COLUMNS))
    return facts.persist()


def footers(spark: SparkSession, table: Path) -> dict[str, list[bool]]:
    """Column -> whether each of its chunks (in every file of ``table``) has a
    dictionary page, read from the Parquet footers by the JVM's parquet-mr."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    out: dict[str, list[bool]] = {}
    files = sorted(table.rglob("*.parquet"))
    assert files
    for f in files:
        path = jvm.org.apache.hadoop.fs.Path(str(f))
        footer = jvm.org.apache.parquet.hadoop.ParquetFileReader.readFooter(conf, path)
        for block in footer.getBlocks():
            for chunk in block.getColumns():
                out.setdefault(chunk.getPath().toDotString(), []).append(chunk.hasDictionaryPage())
    return out


def same_rows(a: DataFrame, b: DataFrame) -> bool:
    cols = sorted(a.columns)
    a, b = a.select(*cols), b.select(*cols)
    return a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()


def test_fact_tables_read_back_what_was_written(
    spark: SparkSession, jobs: DataFrame, tmp_path: Path
):
    table = tmp_path / "jobs"
    io.write_dates(jobs, table, unique="job")
    dates = io.partition_dates(table)
    assert len(dates) == 2  # both sides of midnight
    back = io.read_dates(spark, table, dates, merge_schema=True)
    assert back is not None
    assert back.count() == jobs.count() > 700
    assert same_rows(back, jobs)
    assert dict(back.dtypes) == dict(jobs.dtypes)


TIME_COLUMNS = ("wait_us", "run_us", "e2e_us", "enqueued_ts", "finished_ts", "last_ts")


def test_time_columns_and_job_ids_get_no_dictionary_and_the_rest_keep_theirs(
    spark: SparkSession, jobs: DataFrame, tmp_path: Path
):
    """parquet-mr drops a dictionary that saves nothing (distinct values) once it
    is built; here the values repeat, so only the writer's options keep it away."""
    repeating = jobs.withColumns(
        {c: F.col(c) % 3 for c in TIME_COLUMNS} | {"job": F.substring("job", 1, 2)}
    )
    table = tmp_path / "jobs"
    io.write_dates(repeating, table, unique="job")
    chunks = footers(spark, table)
    for column in ("job", *TIME_COLUMNS):
        assert not any(chunks[column]), column
    for column in ("queue", "task", "outcome", "attempts", "events", "minute"):
        assert all(chunks[column]), column
    # the writer without these options gives the same columns a dictionary
    plain = tmp_path / "plain"
    repeating.write.partitionBy("date").parquet(str(plain))
    chunks = footers(spark, plain)
    for column in ("job", *TIME_COLUMNS):
        assert all(chunks[column]), column
    back = io.read_dates(spark, table, io.partition_dates(table))
    assert back is not None and same_rows(back, repeating)


def test_a_table_with_an_earlier_writers_files_reads_with_the_new_ones(
    spark: SparkSession, jobs: DataFrame, tmp_path: Path
):
    """Files of the earlier writer (default options, and no ``final_line`` as the
    full path writes) and of this one, appended to one table: every row, once."""
    table = tmp_path / "jobs"
    old = jobs.where(F.col("outcome") == "succeeded").drop("final_line")
    new = jobs.where(F.col("outcome") != "succeeded")
    old.write.mode("append").partitionBy("date").parquet(str(table))
    io.append(new, table, unique="job")
    back = io.read_dates(spark, table, io.partition_dates(table), merge_schema=True)
    assert back is not None
    assert back.count() == jobs.count()
    assert back.where(F.col("final_line").isNull()).count() == old.count() > 0
    want = old.withColumn("final_line", F.lit(None).cast("boolean")).unionByName(new)
    assert same_rows(back, want)
