"""The final path's pass over trace files (``analytics.endpass``): it reads what
Spark's JSON reader reads, cuts files anywhere without losing or doubling a line,
and the batch's tables equal those of the Spark transforms."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from emq_django.analytics import endpass, io, transforms  # noqa: E402
from emq_django.analytics.pipeline import AnalyzeConfig, Analyzer  # noqa: E402
from emq_django.analytics.schema import FINAL_EVENTS, PERCENTILE_SKETCH_K  # noqa: E402
from emq_django.analytics.synth import SynthConfig, TaskProfile, generate, write_trace  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

END_COLUMNS = [f.name for f in endpass.END_SCHEMA]

# Lines a broker never writes, each next to the rows Spark's reader makes of it.
ODD_LINES = [
    # the broker's own form, an end and a line that is not one
    b'{"ts":1772359200020520,"event":"succeeded","job":"j1","attempt":1,"task":"t",'
    b'"queue":"q","jm":"m","run_us":174,"total_us":6794,"final":true}',
    b'{"ts":1772359200020519,"event":"dispatched","job":"j1","attempt":1,"task":"t",'
    b'"queue":"q","jm":"m","wait_us":1}',
    # spaces, as json.dumps writes
    b'{"ts": 1772359200020521, "event": "failed", "job": "j2", "attempt": 1, "task": null, '
    b'"queue": "q", "jm": "m", "run_us": 1, "total_us": 2, "error": "E", "final": true}',
    # the event spelled with an escape
    b'{"ts":1772359200020522,"event":"succ\\u0065eded","job":"j3","attempt":1,"queue":"q",'
    b'"run_us":1,"total_us":2,"final":true}',
    b"not json",
    b"",
    b"[1,2]",
    # fields of the wrong type: null, the rest of the line kept
    b'{"ts":"1772359200020523","event":"succeeded","job":"j4","final":true}',
    b'{"ts":1772359200020524,"event":"succeeded","job":"j5","attempt":"x","final":true,'
    b'"run_us":1.5}',
    b'{"ts":1772359200020525,"event":"succeeded","job":"j6","attempt":3000000000,"final":true}',
    # a string field takes any value, as its JSON text
    b'{"ts":1772359200020526,"event":"succeeded","job":"j7","queue":5,"task":{"a":[1,2]},'
    b'"jm":true,"final":true}',
    b'{"ts":1772359200020527,"event":"succeeded","job":"j8","final":"yes","retries":true}',
    # not UTF-8
    b'{"ts":1772359200020528,"event":"succeeded","job":"j9\xff\xfe","final":true}',
    # a key twice: the last one
    b'{"ts":1772359200020529,"event":"dead_lettered","job":"j10","final":true,"ts":5}',
    # a time that is not 16 digits long
    b'{"ts":12,"event":"timed_out","job":"j11","final":true}',
    # torn; and trailing bytes after the object (ignored)
    b'{"ts":1772359200020530,"event":"succeeded","job":"j12","final":true',
    b'{"ts":1772359200020531,"event":"succeeded","job":"j13","final":true} trailing',
    # a long out of range; a float for a long
    b'{"ts":1772359200020532,"event":"succeeded","job":"j14","final":true,'
    b'"run_us":9223372036854775808}',
    b'{"ts":1772359200020533,"event":"succeeded","job":"j15","final":true,"run_us":-5,'
    b'"total_us":1e3}',
    b'  {"ts":1772359200020534,"event":"succeeded","job":"j16","final":true}  ',
    b'{"ts":1772359200020535,"event":"enqueued","job":"j17","final":true}',
    # lone surrogates (the JVM writes "?"), and a pair
    b'{"ts":1772359200020540,"event":"succeeded","job":"j20\\ud800x","task":"a\\udc00",'
    b'"final":true}',
    b'{"ts":1772359200020541,"event":"succeeded","job":"j21","task":"\\ud83d\\ude00","final":true}',
    # times out of range (dropped) and a duration out of range (null): no overflow
    b'{"ts":9223372036854775807,"event":"succeeded","job":"big","attempt":1,"run_us":1,'
    b'"total_us":2,"final":true}',
    b'{"ts":-5000000000000000,"event":"succeeded","job":"neg","run_us":1,"final":true}',
    b'{"ts":1772359200020542,"event":"failed","job":"j22","attempt":1,"run_us":1,'
    b'"total_us":-9223372036854775808,"error":"E","final":true}',
    # an end without "final" (an older broker's), and "final": null
    b'{"ts":1772359200020536,"event":"failed","job":"j18","attempt":1,"error":"E"}',
    b'{"ts":1772359200020537,"event":"succeeded","job":"j19","final":null}',
]


PROFILES = (
    TaskProfile("app.fast", "default", 5, 0.001, 0.5, 0.05, ("ValueError", "KeyError")),
    TaskProfile("app.mail", "email", 3, 0.05, 0.8, 0.2, ("ConnectionError",), 2, 0.4, 0.5),
    TaskProfile("app.hook", "email", 2, 0.2, 1.0, 0.3, ("HookError",), 3, 1.0, 1.0),
    TaskProfile(None, "legacy", 1, 0.05, 0.5, 0.1, ("Exception",)),
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A broker's trace across midnight (two dates, two hourly files), with requeues."""
    directory = tmp_path_factory.mktemp("trace")
    cfg = SynthConfig(
        jobs=1500,
        start=1_772_409_480.0,  # 23:58 UTC
        rate=6.0,
        seed=11,
        requeue_rate=0.02,
        profiles=PROFILES,
    )
    write_trace(generate(cfg), directory)
    return directory


def spark_ends(spark: SparkSession, paths: list[Path]) -> list[tuple]:
    """The lines that end an attempt or a job, as the Spark path reads them."""
    events = io.read_events(spark, [str(p) for p in paths])
    ends = events.where(F.col("event").isin(list(FINAL_EVENTS))).select(*END_COLUMNS)
    return sorted((tuple(r) for r in ends.collect()), key=repr)


def pass_ends(data: bytes) -> tuple[list[tuple], endpass.Counts]:
    table, counts = endpass.end_lines(data, None, None)
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr), counts


def test_the_pass_reads_odd_lines_as_sparks_reader_does(spark: SparkSession, tmp_path: Path):
    path = tmp_path / "trace-20260301-10.jsonl"
    path.write_bytes(b"\n".join(ODD_LINES) + b"\n")
    want = spark_ends(spark, [path])
    got, counts = pass_ends(path.read_bytes())
    assert got == want
    jobs = {row[2] for row in got}
    # what each kind of line came to (the comparison above is the real check)
    assert {"j1", "j2", "j3", "j5", "j7", "j10", "j11", "j13", "j16", "j18", "j19", "j21"} <= jobs
    assert "j20?x" in jobs and "j22" in jobs and not jobs & {"big", "neg"}
    assert not jobs & {"j4", "j9", "j12", "j17"}
    assert (counts.ends, counts.legacy) == (len(got), 3)  # j8, j18, j19: no true or false


@pytest.mark.parametrize("legacy", [False, True])
def test_a_batch_of_odd_lines_runs_to_its_end_on_either_path(
    spark: SparkSession, tmp_path: Path, legacy: bool
):
    """Nothing in ODD_LINES stops a batch (an overflow, a date out of range, a line
    that cannot be typed): with the lines that lack ``final`` it takes the full
    path, without them the pass; the jobs are those the Spark reader finds."""
    trace = tmp_path / "trace"
    trace.mkdir()
    lines = [line for line in ODD_LINES if legacy or b'"job":"j18"' not in line]
    lines = [line for line in lines if legacy or not (b'"j8"' in line or b'"j19"' in line)]
    path = trace / "trace-20260301-10.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ends = io.read_events(spark, [str(path)]).select(*transforms.END_COLUMNS)
    want = sorted(r["job"] for r in transforms.final_job_facts(ends).collect())
    out = tmp_path / "out"
    result = Analyzer(spark, AnalyzeConfig(trace_dir=trace, output=out, update_db=False)).run_once()
    assert (result.open_jobs is not None) == legacy
    got = sorted(r["job"] for r in spark.read.parquet(str(out / "jobs")).collect())
    if legacy:  # the full path: the jobs with a final outcome, as it merges them
        assert set(got) <= {row[2] for row in pass_ends(path.read_bytes())[0]} and got
    else:
        assert got == want and len(got) > 10


def test_candidate_lines_drop_only_the_brokers_lines_that_cannot_end_a_job(trace: Path):
    data = b"".join(p.read_bytes() for p in sorted(trace.glob("trace-*.jsonl")))
    lines = data.split(b"\n")[:-1]
    kept = endpass.candidate_lines(data)
    ends = [line for line in lines if any(f'"event":"{e}"'.encode() in line for e in FINAL_EVENTS)]
    assert kept == ends  # in order, every one, nothing else
    assert len(kept) < len(lines) / 2
    # and on the last line without its newline
    assert endpass.candidate_lines(data[:-1]) == ends


@pytest.mark.parametrize("split_bytes", [1, 97, 4096, 1 << 30])
def test_ranges_cover_every_line_once(trace: Path, tmp_path: Path, split_bytes: int):
    paths = sorted(trace.glob("trace-*.jsonl"))
    torn = tmp_path / "torn.jsonl"  # no newline at its end
    torn.write_bytes(b'{"a":1}\n{"b":22}\n{"c":333}')
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    small = tmp_path / "small.jsonl"  # a few lines of the trace
    small.write_bytes(b"".join(paths[0].read_bytes().splitlines(keepends=True)[:7]))
    files = [small, torn, empty] if split_bytes == 1 else [*paths, small, torn, empty]
    for path in files:
        splits = endpass.plan_splits([path], split_bytes)
        assert b"".join(endpass.read_split(s) for s in splits) == path.read_bytes()
        if split_bytes == 1 and path.stat().st_size > 1:
            assert len(splits) == path.stat().st_size


def test_the_pass_matches_the_spark_readers_end_lines_on_a_trace(spark: SparkSession, trace: Path):
    paths = sorted(trace.glob("trace-*.jsonl"))
    got, counts = pass_ends(b"".join(p.read_bytes() for p in paths))
    want = spark_ends(spark, paths)
    assert got == want and counts.legacy == 0 and counts.final < counts.ends == len(want)


def tables(out: Path, spark: SparkSession) -> dict[str, list[tuple]]:
    found = {}
    for name in ("jobs", "task_minute", "queue_minute", "jm_minute", "failures", "slowest_tasks"):
        df = spark.read.parquet(str(out / name))
        cols = sorted(df.columns)
        found[name] = sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)
        found[name + " types"] = sorted(df.dtypes)
    return found


def db_rows() -> dict[str, list[tuple]]:
    from emq_django.analytics.models import (
        FailureMetric,
        JobManagerMetric,
        QueueMetric,
        TaskMetric,
    )

    found = {}
    for model in (QueueMetric, TaskMetric, JobManagerMetric, FailureMetric):
        fields = [f.name for f in model._meta.fields if f.name != "id"]
        found[model.__name__] = sorted(model.objects.values_list(*fields), key=repr)
    return found


@pytest.mark.django_db
def test_tables_equal_the_spark_final_paths_and_do_not_depend_on_the_ranges(
    spark: SparkSession, trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The batch's six tables and the models' rows from the pass (ranges of 1 MB
    and of 8 KB: the partials of a minute come from several ranges) are those
    the Spark transforms compute (``Analyzer.process``: JSON reader,
    ``final_job_facts``, the metric queries), column for column and type for type."""
    reference = tmp_path / "spark"
    config = AnalyzeConfig(trace_dir=trace, output=reference)
    paths = sorted(trace.glob("trace-*.jsonl"))
    Analyzer(spark, config).process(io.read_events(spark, [str(p) for p in paths]))
    want = tables(reference, spark)
    want_db = db_rows()
    assert all(want_db.values())
    assert len(want["jobs"]) > 1000 and len({r[1] for r in want["jobs"]}) == 2  # two dates
    for split_bytes in (1 << 20, 8192):
        monkeypatch.setattr(endpass, "SPLIT_BYTES", split_bytes)
        out = tmp_path / f"pass-{split_bytes}"
        result = Analyzer(spark, AnalyzeConfig(trace_dir=trace, output=out)).run_once()
        assert result.open_jobs is None and result.finished_jobs == len(want["jobs"])
        assert tables(out, spark) == want, split_bytes
        assert db_rows() == want_db
        assert not (out / "_staging").exists() or not any((out / "_staging").iterdir())


def test_percentiles_past_the_sketch_size_stay_within_its_rank_error():
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 10**9, size, dtype=np.int64) for size in (9000, 9000, 30000, 7)]
    merged = endpass._Values()
    for part in parts:
        merged.add(part)
    values = np.sort(np.concatenate(parts))
    n = len(values)
    assert n > PERCENTILE_SKETCH_K and merged.sketch is not None
    for p, got in zip((0.5, 0.95, 0.99), merged.quantiles(), strict=True):
        rank = int(np.searchsorted(values, got, side="right"))  # rank of the value given
        assert abs(rank - math.ceil(p * n)) <= 1 + n / 5_000, (p, rank)
    # up to the sketch's size: the value of rank ceil(p n) itself
    small = endpass._Values()
    for part in (parts[0][:5000], parts[1][:5000], parts[3]):
        small.add(part)
    exact = np.sort(np.concatenate([parts[0][:5000], parts[1][:5000], parts[3]]))
    m = len(exact)
    assert small.quantiles() == [int(exact[math.ceil(p * m) - 1]) for p in (0.5, 0.95, 0.99)]
    assert endpass._Values().quantiles() == [None, None, None]


def test_a_range_with_a_legacy_line_sends_the_batch_down_the_full_path(
    spark: SparkSession, trace: Path, tmp_path: Path
):
    """The pass writes nothing into the output when one line lacks ``final``."""
    copy = tmp_path / "trace"
    copy.mkdir()
    for p in sorted(trace.glob("trace-*.jsonl")):
        data = p.read_bytes()
        if p.name.endswith("-23.jsonl"):
            cut = data.index(b"\n", len(data) // 2) + 1
            old = b'{"ts":1772409599000000,"event":"failed","job":"x","attempt":1,"error":"E"}\n'
            data = data[:cut] + old + data[cut:]
        (copy / p.name).write_bytes(data)
    out = tmp_path / "out"
    done = endpass.run(
        spark, sorted(copy.glob("trace-*.jsonl")), tmp_path / "work", split_bytes=65536
    )
    assert done.counts.legacy == 1
    result = Analyzer(spark, AnalyzeConfig(trace_dir=copy, output=out, update_db=False)).run_once()
    assert result.open_jobs is not None  # the full path
    jobs = spark.read.parquet(str(out / "jobs"))
    assert "final_line" not in jobs.columns or jobs.where(F.col("final_line")).count() == 0


def test_the_job_rows_read_back_with_sparks_types_and_without_time_dictionaries(
    spark: SparkSession, trace: Path, tmp_path: Path
):
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    Analyzer(spark, AnalyzeConfig(trace_dir=trace, output=out, update_db=False)).run_once()
    facts = transforms.final_job_facts(
        io.read_events(spark, [str(p) for p in sorted(trace.glob("trace-*.jsonl"))]).select(
            *transforms.END_COLUMNS
        )
    )
    stored = io.read_dates(spark, out / "jobs", io.partition_dates(out / "jobs"), True)
    assert stored is not None and dict(stored.dtypes) == dict(facts.dtypes)
    for f in (out / "jobs").rglob("*.parquet"):
        meta = pq.ParquetFile(f).metadata
        for i in range(meta.row_group(0).num_columns):
            column = meta.row_group(0).column(i)
            has_dictionary = column.dictionary_page_offset is not None
            name = column.path_in_schema
            if name != "final_line":  # a boolean: no dictionary, in any writer
                assert has_dictionary == (name in endpass.JOB_DICTIONARY_COLUMNS), name


def test_since_and_until_cut_the_pass_as_they_cut_the_spark_path(
    spark: SparkSession, trace: Path, tmp_path: Path
):
    """``--since``/``--until`` keep the end lines whose time is in [since, until), in
    the pass as in ``io.window_events``."""
    import datetime as dt

    since = dt.datetime(2026, 3, 1, 23, 59, 30, tzinfo=dt.UTC)
    until = dt.datetime(2026, 3, 2, 0, 1, tzinfo=dt.UTC)
    paths = sorted(trace.glob("trace-*.jsonl"))
    reference = tmp_path / "spark"
    config = AnalyzeConfig(
        trace_dir=trace, output=reference, update_db=False, since=since, until=until
    )
    Analyzer(spark, config).process(io.read_events(spark, [str(p) for p in paths]))
    want = tables(reference, spark)
    out = tmp_path / "pass"
    config = AnalyzeConfig(trace_dir=trace, output=out, update_db=False, since=since, until=until)
    result = Analyzer(spark, config).run_once()
    assert result.finished_jobs == len(want["jobs"]) > 50
    assert tables(out, spark) == want
    bounds = spark.read.parquet(str(out / "jobs")).agg(
        F.min("finished_ts").alias("lo"), F.max("finished_ts").alias("hi")
    )
    (row,) = bounds.collect()
    assert since.timestamp() * 1e6 <= row["lo"] and row["hi"] < until.timestamp() * 1e6
