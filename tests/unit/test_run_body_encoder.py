"""``RunBodyEncoder`` (what ``Task.delay()`` encodes with) writes the same bytes as
``encode_run_body`` and refuses the same arguments with the same errors."""

from __future__ import annotations

from typing import Any

import pytest

from emq_django.protocol.body import RunBodyEncoder, decode_run_body, encode_run_body

PATH, NAME = "pkg.mod", 'na"mé'

CALLS: list[tuple[Any, Any]] = [
    ((), None),
    ((), {}),
    ([], {}),
    ((1,), None),
    ((-7, 0, 2**70), None),
    (("plain", 'quo"te\\', "line\nbreak\x00", "é\u2028", "\U0001f600"), None),
    ((1, "x", 1.5, True, None, [1, {"a": [2]}]), None),
    ((True,), None),  # a bool is not an int here
    ((), {"k": 1}),
    ((1,), {"z": 1, "a": [None, "é"]}),
    (iter([1, 2]), None),  # any iterable, as list() takes it, but str, bytes, a dict
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_same_bytes_as_the_general_encoder(args: Any, kwargs: Any) -> None:
    if not isinstance(args, tuple | list):
        args = list(args)
    fast = RunBodyEncoder(PATH, NAME).encode(args, kwargs)
    assert fast == encode_run_body(PATH, NAME, args, kwargs)
    body = decode_run_body(fast)
    assert (body.path, body.callable, body.args) == (PATH, NAME, list(args))


def _deep(levels: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(levels):
        inner.append([])
        inner = inner[0]
    return top


def _cycle() -> list[Any]:
    c: list[Any] = []
    c.append(c)
    return c


@pytest.mark.parametrize(
    "args",
    [
        (set(),),
        (float("nan"),),
        (_cycle(),),
        (_deep(101),),
        ({(1, 2): 3},),
        (10**5000,),
        ("\ud800",),
        (1, "\ud800"),
        "ab",  # args='ab' is not the two arguments 'a' and 'b'
        b"ab",
        {"a": 1},
    ],
)
def test_same_refusal_as_the_general_encoder(args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError) as general:  # the docs' promise: TypeError
        encode_run_body(PATH, NAME, args, None)
    with pytest.raises(general.type) as fast:
        RunBodyEncoder(PATH, NAME).encode(args, None)
    assert str(fast.value) == str(general.value)
