"""The end pass's merge on the driver: the partials of all ranges into the
metric tables (``merge``, ``write_metric_table``); see analytics/endpass.py."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from emq_django.analytics.endfacts import UTC_US, read_ipc
from emq_django.analytics.endlines import DAY_US
from emq_django.analytics.schema import (
    LATENCIES,
    PERCENTILE_NAMES,
    PERCENTILE_SKETCH_K,
    PERCENTILES,
)

# ---- merging on the driver ----------------------------------------------------------------


class _Values:
    """The values of one latency in one group, gathered from partial rows: kept as
    they are up to ``PERCENTILE_SKETCH_K`` (the percentile is then the value of rank
    ceil(p n), as a KLL sketch of that k gives it), folded into such a sketch
    beyond (memory stays bounded; the value is then within its rank error)."""

    __slots__ = ("parts", "kept", "sketch")

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.kept = 0
        self.sketch: Any = None

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.parts.append(values)
        self.kept += len(values)
        if self.kept > PERCENTILE_SKETCH_K:
            self._fold()

    def _fold(self) -> None:
        from datasketches import kll_doubles_sketch

        if self.sketch is None:
            self.sketch = kll_doubles_sketch(PERCENTILE_SKETCH_K)
        if self.parts:
            self.sketch.update(np.concatenate(self.parts).astype(np.float64))
        self.parts, self.kept = [], 0

    def quantiles(self) -> list[int | None]:
        if self.sketch is not None:
            self._fold()
            # one sorted view for all three; inclusive: the rank ceil(p n)
            return [int(v) for v in self.sketch.get_quantiles(list(PERCENTILES), True)]
        if not self.kept:
            return [None] * len(PERCENTILES)
        values = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]
        ranks = [max(0, math.ceil(p * self.kept) - 1) for p in PERCENTILES]
        chosen = np.partition(values, ranks)
        return [int(chosen[r]) for r in ranks]


class _Merged:
    """Counts and values of one group, merged from partial rows."""

    __slots__ = (
        "jobs",
        "succeeded",
        "failed",
        "timed_out",
        "retried",
        "run_n",
        "run_total",
        "run_max",
        "values",
    )

    def __init__(self, latencies: Iterable[str] = LATENCIES) -> None:
        self.jobs = self.succeeded = self.failed = self.timed_out = self.retried = 0
        self.run_n = self.run_total = 0
        self.run_max: int | None = None
        self.values = {name: _Values() for name in latencies}

    def add(self, row: dict[str, Any], values: dict[str, np.ndarray]) -> None:
        self.jobs += row["jobs"]
        self.succeeded += row["succeeded"]
        self.failed += row["failed"]
        self.timed_out += row["timed_out"]
        self.retried += row["retried"]
        if row["run_n"]:
            self.run_n += row["run_n"]
            self.run_total += row["run_total_us"]
            top = row["run_max_us"]
            self.run_max = top if self.run_max is None else max(self.run_max, top)
        for name, mine in self.values.items():
            mine.add(values[name])

    def minute_row(self, keys: dict[str, Any]) -> dict[str, Any]:
        row = {
            **keys,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "timed_out": self.timed_out,
            "retried": self.retried,
            "throughput": self.jobs / 60.0,
            "run_total_us": self.run_total if self.run_n else None,
        }
        for name in LATENCIES:
            for pname, value in zip(PERCENTILE_NAMES, self.values[name].quantiles(), strict=True):
                row[f"{name}_{pname}_us"] = value
        return row


def _day(minute_us: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=minute_us // DAY_US)


def _slowest_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """The order of ``transforms.slowest_tasks``' window: p95 descending, then queue
    and task ascending (Spark puts nulls first in an ascending order)."""
    q, t = r["queue"], r["task"]
    return (-r["run_p95_us"], q is not None, q or "", t is not None, t or "")


def _task_rows(table: pa.Table) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """The rows of one range's ``task`` partials: the counts as a dict, each
    latency's values as a numpy view."""
    lists = {}
    for name in LATENCIES:
        column = table[f"{name}_values"].combine_chunks()
        lists[name] = (column.offsets.to_numpy(), column.values.to_numpy())
    counts = table.drop_columns([f"{name}_values" for name in LATENCIES]).to_pylist()
    for i, row in enumerate(counts):
        values = {}
        for name, (offsets, flat) in lists.items():
            values[name] = flat[offsets[i] : offsets[i + 1]]
        yield row, values


def merge(directory: Path, slowest_limit: int = 20) -> dict[str, list[dict[str, Any]]]:
    """The partials of every range in ``directory/partials`` -> the rows of the five
    metric tables (``minute`` in µs, ``date`` a date), as the Spark transforms
    compute them from the job facts."""
    found = directory / "partials"

    def files(kind: str) -> list[Path]:
        return sorted(found.glob(f"{kind}-*.arrow")) if found.is_dir() else []

    tables: dict[str, list[dict[str, Any]]] = {
        "task_minute": [],
        "queue_minute": [],
        "slowest_tasks": [],
        "jm_minute": [],
        "failures": [],
    }
    by_task: dict[tuple[str, str, int], _Merged] = {}
    by_queue: dict[tuple[str, int], _Merged] = {}
    by_day: dict[tuple[dt.date, str, str], _Merged] = {}
    for f in files("task"):  # one range at a time: memory is bounded by the groups
        for row, values in _task_rows(read_ipc(f)):
            q, t, m = row["queue"], row["task"], row["minute"]
            if (q, t, m) not in by_task:
                by_task[(q, t, m)] = _Merged()
            by_task[(q, t, m)].add(row, values)
            if (q, m) not in by_queue:
                by_queue[(q, m)] = _Merged()
            by_queue[(q, m)].add(row, values)
            task_day = (_day(m), q, t)
            if task_day not in by_day:
                by_day[task_day] = _Merged(("run",))
            by_day[task_day].add(row, values)
    for (q, t, m), g in by_task.items():
        keys = {"queue": q, "task": t, "minute": m}
        tables["task_minute"].append({**g.minute_row(keys), "date": _day(m)})
    for (q, m), g in by_queue.items():
        keys = {"queue": q, "minute": m}
        tables["queue_minute"].append({**g.minute_row(keys), "date": _day(m)})
    ranked: dict[dt.date, list[dict[str, Any]]] = {}
    for (day, q, t), g in by_day.items():
        if not g.run_n:
            continue
        p50, p95, p99 = g.values["run"].quantiles()
        ranked.setdefault(day, []).append(
            {
                "queue": q,
                "task": t,
                "jobs": g.run_n,
                "run_mean_us": g.run_total / g.run_n,
                "run_p50_us": p50,
                "run_p95_us": p95,
                "run_p99_us": p99,
                "run_max_us": g.run_max,
                "date": day,
            }
        )
    for rows in ranked.values():
        rows.sort(key=_slowest_order)
        for rank, r in enumerate(rows[:slowest_limit], 1):
            tables["slowest_tasks"].append({**r, "rank": rank})
    jm_files = files("jm")
    if jm_files:
        jm = pa.concat_tables([read_ipc(f) for f in jm_files])
        merged = (
            jm.group_by(["jm", "minute"], use_threads=False)
            .aggregate([("attempts", "sum"), ("succeeded", "sum"), ("busy_us", "sum")])
            .rename_columns(["jm", "minute", "attempts", "succeeded", "busy_us"])
        )
        for r in merged.to_pylist():
            busy = r["busy_us"] or 0
            tables["jm_minute"].append(
                {
                    "jm": r["jm"],
                    "minute": r["minute"],
                    "attempts": r["attempts"],
                    "succeeded": r["succeeded"],
                    "failed": r["attempts"] - r["succeeded"],
                    "busy_us": busy,
                    "utilisation": busy / 60e6,
                    "date": _day(r["minute"]),
                }
            )
    failure_files = files("failures")
    if failure_files:
        failures = pa.concat_tables([read_ipc(f) for f in failure_files])
        failure_keys = ["queue", "task", "error", "minute"]
        merged = (
            failures.group_by(failure_keys, use_threads=False)
            .aggregate([("failures", "sum")])
            .rename_columns([*failure_keys, "failures"])
        )
        for r in merged.to_pylist():
            tables["failures"].append({**r, "date": _day(r["minute"])})
    return tables


_COUNT_COLUMNS = ("jobs", "succeeded", "failed", "timed_out", "retried")


def _minute_schema(keys: list[str]) -> pa.Schema:
    fields = [pa.field(k, pa.string()) for k in keys]
    fields.append(pa.field("minute", UTC_US))
    fields += [pa.field(c, pa.int64(), nullable=c != "jobs") for c in _COUNT_COLUMNS]
    fields += [pa.field("throughput", pa.float64()), pa.field("run_total_us", pa.int64())]
    fields += [pa.field(f"{n}_{p}_us", pa.int64()) for n in LATENCIES for p in PERCENTILE_NAMES]
    return pa.schema(fields)


# The metric tables' columns and types, as Spark writes them (``date``: the partition).
METRIC_SCHEMAS: dict[str, pa.Schema] = {
    "task_minute": _minute_schema(["queue", "task"]),
    "queue_minute": _minute_schema(["queue"]),
    "jm_minute": pa.schema(
        [
            ("jm", pa.string()),
            ("minute", UTC_US),
            pa.field("attempts", pa.int64(), nullable=False),
            ("succeeded", pa.int64()),
            ("failed", pa.int64()),
            ("busy_us", pa.int64()),
            ("utilisation", pa.float64()),
        ]
    ),
    "failures": pa.schema(
        [
            ("queue", pa.string()),
            ("task", pa.string()),
            ("error", pa.string()),
            ("minute", UTC_US),
            pa.field("failures", pa.int64(), nullable=False),
        ]
    ),
    "slowest_tasks": pa.schema(
        [
            ("queue", pa.string()),
            ("task", pa.string()),
            pa.field("jobs", pa.int64(), nullable=False),
            ("run_mean_us", pa.float64()),
            ("run_p50_us", pa.int64()),
            ("run_p95_us", pa.int64()),
            ("run_p99_us", pa.int64()),
            ("run_max_us", pa.int64()),
            pa.field("rank", pa.int32(), nullable=False),
        ]
    ),
}


def write_metric_table(
    rows: list[dict[str, Any]], schema: pa.Schema, path: Path, dates: list[dt.date]
) -> None:
    """``rows`` as the date-partitioned table at ``path``, replacing the partitions
    of ``dates`` (Spark's dynamic partition overwrite: other dates stay; a date of
    ``dates`` without rows is left empty, as Spark leaves it: removed)."""
    by_date: dict[dt.date, list[dict[str, Any]]] = {d: [] for d in dates}
    for r in rows:
        by_date.setdefault(r["date"], []).append(r)
    path.mkdir(parents=True, exist_ok=True)
    for day, chunk in by_date.items():
        part = path / f"date={day.isoformat()}"
        fresh = path / f".date={day.isoformat()}.{uuid.uuid4().hex}"
        if chunk:
            fresh.mkdir()
            columns = {f.name: [r[f.name] for r in chunk] for f in schema}
            for f in schema:
                if f.type == UTC_US:
                    columns[f.name] = pa.array(columns[f.name], pa.int64()).cast(UTC_US)
            table = pa.table(columns, schema=schema)
            pq.write_table(
                table,
                str(fresh / f"part-00000-{uuid.uuid4().hex}.snappy.parquet"),
                compression="snappy",
                use_deprecated_int96_timestamps=True,
            )
        old = None
        if part.exists():
            old = path / f".old-{part.name}.{uuid.uuid4().hex}"
            part.rename(old)
        if chunk:
            fresh.rename(part)
        if old is not None:
            import shutil

            shutil.rmtree(old, ignore_errors=True)
