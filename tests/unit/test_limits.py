"""The limits the client and the broker both check (protocol/limits.py), and how
the headers parser and the broker core refuse what breaks them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.exceptions import ProtocolError
from emq_django.protocol import PROTOCOL, Error, decode, parse_headers
from emq_django.protocol.headers import format_headers
from emq_django.protocol.limits import (
    MAX_DELAY,
    MAX_DEPTH,
    check_count,
    check_queue_name,
    check_seconds,
    may_nest_deeper_than,
    nested_deeper_than,
    refusal_counter,
)
from tests.emqp_machine import FRONTEND, EmqpMachine

BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [1, 2], "kwargs": {}}]'


def deep(n: int) -> Any:
    value: Any = 0
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "limit", "deeper"),
    [
        (1, 0, False),
        ([], 1, False),
        ([], 0, True),
        (deep(MAX_DEPTH), MAX_DEPTH, False),
        (deep(MAX_DEPTH + 1), MAX_DEPTH, True),
        ({"a": [{"b": [1]}]}, 4, False),
        ({"a": [{"b": [1]}]}, 3, True),
        ((1, (2, (3,))), 3, False),
    ],
)
def test_nested_deeper_than(value: Any, limit: int, deeper: bool) -> None:
    assert nested_deeper_than(value, limit) is deeper


def test_nested_deeper_than_stops_on_a_cycle() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    assert nested_deeper_than(cycle, MAX_DEPTH)


def test_bracket_count_is_a_safe_first_test() -> None:
    assert not may_nest_deeper_than(b"[[1]]", 2)
    assert may_nest_deeper_than('["[[[["]', 2)  # brackets in strings only say maybe


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", ValueError),
        ("q" * 256, ValueError),
        ("é" * 128, ValueError),
        ("a,b", ValueError),
        ("a:b", ValueError),
        ("a b", ValueError),
        ("a\tb", ValueError),
        ("\x00", ValueError),
        ("\ud800", ValueError),
        (b"q", TypeError),
        (None, TypeError),
    ],
)
def test_bad_queue_names(name: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_queue_name(name)


@pytest.mark.parametrize("name", ["default", "q" * 255, "é" * 127, "email.high-prio_2", "日本"])
def test_good_queue_names(name: str) -> None:
    assert check_queue_name(name) == name


def test_counts_and_seconds() -> None:
    assert check_count("retries", 3) == 3
    for bad, error in ((-1, ValueError), (True, TypeError), (1.0, TypeError), ("1", TypeError)):
        with pytest.raises(error):
            check_count("retries", bad)
    assert check_seconds("timeout", 2) == 2.0
    for bad in (-0.1, math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            check_seconds("timeout", bad)
    with pytest.raises(ValueError, match="the most"):
        check_seconds("countdown", MAX_DELAY + 1, MAX_DELAY)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"timeout:-1", "bad-header"),
        (b"timeout:inf", "bad-header"),
        (b"timeout:nan", "bad-header"),
        (b"retry-count:abc", "bad-header"),
        (b"retry-count:1.5", "bad-header"),
        (b"priority:101", "bad-header"),
        (b"priority:-101", "bad-header"),
        (b"priority:1.5", "bad-header"),
        (b"priority:high", "bad-header"),
        (b"priority", "bad-header"),
        (b"run-after:nan", "bad-run-after"),
        (b"run-after:inf", "bad-run-after"),
        (b"run-after:-inf", "bad-run-after"),
        (b"run-after:soon", "bad-run-after"),
        (b"\xff", "bad-header"),
        (b"x" * 5000, "bad-header"),
    ],
)
def test_bad_headers_carry_their_refusal_code(raw: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_headers(raw)
    assert info.value.code == code


def test_format_headers_refuses_what_the_broker_would() -> None:
    for kwargs in (
        {"retry_count": -1},
        {"timeout": -1},
        {"timeout": math.inf},
        {"run_after": math.nan},
        {"run_after": math.inf},
    ):
        with pytest.raises(ValueError):
            format_headers(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        format_headers(retry_count="3")  # type: ignore[arg-type]
    for bad in (101, -101):
        with pytest.raises(ValueError, match="from -100 to 100"):
            format_headers(priority=bad)
    for wrong in (1.0, "5", True, None):
        with pytest.raises(TypeError, match="an int"):
            format_headers(priority=wrong)  # type: ignore[arg-type]


def test_priority_header_round_trips() -> None:
    assert parse_headers(format_headers(priority=-100)).priority == -100
    assert parse_headers(format_headers(priority=100, task="t.f")).priority == 100
    assert format_headers(priority=0) == b""  # the default is not sent
    assert parse_headers(b"task:t.f").priority == 0


def core_with(**config: Any) -> EmqpMachine:
    return EmqpMachine(BrokerConfig(**config), now=100.0, id_prefix=b"b-")


def refusals(core: EmqpMachine) -> list[Error]:
    out, core.out = core.out, []
    return [c for s, _, f in out if s == FRONTEND and isinstance(c := decode(f), Error)]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        (b"run-after:1e308", "bad-run-after"),
        (b"run-after:%d" % (100 + MAX_DELAY + 60), "bad-run-after"),
        (b"run-after:inf", "bad-run-after"),
        (b"timeout:-1", "bad-header"),
        (b"priority:500", "bad-header"),
    ],
)
def test_core_refuses_with_an_error_and_counts_by_code(headers: bytes, code: str) -> None:
    core = core_with()
    core.on_frontend(b"c", [b"", PROTOCOL, b"REQUEST", b"j1", b"q", headers, BODY], 100.0)
    (error,) = refusals(core)
    assert (error.ref_msgid, error.code) == (b"j1", code)
    assert core.counters[refusal_counter(code)] == 1 and core.counters["refused"] == 1
    assert not core.jobs and not core.delayed


def test_core_accepts_run_after_within_the_limit() -> None:
    core = core_with()
    headers = b"run-after:%d" % (100 + MAX_DELAY - 60)
    core.on_frontend(b"c", [b"", PROTOCOL, b"REQUEST", b"j1", b"q", headers, BODY], 100.0)
    assert refusals(core) == [] and b"j1" in core.jobs


def test_core_refuses_a_body_over_the_limit() -> None:
    core = core_with(max_body_bytes=len(BODY) - 1)
    core.on_frontend(b"c", [b"", PROTOCOL, b"REQUEST", b"j1", b"q", b"", BODY], 100.0)
    (error,) = refusals(core)
    assert error.code == "body-too-big" and core.counters["refused_body_too_big"] == 1


def test_a_journaled_job_from_before_the_limits_is_brought_within_them() -> None:
    """A guaranteed job journaled with a retry-count or timeout now refused still
    loads after a restart, its headers (forwarded raw to the worker) at the limit."""
    from emq_django.protocol.headers import parse_stored_headers
    from emq_django.protocol.limits import MAX_RETRIES, MAX_TIMEOUT

    raw = b"guarantee,retry-count:4294967296,timeout:1e308,task:t.add"
    with pytest.raises(ProtocolError):
        parse_headers(raw)
    h = parse_stored_headers(raw)
    assert (h.retry_count, h.timeout, h.guarantee, h.task) == (
        MAX_RETRIES,
        MAX_TIMEOUT,
        True,
        "t.add",
    )
    assert parse_headers(h.raw) == h
    with pytest.raises(ProtocolError):  # what was never valid stays refused
        parse_stored_headers(b"retry-count:-1")


def test_backoff_of_a_job_with_many_failures_stays_at_its_cap() -> None:
    import random

    from emq_django.broker.retry import backoff

    assert backoff(5000, 1.0, 60.0, random.Random(1)) <= 60.0 * 1.2
