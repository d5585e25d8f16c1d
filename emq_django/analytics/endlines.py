"""The final path's reader: the lines that end an attempt, mostly without a JSON parser.

The broker writes every line compactly, its keys in one order, with no
whitespace (emq_django.broker.trace). The trace is read as text; a byte test at
fixed positions drops the lines that cannot end an attempt (``drop_line``); of
the rest, a line in the broker's exact layout (``LAYOUT``) is cut into its
fields with string functions (``split`` at commas, fixed key prefixes, casts
checked by printing the number back), every byte of it accounted for; any other
line (escapes, whitespace, another key order, another writer, a truncated or
malformed line) goes through ``from_json`` with the same schema. The fast cut
is taken only when it is provably what a JSON parse gives:

- the line starts with ``{"ts":`` and ends with its only ``}``, has no
  backslash (so no escape: every ``"`` delimits a string, and ``"key":`` can
  only be a key) and no ASCII control character where a string may hold one;
- split at commas it has exactly the broker's keys, in its order, each part
  ``"key":value`` with nothing left over: no nesting, no duplicate key, no
  unknown key (a string holding a comma or ``}`` also falls back);
- a string value is ``"..."`` with no other quote; a number is the decimal
  that the cast prints back (no sign but ``-``, no leading zero, no fraction,
  exponent or overflow); ``final`` is ``true`` or ``false``; task, jm and
  error may be ``null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from emq_django.analytics.transforms import END_COLUMNS, EVENT_SCHEMA

END_SCHEMA = StructType([f for f in EVENT_SCHEMA.fields if f.name in END_COLUMNS])
_TYPES = {f.name: f.dataType.simpleString() for f in END_SCHEMA.fields}

# Broker lines: ``{"ts":`` and 16 digits (2001-2286), so ``,"event":"`` at
# character 23. A line whose first event is not one that ends an attempt (the
# four first letters, no backslash among them) cannot be one: the JSON reader
# with its pushed ``event`` filter drops it too (a ts that is not a number makes
# a null ts, which is dropped as well).
_NOT_ENDS = ("enqueued", "dispatched", "requeued", "retried", "cancelled")
_EVENT_AT = 23
_NOT_END_MARKS = [f',"event":"{e[:4]}' for e in _NOT_ENDS]

# The layout of a line that ends an attempt (format 2), key by key; ``?``: may
# be absent (then in this order), ``s``: a string, ``s0``: a string or null,
# ``i``/``l``: an int/long, ``b``: a boolean.
LAYOUT: tuple[tuple[str, str, bool], ...] = (
    ("ts", "l", False),
    ("event", "s", False),
    ("job", "s", False),
    ("attempt", "i", False),
    ("task", "s0", False),
    ("queue", "s", False),
    ("jm", "s0", False),
    ("run_us", "l", False),
    ("total_us", "l", False),
    ("final", "b", False),
    ("retries", "i", True),
    ("requeues", "i", True),
    ("partials", "l", True),
    ("error", "s0", True),
)
_FIXED = [k for k, _, optional in LAYOUT if not optional]
_OPTIONAL = [k for k, _, optional in LAYOUT if optional]
_CONTROL = "[\\x00-\\x1f]"


def drop_line(value: Column) -> Column:
    """True for a line that provably ends no attempt (read it no further)."""
    return value.startswith('{"ts":') & F.substring(value, _EVENT_AT, 14).isin(_NOT_END_MARKS)


def _number(text: Column, kind: str) -> tuple[Column, Column]:
    """(value, whether ``text`` is exactly that number as JSON writes it)."""
    n = text.try_cast("int" if kind == "i" else "bigint")
    return n, n.cast("string") == text


def _string(part: Column, prefix: str, nullable: bool) -> tuple[Column, Column]:
    """(value, ok) of ``"key":"..."`` (or ``"key":null``) ``part``, ``prefix`` its
    ``"key":`` (checked by the caller): one closing quote, at the end."""
    content = F.substring_index(F.substring(part, len(prefix) + 2, 1 << 30), '"', 1)
    quoted = F.substring(part, len(prefix) + 1, 1) == '"'
    ok = quoted & (F.octet_length(content) + 2 + len(prefix) == F.octet_length(part))
    if nullable:
        is_null = part == prefix + "null"
        return F.when(~is_null, content), ok | is_null
    return content, ok


def fast_fields(lines: DataFrame, control: bool = True) -> DataFrame:
    """``value`` lines -> the END_COLUMNS cut by position, and ``_fast``: whether the
    line is in the broker's layout (else the columns are meaningless)."""
    v = F.col("value")
    body = F.substring_index(v, "}", 1)
    shape = (
        v.startswith('{"ts":')
        & (F.octet_length(body) + 1 == F.octet_length(v))
        & ~v.contains("\\")
    )
    parts = F.split(F.substring(body, 2, 1 << 30), ",", -1)
    df = lines.select(v, shape.alias("_shape"), parts.alias("_p"))
    n_fixed = len(_FIXED)
    p = F.col("_p")
    # the optional keys' positions: each present one moves the next one on
    index = F.lit(n_fixed)
    positions = {}
    for key in _OPTIONAL:
        here = F.get(p, index)
        present = F.coalesce(here.startswith(f'"{key}":'), F.lit(False))
        positions[key] = F.when(present, index)
        index = index + present.cast("int")
    df = df.select("*", *[c.alias(f"_at_{k}") for k, c in positions.items()], index.alias("_n"))
    values = {}
    checks = [F.col("_shape"), F.size(p) == F.col("_n")]
    for i, (key, kind, optional) in enumerate(LAYOUT):
        part = F.get(p, F.col(f"_at_{key}")) if optional else F.get(p, F.lit(i))
        prefix = f'"{key}":'
        has_key = part.startswith(prefix)
        if kind in ("i", "l"):
            value, ok = _number(F.substring(part, len(prefix) + 1, 1 << 30), kind)
        elif kind == "b":
            text = F.substring(part, len(prefix) + 1, 6)
            value = F.when(text == "true", F.lit(True)).when(text == "false", F.lit(False))
            ok = value.isNotNull() & (F.octet_length(part) == len(prefix) + F.octet_length(text))
        else:
            value, ok = _string(part, prefix, kind == "s0")
        ok = has_key & ok
        if optional:
            ok = part.isNull() | ok
        checks.append(F.coalesce(ok, F.lit(False)))
        if key in _TYPES:
            values[key] = value
    fast = checks[0]
    for c in checks[1:]:
        fast = fast & c
    if control:
        strings = F.concat_ws("", *[values[k] for k in ("job", "task", "queue", "jm", "error")])
        fast = fast & ~strings.rlike(_CONTROL)
    row = F.struct(*[values[k].cast(_TYPES[k]).alias(k) for k in END_COLUMNS])
    return df.select("value", row.alias("_row"), F.coalesce(fast, F.lit(False)).alias("_fast"))


def parse_ends(lines: DataFrame, control: bool = True) -> DataFrame:
    """``value`` lines -> END_COLUMNS of every line (null where not JSON), cut by
    position where ``fast_fields`` can, else parsed by ``from_json``; and ``_fast``."""
    cut = fast_fields(lines, control)
    row = F.when(F.col("_fast"), F.col("_row")).otherwise(F.from_json(F.col("value"), END_SCHEMA))
    return cut.select(F.inline(F.array(row)), "_fast")


def read_ends(spark: SparkSession, paths: Sequence[Path | str], control: bool = True) -> DataFrame:
    """The lines of ``paths`` that may end an attempt, as END_COLUMNS (not cleaned)."""
    lines = spark.read.text([str(p) for p in paths])
    return parse_ends(lines.where(~drop_line(F.col("value"))), control)

