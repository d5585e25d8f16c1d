"""The final path's one pass over trace files, in Spark's Python workers, with Arrow.

A batch of trace files whose attempt ends all carry ``final`` (docs/trace-format.md)
needs, of each job, only its ``"final":true`` line. This pass reads the files once,
cut into byte ranges at line starts (``plan_splits``; one Spark task each, an RDD
of the ranges' numbers), and in each range, in the worker's Python process:

1. keeps the lines that can end a job (``candidate_lines``: the broker's lines are
   told apart by their first 34 bytes, numpy over the whole range; a line in any
   other form is kept too) and parses them with pyarrow's JSON reader (C++); a
   block it refuses is halved until the bad lines are found, which are read one
   at a time as Spark's PERMISSIVE reader reads them (``_coerce``: a field of the
   wrong type is null, a line that is not JSON is dropped);
2. turns the final lines into job facts (``job_facts``: the columns, types and
   values of ``transforms.final_job_facts``) and writes them as Parquet, per date,
   into the pass's directory (``jobs/date=.../``), under names that are the same
   when a task is run again;
3. computes, from the same rows, the partial metrics of its range (``partials``):
   per queue x task x minute the counts, sums and the three latencies' values, per
   job manager x minute and per queue x task x error x minute the counts, written
   beside them (Arrow IPC).

The driver then merges the partials (``merge``): the groups of one queue x task x
minute from several ranges, a queue's minute from its tasks, a task's day from its
minutes. So the trace is read once, the job facts are written once and never read
back in the batch, and no JVM code is generated for any of it. A group's
percentile is the value of rank ceil(p n) while the group has at most
``schema.PERCENTILE_SKETCH_K`` values (what a KLL sketch of that k, as
``transforms`` uses, gives) and comes from such a sketch beyond (Apache
DataSketches' C++ library; within KLL's rank error): ``_Values``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from emq_django.analytics.schema import (
    DEAD_LETTERED,
    FINAL_EVENTS,
    LATENCIES,
    MAX_US,
    PERCENTILE_NAMES,
    PERCENTILE_SKETCH_K,
    PERCENTILES,
    SUCCEEDED,
    TIMED_OUT,
)

# One Spark task per this many bytes of trace (a file is cut at line starts).
SPLIT_BYTES = 48 << 20
MINUTE_US = 60_000_000
DAY_US = 86_400_000_000

# The fields of the lines that end an attempt or a job, as the JSON reader types
# them (transforms.EVENT_SCHEMA, without the fields no end line needs).
END_SCHEMA = pa.schema(
    [
        ("ts", pa.int64()),
        ("event", pa.string()),
        ("job", pa.string()),
        ("attempt", pa.int32()),
        ("task", pa.string()),
        ("queue", pa.string()),
        ("jm", pa.string()),
        ("run_us", pa.int64()),
        ("total_us", pa.int64()),
        ("error", pa.string()),
        ("final", pa.bool_()),
        ("retries", pa.int32()),
        ("requeues", pa.int32()),
    ]
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


@dataclass(frozen=True)
class Split:
    path: str
    start: int
    end: int


def plan_splits(paths: Iterable[Path | str], split_bytes: int = SPLIT_BYTES) -> list[Split]:
    """Byte ranges of about ``split_bytes`` covering ``paths`` (a line belongs to the
    range it starts in)."""
    splits = []
    for p in paths:
        size = os.path.getsize(p)
        n = max(1, -(-size // split_bytes))
        step = -(-size // n) if size else 0
        for i in range(n):
            start = i * step
            end = min(size, start + step)
            if end > start or (size == 0 and i == 0):
                splits.append(Split(str(p), start, end))
    return splits


def _line_start(f: Any, pos: int) -> int:
    """The offset of the first line that starts at or after ``pos`` (the file's
    size if none does)."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    while True:
        chunk = f.read(1 << 16)
        if not chunk:
            return f.tell()
        nl = chunk.find(b"\n")
        if nl >= 0:
            return f.tell() - len(chunk) + nl + 1


def read_split(split: Split) -> bytes:
    """The whole lines that start in ``[start, end)`` of the file."""
    with open(split.path, "rb") as f:
        start = _line_start(f, split.start)
        end = _line_start(f, split.end)
        f.seek(start)
        return f.read(max(0, end - start))


# ---- parsing ------------------------------------------------------------------


# The broker's lines start with ``{"ts":`` and 16 digits (µs from 2001 to 2286),
# then ``,"event":"`` and the event: two letters of it tell whether it can be one
# that ends an attempt or a job (succeeded, failed, timed_out, dead_lettered).
# Each line's first 34 bytes are read as little-endian words (unaligned views).
_HEAD = b'{"ts":0000000000000000,"event":"'
_EVENT_AT = len(_HEAD)


def _word(b: bytes) -> int:
    return int.from_bytes(b, "little")


_TS_KEY = _word(b'{"ts":')  # bytes 0-5, as the low 6 of a word at 0
_EVENT_KEY = (_word(b',"event"'), _word(b':"'))  # bytes 22-29 and 30-31
_END_STARTS = [_word(e[:2].encode()) for e in FINAL_EVENTS]  # bytes 32-33
_HIGH, _LOW = 0xF0F0F0F0F0F0F0F0, 0x0F0F0F0F0F0F0F0F


def _all_digits(words: np.ndarray) -> np.ndarray:
    """Whether each byte of each word is an ASCII digit (0x30-0x39)."""
    high_ok = (words & np.uint64(_HIGH)) == np.uint64(0x3030303030303030)
    low = words & np.uint64(_LOW)
    return high_ok & (((low + np.uint64(0x0606060606060606)) & np.uint64(_HIGH)) == 0)


def candidate_lines(data: bytes) -> list[bytes]:
    """The lines of ``data`` (no newline) that may end an attempt or a job: every
    line in the broker's form whose event begins as one of those does, and every
    line not in that form (blank lines aside), which the JSON parse then judges.
    The form is tested on the line's first bytes, where no string can start
    before the event's: a line so tested holds its ``event`` there."""
    if not data:
        return []
    a = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(a == 10)
    if not data.endswith(b"\n"):
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    keep = ends > starts  # blank lines are no events
    long_enough = ends - starts >= _EVENT_AT + 2
    at = starts[long_enough]
    if len(at):
        u64 = np.ndarray((len(data) - 7,), "<u8", data, 0, (1,))
        u16 = np.ndarray((len(data) - 1,), "<u2", data, 0, (1,))
        ours = (u64[at] & np.uint64((1 << 48) - 1)) == np.uint64(_TS_KEY)
        ours &= _all_digits(u64[at + 6]) & _all_digits(u64[at + 14])
        ours &= u64[at + 22] == np.uint64(_EVENT_KEY[0])
        ours &= u16[at + 30] == _EVENT_KEY[1]
        maybe_end = np.isin(u16[at + _EVENT_AT], _END_STARTS)
        keep[long_enough] = ~ours | maybe_end
    idx = np.flatnonzero(keep)
    return [data[s:e] for s, e in zip(starts[idx].tolist(), ends[idx].tolist(), strict=True)]


def _read_json(data: bytes, schema: pa.Schema) -> pa.Table:
    return pj.read_json(
        pa.py_buffer(data),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )


def _coerce(value: Any, kind: pa.DataType) -> Any:
    """One JSON value as Spark's JSON reader types it for ``kind`` in PERMISSIVE
    mode: a value that does not fit is null (the line keeps its other fields); a
    string field takes any value, a non-string as its JSON text."""
    if value is None:
        return None
    if pa.types.is_string(kind):
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate (\ud800): "?", as the JVM writes it
            text = text.encode("utf-8", "replace").decode()
        return text
    if pa.types.is_boolean(kind):
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    bits = kind.bit_width - 1
    return value if -(1 << bits) <= value < (1 << bits) else None


def _parse_lines(lines: list[bytes], schema: pa.Schema) -> pa.Table:
    """Lines one at a time (the slow way, for blocks with a bad line)."""
    columns: dict[str, list[Any]] = {f.name: [] for f in schema}
    decode = json.JSONDecoder().raw_decode
    for line in lines:
        try:
            # the first JSON value of the line; what follows it is ignored, as
            # Spark's reader ignores it
            doc, _ = decode(line.decode().strip())
        except ValueError:  # not JSON (or not UTF-8): no event
            continue
        if not isinstance(doc, dict):
            continue
        for f in schema:
            columns[f.name].append(_coerce(doc.get(f.name), f.type))
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)


def parse(lines: list[bytes], schema: pa.Schema) -> pa.Table:
    """``lines`` (no newline; empty ones are skipped) -> a table of ``schema``. The
    C++ reader parses a block at once; a block it refuses (a line that is not a
    JSON object, a field of another type) is halved until the bad lines are found,
    and those are parsed alone (``_parse_lines``)."""
    lines = [line for line in lines if line.strip()]
    if not lines:
        return schema.empty_table()
    try:
        return _read_json(b"\n".join(lines), schema)
    except pa.ArrowException:
        if len(lines) <= 32:
            return _parse_lines(lines, schema)
    half = len(lines) // 2
    return pa.concat_tables([parse(lines[:half], schema), parse(lines[half:], schema)])


@dataclass
class Counts:
    ends: int = 0  # lines ending an attempt or a job (the observation of the Spark path)
    final: int = 0  # of which "final": true
    legacy: int = 0  # of which without "final" (an older broker's)

    def add(self, other: Counts) -> None:
        self.ends += other.ends
        self.final += other.final
        self.legacy += other.legacy


def end_lines(data: bytes, since_us: int | None, until_us: int | None) -> tuple[pa.Table, Counts]:
    """The lines of ``data`` that end an attempt or a job, cleaned as
    ``transforms.clean_events`` and ``io.window_events`` clean them, and their counts."""
    table = parse(candidate_lines(data), END_SCHEMA)
    ts = table["ts"]
    keep = pc.and_(
        pc.and_(pc.is_valid(ts), pc.is_valid(table["job"])),
        pc.is_in(table["event"], pa.array(list(FINAL_EVENTS))),
    )
    keep = pc.and_(keep, pc.and_(pc.greater_equal(ts, 0), pc.less(ts, MAX_US)))
    for d in ("run_us", "total_us"):
        fits = pc.and_(pc.greater(table[d], -MAX_US), pc.less(table[d], MAX_US))
        column = pc.if_else(pc.fill_null(fits, False), table[d], pa.nulls(len(table), pa.int64()))
        table = table.set_column(table.schema.get_field_index(d), d, column)
    if since_us is not None:
        keep = pc.and_(keep, pc.greater_equal(table["ts"], since_us))
    if until_us is not None:
        keep = pc.and_(keep, pc.less(table["ts"], until_us))
    ends = table.filter(pc.fill_null(keep, False))
    final = ends["final"]
    counts = Counts(
        ends=ends.num_rows,
        final=int(pc.sum(pc.fill_null(final, False).cast(pa.int64())).as_py() or 0),
        legacy=final.null_count,
    )
    return ends, counts


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


# ---- the Spark task -----------------------------------------------------------------


def scan_split(
    index: int, split: Split, directory: Path, since_us: int | None, until_us: int | None
) -> dict[str, Any]:
    """One range: its job facts to ``directory/jobs``, its partials to
    ``directory/partials``; returns its counts."""
    ends, counts = end_lines(read_split(split), since_us, until_us)
    dates: list[str] = []
    jobs = 0
    if not counts.legacy and counts.final:
        facts, days = job_facts(ends)
        jobs = facts.num_rows
        # unique to this pass (its directory's name), the same if the task runs again
        name = f"part-{index:05d}-{directory.name}"
        dates = write_jobs(facts, days, directory / "jobs", name)
        out = directory / "partials"
        out.mkdir(parents=True, exist_ok=True)
        for kind, table in partials(facts).items():
            write_ipc(table, out / f"{kind}-{index:05d}.arrow")
    return {
        "split": index,
        "ends": counts.ends,
        "final": counts.final,
        "legacy": counts.legacy,
        "jobs": jobs,
        "dates": ",".join(dates),
    }


def _task(
    indexes: Iterable[int],
    splits: list[Split],
    directory: str,
    since_us: int | None,
    until_us: int | None,
) -> Iterator[dict[str, Any]]:
    for index in indexes:
        yield scan_split(index, splits[index], Path(directory), since_us, until_us)


@dataclass
class PassResult:
    counts: Counts = field(default_factory=Counts)
    jobs: int = 0
    dates: list[dt.date] = field(default_factory=list)


def run(
    spark: Any,
    paths: list[Path],
    directory: Path,
    since_us: int | None = None,
    until_us: int | None = None,
    split_bytes: int | None = None,
) -> PassResult:
    """The pass over ``paths``, one Spark task per range of about ``split_bytes``
    (default ``SPLIT_BYTES``); its files in ``directory``."""
    import functools

    splits = plan_splits(paths, split_bytes or SPLIT_BYTES)
    result = PassResult()
    if not splits:
        return result
    directory.mkdir(parents=True, exist_ok=True)
    task = functools.partial(
        _task, splits=splits, directory=str(directory), since_us=since_us, until_us=until_us
    )
    # An RDD of the ranges' numbers, one per partition: the rows that come back are
    # a few counts each (the facts and partials are files), and the RDD API needs
    # no Arrow transport (and no pandas) between the JVM and the workers.
    ids = spark.sparkContext.parallelize(range(len(splits)), len(splits))
    dates: set[str] = set()
    for row in ids.mapPartitions(task).collect():
        result.counts.add(Counts(row["ends"], row["final"], row["legacy"]))
        result.jobs += row["jobs"]
        dates.update(d for d in row["dates"].split(",") if d)
    result.dates = sorted(dt.date.fromisoformat(d) for d in dates)
    return result


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
