"""The end pass's rows: job facts from the final lines (``job_facts``, written
as Parquet per date) and the partial metrics of one range (``partials``, Arrow
IPC). Runs in Spark's Python workers; see analytics/endpass.py."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from emq_django.analytics.endlines import DAY_US, MINUTE_US
from emq_django.analytics.schema import (
    DEAD_LETTERED,
    LATENCIES,
    SUCCEEDED,
    TIMED_OUT,
)

UTC_US = pa.timestamp("us", tz="UTC")
# The job facts, as transforms.final_job_facts gives them (``date`` is the
# partition directory).
JOB_SCHEMA = pa.schema(
    [
        ("job", pa.string()),
        ("queue", pa.string()),
        pa.field("task", pa.string(), nullable=False),
        ("jm", pa.string()),
        ("outcome", pa.string()),
        ("error", pa.string()),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("retries", pa.int32(), nullable=False),
        pa.field("requeues", pa.int32(), nullable=False),
        ("wait_us", pa.int64()),
        ("run_us", pa.int64()),
        ("e2e_us", pa.int64()),
        ("enqueued_ts", pa.int64()),
        ("finished_ts", pa.int64()),
        ("last_ts", pa.int64()),
        ("events", pa.int64()),
        ("minute", UTC_US),
        pa.field("final_line", pa.bool_(), nullable=False),
    ]
)
# No dictionary on the columns whose values (nearly) never repeat (io.fact_writer).
_NO_DICTIONARY = {"job", "wait_us", "run_us", "e2e_us", "enqueued_ts", "finished_ts", "last_ts"}
JOB_DICTIONARY_COLUMNS = [f.name for f in JOB_SCHEMA if f.name not in _NO_DICTIONARY]


# ---- job facts ------------------------------------------------------------------


def _np(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    return pc.fill_null(column, fill).to_numpy(zero_copy_only=False)


def job_facts(ends: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """End lines -> the job facts of those with ``"final":true`` (the columns of
    ``JOB_SCHEMA``), and each row's UTC date as days since the epoch."""
    done = ends.filter(pc.fill_null(ends["final"], False))
    ts = done["ts"]
    outcome = done["event"]
    run, total = done["run_us"], done["total_us"]
    attempts = pc.fill_null(done["attempt"], 0)
    retries = pc.fill_null(done["retries"], 0)
    requeues = pc.fill_null(done["requeues"], 0)
    dead = pc.equal(outcome, DEAD_LETTERED).cast(pa.int64())
    events = pc.add(
        pc.add(pc.add(attempts.cast(pa.int64()), retries.cast(pa.int64())), requeues),
        pc.add(dead, 2),
    )
    ts_np = ts.to_numpy()
    minute = ts_np - np.mod(ts_np, MINUTE_US)
    days = np.floor_divide(ts_np, DAY_US)
    n = done.num_rows
    facts = pa.table(
        [
            done["job"],
            done["queue"],
            pc.fill_null(done["task"], ""),
            done["jm"],
            outcome,
            pc.if_else(pc.not_equal(outcome, SUCCEEDED), done["error"], pa.nulls(n, pa.string())),
            attempts,
            retries,
            requeues,
            pc.subtract(total, run),
            run,
            total,
            pc.subtract(ts, total),
            ts,
            ts,
            events,
            pa.array(minute, pa.int64()).cast(UTC_US),
            pa.array(np.ones(n, dtype=bool)),
        ],
        schema=JOB_SCHEMA,
    )
    return facts, days


def date_name(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()


def write_jobs(facts: pa.Table, days: np.ndarray, directory: Path, name: str) -> list[str]:
    """``facts`` as Parquet under ``directory/date=YYYY-MM-DD/name.parquet`` (one
    file per date; written under a temporary name, then renamed: a task run again
    replaces its file). The options of ``io.fact_writer``. Returns the dates."""
    dates = []
    distinct = np.unique(days)
    for day in distinct:
        rows = facts.filter(pa.array(days == day)) if len(distinct) > 1 else facts
        part = directory / f"date={date_name(day)}"
        part.mkdir(parents=True, exist_ok=True)
        tmp = part / f".{name}.{uuid.uuid4().hex}.tmp"
        pq.write_table(
            rows,
            str(tmp),
            compression="snappy",
            use_dictionary=JOB_DICTIONARY_COLUMNS,
            write_statistics=True,
            use_deprecated_int96_timestamps=True,  # as Spark writes a timestamp
            write_page_checksum=False,
        )
        os.replace(tmp, part / f"{name}.parquet")
        dates.append(date_name(day))
    return dates


# ---- partial metrics --------------------------------------------------------------


TASK_KEYS = ("queue", "task", "minute")


def _grouped_values(column: pa.ChunkedArray, starts: np.ndarray, n: int) -> pa.ListArray:
    """The non-null values of ``column`` (rows sorted by group; a group begins at
    each of ``starts``), as one list per group."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    values = _np(column)[valid]
    counts = np.add.reduceat(valid.astype(np.int64), starts) if n else np.zeros(0, np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))


def partials(facts: pa.Table) -> dict[str, pa.Table]:
    """The mergeable metrics of ``facts`` (see the module's doc): ``task`` per
    queue x task x minute (counts, sums, and each latency's values), ``jm`` per job
    manager x minute, ``failures`` per queue x task x error x minute; minutes in µs."""
    minute = facts["minute"].cast(pa.int64())
    outcome = facts["outcome"]
    ok = pc.equal(outcome, SUCCEEDED)
    base = pa.table(
        {
            "queue": facts["queue"],
            "task": facts["task"],
            "minute": minute,
            "jm": pc.fill_null(facts["jm"], ""),
            "error": pc.fill_null(facts["error"], ""),
            "ok": ok.cast(pa.int64()),
            "bad": pc.invert(ok).cast(pa.int64()),
            "timed_out": pc.equal(outcome, TIMED_OUT).cast(pa.int64()),
            "retried": pc.greater(facts["retries"], 0).cast(pa.int64()),
            "wait_us": facts["wait_us"],
            "run_us": facts["run_us"],
            "e2e_us": facts["e2e_us"],
        }
    )
    # queue x task x minute: the rows sorted by group, each group's sums by
    # reduceat and its values as a list (vectorised: no loop over groups).
    rows = base.take(pc.sort_indices(base, [(k, "ascending") for k in TASK_KEYS]))
    n = rows.num_rows
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for k in TASK_KEYS:
            key = pc.fill_null(rows[k], "" if k != "minute" else 0)
            keys = key.to_numpy(zero_copy_only=False)
            nulls = pc.is_null(rows[k]).to_numpy(zero_copy_only=False)
            change[1:] |= (keys[1:] != keys[:-1]) | (nulls[1:] != nulls[:-1])
    starts = np.flatnonzero(change)
    bounds = np.append(starts, n)

    def total(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, starts) if n else np.zeros(0, np.int64)

    run_valid = pc.is_valid(rows["run_us"]).to_numpy(zero_copy_only=False)
    run_values = _np(rows["run_us"])
    lowest = np.iinfo(np.int64).min
    first = pa.array(starts)
    task = pa.table(
        {
            "queue": rows["queue"].take(first),
            "task": rows["task"].take(first),
            "minute": rows["minute"].take(first),
            "jobs": pa.array(np.diff(bounds), pa.int64()),
            "succeeded": total(rows["ok"].to_numpy()),
            "failed": total(rows["bad"].to_numpy()),
            "timed_out": total(rows["timed_out"].to_numpy()),
            "retried": total(rows["retried"].to_numpy()),
            "run_n": total(run_valid.astype(np.int64)),
            "run_total_us": total(run_values),
            "run_max_us": np.maximum.reduceat(np.where(run_valid, run_values, lowest), starts)
            if n
            else np.zeros(0, np.int64),
            **{
                f"{name}_values": _grouped_values(rows[f"{name}_us"], starts, n)
                for name in LATENCIES
            },
        }
    )
    jm = (
        base.group_by(["jm", "minute"], use_threads=False)
        .aggregate([("ok", "count"), ("ok", "sum"), ("run_us", "sum")])
        .rename_columns(["jm", "minute", "attempts", "succeeded", "busy_us"])
    )
    failed = base.filter(pc.invert(ok))
    failures = (
        failed.group_by(["queue", "task", "error", "minute"], use_threads=False)
        .aggregate([("ok", "count")])
        .rename_columns(["queue", "task", "error", "minute", "failures"])
    )
    return {"task": task, "jm": jm, "failures": failures}


def write_ipc(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def read_ipc(path: Path) -> pa.Table:
    with pa.OSFile(str(path)) as source:
        return pa.ipc.open_file(source).read_all()
