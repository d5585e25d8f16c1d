"""Analytics on local Spark: every metric against a plain-Python reference.

One SparkSession (local[2], UI off, 2 shuffle partitions) for the module. The
traces are small: synthetic ones (emq_django.analytics.synth) that straddle an
hour boundary, with dropped events, and hand-written edge cases.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from emq_django.analytics import io, transforms  # noqa: E402
from emq_django.analytics.models import (  # noqa: E402
    FailureMetric,
    JobManagerMetric,
    QueueMetric,
    TaskMetric,
)
from emq_django.analytics.pipeline import (  # noqa: E402
    PROBE_BYTES,
    AnalyzeConfig,
    Analyzer,
    legacy_lines,
)
from emq_django.analytics.schema import PERCENTILE_ACCURACY, PERCENTILE_SKETCH_K  # noqa: E402
from emq_django.analytics.synth import (  # noqa: E402
    SynthConfig,
    TaskProfile,
    generate,
    write_trace,
)

# Spark starts a JVM and runs dozens of small jobs: far slower than the suite default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

US = 1_000_000
HOUR = dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC)  # the traces straddle 10:00 -> 11:00
FINAL = ("succeeded", "failed", "timed_out", "dead_lettered")
FINISH = ("succeeded", "failed", "timed_out")
# Events in one broker loop turn share a ts: a failure comes before its retry.
RANK = {
    "enqueued": 0,
    "dispatched": 1,
    "requeued": 2,
    "succeeded": 3,
    "failed": 3,
    "timed_out": 3,
    "retried": 4,
    "dead_lettered": 5,
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = io.build_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.host": "127.0.0.1",
            "spark.sql.adaptive.enabled": "false",
        },
        app_name="emq-tests",
    )
    yield session
    session.stop()


# ---- the plain-Python reference ---------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (Spark's exact percentile)."""
    xs = sorted(values)
    if not xs:
        return None
    pos = p * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentile_range(values: list[float], p: float) -> tuple[float, float] | None:
    """What the pipeline's percentile may return (schema.PERCENTILE_SKETCH_K and
    PERCENTILE_ACCURACY): for a group of at most K values, the value of rank
    ceil(p * n) itself; beyond, a value of the group whose rank is within
    1 + n / accuracy of p * n."""
    xs = sorted(values)
    if not xs:
        return None
    n = len(xs)
    if n <= PERCENTILE_SKETCH_K:
        exact = xs[max(math.ceil(p * n), 1) - 1]
        return exact, exact
    slack = 1 + math.ceil(n / PERCENTILE_ACCURACY)
    lo = max(0, math.floor(p * n) - slack)
    hi = min(n - 1, math.ceil(p * n) + slack - 1)
    return xs[lo], xs[hi]


def minute_of(ts: int) -> int:
    return ts // (60 * US) * 60 * US


def ref_final_job(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """A job traced with ``final`` (docs/trace-format.md): its facts are those of
    its final line; without one it is open."""
    finals = [e for e in evs if e.get("final")]
    if not finals:
        last = max(evs, key=lambda e: (e["ts"], e.get("attempt") or 0, RANK[e["event"]]))
        return {
            "queue": last["queue"],
            "task": last["task"] or "",
            "jm": None,
            "outcome": None,
            "error": None,
            "attempts": max(e.get("attempt") or 0 for e in evs),
            "retries": 0,
            "requeues": 0,
            "run_us": None,
            "e2e_us": None,
            "wait_us": None,
            "minute": None,
        }
    f = finals[-1]
    run, total = f.get("run_us"), f.get("total_us")
    return {
        "queue": f["queue"],
        "task": f["task"] or "",
        "jm": f.get("jm"),
        "outcome": f["event"],
        "error": None if f["event"] == "succeeded" else f.get("error"),
        "attempts": f.get("attempt") or 0,
        "retries": f.get("retries", 0),
        "requeues": f.get("requeues", 0),
        "run_us": run,
        "e2e_us": total,
        "wait_us": None if run is None or total is None else total - run,
        "minute": minute_of(f["ts"]),
    }


def ref_jobs(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_job[e["job"]].append(e)
    jobs = {}
    for job, evs in by_job.items():
        if any("final" in e for e in evs):
            jobs[job] = ref_final_job(evs)
            continue
        evs.sort(key=lambda e: (e["ts"], e.get("attempt") or 0, RANK[e["event"]]))
        last = evs[-1]
        outcome = last["event"] if last["event"] in FINAL else None
        fins = [e for e in evs if e["event"] in FINISH]
        fin = fins[-1] if fins else {}
        if outcome == "dead_lettered":
            error = last.get("error") or fin.get("error")
        elif outcome == "succeeded":
            error = None
        else:
            error = fin.get("error")
        run, total = fin.get("run_us"), fin.get("total_us")
        jobs[job] = {
            "queue": max(e["queue"] for e in evs),
            "task": max((e["task"] for e in evs if e.get("task")), default=""),
            "jm": fin.get("jm"),
            "outcome": outcome,
            "error": error,
            "attempts": max(e.get("attempt") or 0 for e in evs),
            "retries": sum(e["event"] == "retried" for e in evs),
            "requeues": sum(e["event"] == "requeued" for e in evs),
            "run_us": run,
            "e2e_us": total,
            "wait_us": None if run is None or total is None else total - run,
            "minute": minute_of(last["ts"]) if outcome else None,
        }
    return jobs


def ref_minute_metrics(jobs: dict[str, dict[str, Any]], keys: tuple[str, ...]) -> dict:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs.values():
        if j["outcome"]:
            groups[(*[j[k] for k in keys], j["minute"])].append(j)
    out = {}
    for key, js in groups.items():
        row: dict[str, Any] = {
            "jobs": len(js),
            "succeeded": sum(j["outcome"] == "succeeded" for j in js),
            "failed": sum(j["outcome"] != "succeeded" for j in js),
            "timed_out": sum(j["outcome"] == "timed_out" for j in js),
            "retried": sum(j["retries"] > 0 for j in js),
            "throughput": len(js) / 60,
            "run_total_us": sum(j["run_us"] for j in js if j["run_us"] is not None),
        }
        for name in ("wait", "run", "e2e"):
            values = [j[f"{name}_us"] for j in js if j[f"{name}_us"] is not None]
            for p, label in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
                row[f"{name}_{label}_us"] = percentile(values, p)
                row[f"{name}_{label}_us_range"] = percentile_range(values, p)
        out[key] = row
    return out


def ref_jm_metrics(events: Iterable[dict[str, Any]]) -> dict:
    out: dict[tuple, dict[str, Any]] = {}
    for e in events:
        if e["event"] not in FINISH:
            continue
        row = out.setdefault(
            (e.get("jm") or "", minute_of(e["ts"])),
            {"attempts": 0, "succeeded": 0, "failed": 0, "busy_us": 0},
        )
        row["attempts"] += 1
        row["succeeded" if e["event"] == "succeeded" else "failed"] += 1
        row["busy_us"] += e.get("run_us") or 0
    for row in out.values():
        row["utilisation"] = row["busy_us"] / 60e6
    return out


def ref_failures(jobs: dict[str, dict[str, Any]]) -> dict:
    out: dict[tuple, int] = defaultdict(int)
    for j in jobs.values():
        if j["outcome"] and j["outcome"] != "succeeded":
            out[(j["queue"], j["task"], j["error"] or "", j["minute"])] += 1
    return dict(out)


def ref_slowest(
    jobs: dict[str, dict[str, Any]], limit: int
) -> list[tuple[str, str, tuple[float, float]]]:
    runs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for j in jobs.values():
        if j["outcome"] and j["run_us"] is not None:
            runs[(j["queue"], j["task"])].append(j["run_us"])
    ranked = sorted(runs.items(), key=lambda kv: (-(percentile(kv[1], 0.95) or 0), kv[0]))
    return [(q, t, percentile_range(v, 0.95) or (0.0, 0.0)) for (q, t), v in ranked[:limit]]


# ---- helpers ------------------------------------------------------------------


def rows_by(df: DataFrame, keys: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
    if "minute" in df.columns:
        df = df.withColumn("minute", F.unix_micros("minute"))
    out = {}
    for r in df.collect():
        d = r.asDict()
        out[tuple(d[k] for k in keys)] = d
    return out


def assert_rows_match(got: dict, want: dict, columns: Iterable[str]) -> None:
    assert set(got) == set(want)
    for key, expected in want.items():
        for col in columns:
            e, g = expected[col], got[key][col]
            allowed = expected.get(f"{col}_range")
            if allowed is not None and g is not None:
                assert within(g, allowed), (key, col, g, allowed)
            elif e is None or g is None or isinstance(e, str):
                assert g == e, (key, col, g, e)
            else:
                assert g == pytest.approx(e, rel=1e-9, abs=1e-6), (key, col, g, e)


def within(value: float, allowed: tuple[float, float]) -> bool:
    """``value`` in ``allowed`` (inclusive), give or take float rounding (µs -> ms -> µs)."""
    lo, hi = allowed
    return lo - abs(lo) * 1e-9 - 1e-6 <= value <= hi + abs(hi) * 1e-9 + 1e-6


def load_lines(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("trace-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return events


def write_events(directory: Path, name: str, events: Iterable[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with path.open("a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    return path


# More failures, retries and timeouts than real life, so that 600 jobs have them all.
TEST_PROFILES = (
    TaskProfile("app.fast", "default", 5, 0.001, 0.5, 0.05, ("ValueError", "KeyError")),
    TaskProfile("app.mail", "email", 3, 0.05, 0.8, 0.2, ("ConnectionError",), 2, 0.4, 0.5),
    TaskProfile("app.hook", "email", 2, 0.2, 1.0, 0.3, ("HookError",), 3, 1.0, 1.0),
    TaskProfile(None, "legacy", 1, 0.05, 0.5, 0.1, ("Exception",)),
)


def make_trace(directory: Path, legacy: bool, drop_rate: float) -> Path:
    cfg = SynthConfig(
        jobs=600,
        start=HOUR.timestamp() - 150,
        rate=2.5,
        seed=7,
        drop_rate=drop_rate,
        requeue_rate=0.02,
        profiles=TEST_PROFILES,
        legacy=legacy,
    )
    counts = write_trace(generate(cfg), directory)
    assert len(counts) == 2, counts  # both sides of 10:00
    return directory


@pytest.fixture(scope="module")
def synth_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As brokers wrote traces before ``final``, with lost events: the full path."""
    return make_trace(tmp_path_factory.mktemp("trace"), legacy=True, drop_rate=0.01)


@pytest.fixture(scope="module")
def final_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As the broker writes traces now (``final``), every event there."""
    return make_trace(tmp_path_factory.mktemp("final"), legacy=False, drop_rate=0.0)


@pytest.fixture(scope="module")
def final_trace_lossy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As the broker writes traces now, with lost events."""
    return make_trace(tmp_path_factory.mktemp("lossy"), legacy=False, drop_rate=0.01)


def ev(ts_s: float, event: str, job: str, attempt: int, **extra: Any) -> dict[str, Any]:
    e = {
        "ts": int(HOUR.timestamp() * US + ts_s * US),
        "event": event,
        "job": job,
        "attempt": attempt,
        "task": extra.pop("task", "app.t"),
        "queue": extra.pop("queue", "q"),
        "jm": extra.pop("jm", None if event == "enqueued" else "jm-1"),
    }
    e.update(extra)
    return e


# ---- tests --------------------------------------------------------------------

METRIC_COLUMNS = (
    "jobs",
    "succeeded",
    "failed",
    "timed_out",
    "retried",
    "throughput",
    "run_total_us",
    *(f"{n}_{p}_us" for n in ("wait", "run", "e2e") for p in ("p50", "p95", "p99")),
)


def test_synthetic_trace_metrics_match_the_reference(spark: SparkSession, synth_trace: Path):
    events = load_lines(synth_trace)
    df = io.read_events(spark, sorted(synth_trace.glob("*.jsonl"))).persist()
    want_jobs = ref_jobs(events)
    jobs = transforms.job_facts(df).persist()

    got_jobs = rows_by(jobs, ("job",))
    assert len(got_jobs) == len(want_jobs)
    job_cols = ("queue", "task", "jm", "outcome", "error", "attempts", "retries", "requeues")
    assert_rows_match(
        got_jobs,
        {(k,): v for k, v in want_jobs.items()},
        (*job_cols, "run_us", "e2e_us", "wait_us", "minute"),
    )
    # The trace has what the metrics need: every outcome, retries, open jobs, two hours.
    outcomes = {j["outcome"] for j in want_jobs.values()}
    assert {"succeeded", "failed", "dead_lettered", None} <= outcomes, outcomes
    assert any(j["retries"] for j in want_jobs.values())

    assert_rows_match(
        rows_by(transforms.task_minute_metrics(jobs), ("queue", "task", "minute")),
        ref_minute_metrics(want_jobs, ("queue", "task")),
        METRIC_COLUMNS,
    )
    assert_rows_match(
        rows_by(transforms.queue_minute_metrics(jobs), ("queue", "minute")),
        ref_minute_metrics(want_jobs, ("queue",)),
        METRIC_COLUMNS,
    )
    assert_rows_match(
        rows_by(transforms.jm_minute_metrics(transforms.attempt_facts(df)), ("jm", "minute")),
        ref_jm_metrics(events),
        ("attempts", "succeeded", "failed", "busy_us", "utilisation"),
    )
    failures = rows_by(transforms.failures_by_error(jobs), ("queue", "task", "error", "minute"))
    assert {k: v["failures"] for k, v in failures.items()} == ref_failures(want_jobs)
    slowest = transforms.slowest_tasks(jobs, 3).orderBy("rank").collect()
    assert [(r["queue"], r["task"]) for r in slowest] == [
        (q, t) for q, t, _ in ref_slowest(want_jobs, 3)
    ]
    for r, (_, _, allowed) in zip(slowest, ref_slowest(want_jobs, 3), strict=True):
        assert within(r["run_p95_us"], allowed), (r, allowed)
    jobs.unpersist()
    df.unpersist()


def test_final_path_facts_equal_the_full_paths(spark: SparkSession, final_trace: Path):
    """On a trace with ``final`` and nothing lost, the job and attempt facts from
    the final lines alone equal those merged from every event, and the reference."""
    events = load_lines(final_trace)
    df = io.read_events(spark, sorted(final_trace.glob("*.jsonl"))).persist()
    full = transforms.job_facts(df).where(F.col("outcome").isNotNull())
    final = transforms.final_job_facts(df.select(*transforms.END_COLUMNS)).persist()
    got = rows_by(final.drop("final_line"), ("job",))
    assert got == rows_by(full, ("job",))
    want = {(k,): v for k, v in ref_jobs(events).items() if v["outcome"]}
    assert_rows_match(
        got,
        want,
        (
            "queue",
            "task",
            "jm",
            "outcome",
            "error",
            "attempts",
            "retries",
            "requeues",
            "run_us",
            "e2e_us",
            "wait_us",
            "minute",
        ),
    )
    outcomes = {v["outcome"] for v in want.values()}
    assert {"succeeded", "failed", "dead_lettered"} <= outcomes, outcomes
    assert any(v["requeues"] for v in want.values()) and any(v["retries"] for v in want.values())

    def attempts(facts: DataFrame) -> list[tuple]:
        cols = ("attempt", "queue", "task", "jm", "outcome", "run_us", "ts", "minute", "date")
        return sorted(tuple(r) for r in facts.select(*cols).collect())

    assert attempts(transforms.final_attempt_facts(final)) == attempts(transforms.attempt_facts(df))
    final.unpersist()
    df.unpersist()


def _tables(out: Path, spark: SparkSession) -> dict[str, list[tuple]]:
    tables = {}
    for name in (
        "jobs",
        "task_minute",
        "queue_minute",
        "jm_minute",
        "failures",
        "slowest_tasks",
    ):
        df = spark.read.parquet(str(out / name))
        cols = sorted(c for c in df.columns if c != "final_line")
        tables[name] = sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)
    return tables


def test_final_path_writes_what_the_full_path_writes(
    spark: SparkSession, final_trace: Path, tmp_path: Path
):
    results, tables = [], []
    for final_path in (True, False):
        out = tmp_path / f"out-{final_path}"
        config = AnalyzeConfig(
            trace_dir=final_trace, output=out, update_db=False, final_path=final_path
        )
        results.append(Analyzer(spark, config).run_once())
        tables.append(_tables(out, spark))
    fast, full = results
    assert fast.open_jobs is None and full.open_jobs == 0  # every job ends in this trace
    assert fast.finished_jobs == full.finished_jobs > 0 and fast.dates == full.dates
    assert tables[0] == tables[1]
    # the final path's attempts are its job rows (jm_minute above is the same)
    assert not (tmp_path / "out-True" / "attempts").exists()


def test_a_batch_with_an_older_brokers_lines_takes_the_full_path(
    spark: SparkSession, final_trace: Path, tmp_path: Path
):
    """Lines without ``final`` anywhere in a batch (here past what the probe of
    each file's head reads) send it down the full path, which reads them right."""
    trace = tmp_path / "trace"
    trace.mkdir()
    for f in final_trace.glob("trace-*.jsonl"):
        (trace / f.name).write_bytes(f.read_bytes())
    late = sorted(trace.glob("trace-*.jsonl"))[-1]
    assert late.stat().st_size > PROBE_BYTES
    old = [
        ev(3700, "enqueued", "old", 0),
        ev(3701, "dispatched", "old", 1, wait_us=US),
        ev(3702, "succeeded", "old", 1, run_us=US, total_us=2 * US),
    ]
    write_events(trace, late.name, old)
    assert not legacy_lines(late)
    config = AnalyzeConfig(trace_dir=trace, output=tmp_path / "out", update_db=False)
    result = Analyzer(spark, config).run_once()
    assert result.open_jobs == 0  # the full path
    jobs = spark.read.parquet(str(tmp_path / "out" / "jobs"))
    assert jobs.count() == 601
    (row,) = jobs.where("job = 'old'").collect()
    assert (row["outcome"], row["wait_us"], row["enqueued_ts"]) == ("succeeded", US, old[0]["ts"])


EDGE_EVENTS = [
    # a: crosses 10:59 -> 11:00 (two files), succeeds on attempt 1
    ev(3590, "enqueued", "a", 0),
    ev(3595, "dispatched", "a", 1, wait_us=5 * US),
    ev(3605, "succeeded", "a", 1, run_us=10 * US, total_us=15 * US),
    # b: failed, retried at the same instant, then succeeded on attempt 2
    ev(10, "enqueued", "b", 0),
    ev(11, "dispatched", "b", 1, wait_us=1 * US),
    ev(12, "failed", "b", 1, run_us=1 * US, total_us=2 * US, error="ValueError"),
    ev(12, "retried", "b", 1, error="ValueError", delay_us=1 * US),
    ev(14, "dispatched", "b", 2, wait_us=4 * US),
    ev(15, "succeeded", "b", 2, run_us=1 * US, total_us=5 * US),
    # c: only its last event survived (the rest was lost): still counted
    ev(20, "succeeded", "c", 1, run_us=2 * US, total_us=3 * US),
    # d: never finished (open): in no metric
    ev(21, "enqueued", "d", 0),
    ev(22, "dispatched", "d", 1, wait_us=1 * US),
    # e: timed out, retried, timed out, dead-lettered
    ev(30, "enqueued", "e", 0, task=None, queue="q2"),
    ev(30, "dispatched", "e", 1, wait_us=0, task=None, queue="q2"),
    ev(
        35,
        "timed_out",
        "e",
        1,
        run_us=5 * US,
        total_us=5 * US,
        error="TimeoutError",
        task=None,
        queue="q2",
    ),
    ev(35, "retried", "e", 1, error="TimeoutError", delay_us=0, task=None, queue="q2"),
    ev(36, "dispatched", "e", 2, wait_us=6 * US, task=None, queue="q2"),
    ev(
        41,
        "timed_out",
        "e",
        2,
        run_us=5 * US,
        total_us=11 * US,
        error="TimeoutError",
        task=None,
        queue="q2",
    ),
    ev(41, "dead_lettered", "e", 2, error="TimeoutError", task=None, queue="q2"),
    # f: its job manager vanished (requeued), then succeeded elsewhere
    ev(50, "enqueued", "f", 0),
    ev(50, "dispatched", "f", 1, wait_us=0),
    ev(52, "requeued", "f", 1, error="PeerLost"),
    ev(53, "dispatched", "f", 2, wait_us=3 * US, jm="jm-2"),
    ev(54, "succeeded", "f", 2, run_us=1 * US, total_us=4 * US, jm="jm-2"),
]


def test_edge_cases(spark: SparkSession, tmp_path: Path):
    trace = tmp_path / "trace"
    early = [e for e in EDGE_EVENTS if e["ts"] < HOUR.timestamp() * US + 3600 * US]
    late = [e for e in EDGE_EVENTS if e not in early]
    write_events(trace, "trace-20260301-10.jsonl", early)
    with (trace / "trace-20260301-10.jsonl").open("a") as f:
        f.write('{"ts": 1, "event": "bogus"}\nnot json\n')
    write_events(trace, "trace-20260301-11.jsonl", late)

    jobs = rows_by(
        transforms.job_facts(io.read_events(spark, sorted(trace.glob("*.jsonl")))), ("job",)
    )
    assert set(jobs) == {("a",), ("b",), ("c",), ("d",), ("e",), ("f",)}
    a, b, c, d, e, f = (jobs[(k,)] for k in "abcdef")
    assert (a["outcome"], a["wait_us"], a["run_us"], a["e2e_us"]) == ("succeeded", 5e6, 1e7, 15e6)
    assert a["minute"] == int(HOUR.timestamp() + 3600) * US  # the minute it finished: 11:00
    assert (b["outcome"], b["attempts"], b["retries"], b["error"]) == ("succeeded", 2, 1, None)
    assert (b["wait_us"], b["run_us"], b["e2e_us"]) == (4 * US, 1 * US, 5 * US)
    assert (c["outcome"], c["wait_us"], c["attempts"]) == ("succeeded", 1 * US, 1)
    assert d["outcome"] is None and d["minute"] is None
    assert (e["outcome"], e["error"], e["task"], e["attempts"]) == (
        "dead_lettered",
        "TimeoutError",
        "",
        2,
    )
    assert (f["outcome"], f["requeues"], f["jm"], f["attempts"]) == ("succeeded", 1, "jm-2", 2)
    want = ref_jobs(EDGE_EVENTS)
    assert_rows_match(jobs, {(k,): v for k, v in want.items()}, ("outcome", "wait_us", "minute"))


def _db_snapshot() -> dict[str, list[tuple]]:
    def rows(model: Any, *cols: str) -> list[tuple]:
        return sorted(model.objects.values_list(*cols))

    return {
        "queue": rows(QueueMetric, "pk", "queue", "minute", "jobs", "failed", "e2e_p95_ms"),
        "task": rows(TaskMetric, "pk", "queue", "task", "minute", "jobs", "run_p99_ms"),
        "jm": rows(JobManagerMetric, "pk", "jm", "minute", "attempts", "busy_ms"),
        "failures": rows(FailureMetric, "pk", "queue", "task", "error", "minute", "failures"),
    }


def _db_task_metrics() -> dict[tuple, dict[str, Any]]:
    out = {}
    for m in TaskMetric.objects.all():
        out[(m.queue, m.task, int(m.minute.timestamp()) * US)] = {
            "jobs": m.jobs,
            "failed": m.failed,
            "retried": m.retried,
            "run_p95_us": None if m.run_p95_ms is None else m.run_p95_ms * 1000,
            "e2e_p99_us": None if m.e2e_p99_ms is None else m.e2e_p99_ms * 1000,
        }
    return out


@pytest.mark.django_db
@pytest.mark.parametrize("trace_kind", ["legacy", "final"])
def test_incremental_runs_add_only_new_data(
    spark: SparkSession, trace_kind: str, request: pytest.FixtureRequest, tmp_path: Path
):
    synth_trace = request.getfixturevalue(
        "synth_trace" if trace_kind == "legacy" else "final_trace_lossy"
    )
    trace = tmp_path / "trace"
    trace.mkdir()
    files = sorted(synth_trace.glob("trace-*.jsonl"))
    first, second = files
    (trace / first.name).write_bytes(first.read_bytes())
    # The 11:00 file is still being written when the first run happens: half of it.
    data = second.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1
    (trace / second.name).write_bytes(data[:cut] + b'{"ts":1795')  # and a torn line
    during_hour_11 = HOUR + dt.timedelta(hours=1, minutes=30)
    analyzer = Analyzer(spark, AnalyzeConfig(trace_dir=trace, output=tmp_path / "out"))

    r1 = analyzer.run_once(now=during_hour_11)
    assert r1.sources == 2 and r1.finished_jobs > 0
    if trace_kind == "legacy":
        assert r1.open_jobs is not None and r1.open_jobs > 0
    else:  # the final path: nothing to carry over
        assert r1.open_jobs is None and not (tmp_path / "out" / "_open").exists()
    seen = load_lines(trace)
    assert_rows_match(_db_task_metrics(), _ref_task(seen), ("jobs", "failed", "retried"))
    snapshot = _db_snapshot()

    # Nothing new: nothing happens, not a row changes.
    r2 = Analyzer(spark, AnalyzeConfig(trace_dir=trace, output=tmp_path / "out")).run_once(
        now=during_hour_11
    )
    assert (r2.sources, r2.events) == (0, 0)
    assert _db_snapshot() == snapshot

    # The rest of the 11:00 file: only those bytes are read; the jobs left open
    # by the first run are finished from their saved events.
    (trace / second.name).write_bytes(data)
    r3 = analyzer.run_once(now=during_hour_11 + dt.timedelta(hours=1))
    assert r3.sources == 1 and r3.bytes == len(data) - cut
    everything = load_lines(synth_trace)
    assert_rows_match(
        _db_task_metrics(),
        _ref_task(everything),
        ("jobs", "failed", "retried", "run_p95_us", "e2e_p99_us"),
    )
    assert QueueMetric.objects.count() == len(ref_minute_metrics(ref_jobs(everything), ("queue",)))
    jobs_table = spark.read.parquet(str(tmp_path / "out" / "jobs"))
    assert jobs_table.count() == sum(1 for j in ref_jobs(everything).values() if j["outcome"])
    assert Analyzer(spark, analyzer.config).run_once(now=during_hour_11).events == 0


def _ref_task(events: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return ref_minute_metrics(ref_jobs(events), ("queue", "task"))
