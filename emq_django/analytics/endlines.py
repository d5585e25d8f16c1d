"""The end pass's reading: trace files cut into byte ranges at line starts
(``plan_splits``), and the lines that end a job, parsed with Arrow (``end_lines``).
Runs in Spark's Python workers; see analytics/endpass.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from emq_django.analytics.schema import (
    FINAL_EVENTS,
    MAX_US,
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
