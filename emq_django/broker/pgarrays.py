"""The one-statement turn's arrays (``journal_sql.fold_jobs``) in PostgreSQL's binary
array format, made here in one go.

psycopg dumps a list parameter element by element in Python (the element's dumper
called, its length packed, two appends, for every element): with the turn's 14
arrays, about 11 elements per guaranteed job, that was most of the journal writer
thread's Python time (py-spy, issue 32). Here each array is one ``bytes.join`` or
``struct`` pass over iterators (the loops in C), wrapped in a type whose dumper
(``register``) hands the bytes over as they are, with the array's own type (the
statement's placeholders cast to it anyway). The dumpers' types never change, so
the prepared statement is never prepared again for another set of types (an
empty list was dumped with another type than a full one).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from struct import Struct
from typing import Any, cast

BYTEA, INT4, TEXT, FLOAT8 = 17, 23, 25, 701
_HEAD = Struct(">iiiii").pack  # dimensions (1), has nulls, element type, length, lower bound
_EMPTY = Struct(">iii").pack  # no dimensions, no nulls, element type
_LEN = Struct(">i").pack
_INT4 = Struct(">ii").pack  # an element: its length (4), its value
_FLOAT8 = Struct(">id").pack  # an element: its length (8), its value
_NULL = _LEN(-1)


class PgArray:
    """An array parameter made already (``data``: its binary form)."""

    __slots__ = ("data",)
    oid = 0  # the array type's

    def __init__(self, data: bytes) -> None:
        self.data = data


class ByteaArray(PgArray):
    __slots__ = ()
    oid = 1001


class TextArray(PgArray):
    __slots__ = ()
    oid = 1009


class Int4Array(PgArray):
    __slots__ = ()
    oid = 1007


class Float8Array(PgArray):
    __slots__ = ()
    oid = 1022


def _varlen(values: Sequence[bytes | None], element: int) -> bytes:
    if not values:
        return _EMPTY(0, 0, element)
    if None in values:
        items = b"".join(_NULL if v is None else _LEN(len(v)) + v for v in values)
        return _HEAD(1, 1, element, len(values), 1) + items
    whole = cast("Sequence[bytes]", values)  # no None
    items = b"".join(chain.from_iterable(zip(map(_LEN, map(len, whole)), whole, strict=True)))
    return _HEAD(1, 0, element, len(values), 1) + items


def bytea_array(values: Sequence[bytes | None]) -> ByteaArray:
    return ByteaArray(_varlen(values, BYTEA))


def text_array(values: Sequence[str]) -> TextArray:
    return TextArray(_varlen(list(map(str.encode, values)), TEXT))


def int4_array(values: Sequence[int]) -> Int4Array:
    if not values:
        return Int4Array(_EMPTY(0, 0, INT4))
    items = b"".join(map(_INT4, repeat(4), values))
    return Int4Array(_HEAD(1, 0, INT4, len(values), 1) + items)


def float8_array(values: Sequence[float]) -> Float8Array:
    if not values:
        return Float8Array(_EMPTY(0, 0, FLOAT8))
    items = b"".join(map(_FLOAT8, repeat(8), values))
    return Float8Array(_HEAD(1, 0, FLOAT8, len(values), 1) + items)


def register(adapters: Any) -> None:
    """psycopg's dumpers of these types, on ``adapters`` (psycopg's global map:
    connections made afterwards have them). Idempotent."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    def dump(self: Any, obj: PgArray) -> bytes:
        return obj.data

    for cls in (ByteaArray, TextArray, Int4Array, Float8Array):
        dumper = type(
            f"{cls.__name__}Dumper",
            (Dumper,),
            {"oid": cls.oid, "format": Format.BINARY, "dump": dump},
        )
        adapters.register_dumper(cls, dumper)
