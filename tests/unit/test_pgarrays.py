"""The PostgreSQL journal's arrays made in one pass (``broker/pgarrays.py``): the same
bytes as psycopg's own binary dump of the same list, NULLs and empty arrays included
(the server reads them back in ``tests/integration/test_journal_pg.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from emq_django.broker import pgarrays

psycopg = pytest.importorskip("psycopg")


def psycopg_dump(values: list[Any]) -> bytes:
    from psycopg.adapt import PyFormat, Transformer

    tx = Transformer()
    dumper = tx.get_dumper(values, PyFormat.BINARY)
    return bytes(dumper.dump(values))


@pytest.mark.parametrize(
    "values",
    [[b"a", b"", b"\x00\xff" * 40], [b"a", None, b"c"], [b"x", None]],
    ids=["bytes", "with-null", "null-last"],
)
def test_bytea_arrays_are_psycopg_s(values: list[bytes | None]) -> None:
    made = pgarrays.bytea_array(values)
    assert made.oid == 1001
    assert made.data == psycopg_dump(values)


def test_text_float_and_int_arrays_are_psycopg_s() -> None:
    from psycopg.types.numeric import Int4

    assert pgarrays.text_array(["default", "défaut"]).data == psycopg_dump(["default", "défaut"])
    floats = [0.0, 1.5, -2.25, 1e300]
    assert pgarrays.float8_array(floats).data == psycopg_dump(floats)
    assert pgarrays.float8_array([0, 3]).data == psycopg_dump([0.0, 3.0])  # ints as floats
    ints = [0, 3, -5, 2**31 - 1]
    assert pgarrays.int4_array(ints).data == psycopg_dump([Int4(i) for i in ints])


def test_empty_arrays_have_their_element_type() -> None:
    """psycopg dumps an empty list without an element type; ours keep theirs."""
    for made, element in (
        (pgarrays.bytea_array([]), pgarrays.BYTEA),
        (pgarrays.text_array([]), pgarrays.TEXT),
        (pgarrays.int4_array([]), pgarrays.INT4),
        (pgarrays.float8_array([]), pgarrays.FLOAT8),
    ):
        assert made.data == (0).to_bytes(4, "big") * 2 + element.to_bytes(4, "big")
