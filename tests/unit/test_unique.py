"""Unique jobs (issue 33): the headers' parsing and the broker's held keys
(broker/unique.py), without sockets; tests/e2e/test_unique.py has the processes."""

from __future__ import annotations

import pytest

from emq_django.broker.unique import UniqueKeys
from emq_django.exceptions import ProtocolError
from emq_django.protocol.headers import format_headers, parse_headers
from emq_django.protocol.limits import REFUSED_BAD_HEADER


def test_the_headers_carry_the_key_and_its_time() -> None:
    raw = format_headers(reply_requested=True, unique="k-1", unique_for=30)
    assert raw == b"reply-requested,unique:k-1,unique-for:30"
    headers = parse_headers(raw)
    assert (headers.unique, headers.unique_for) == ("k-1", 30.0)
    assert parse_headers(b"reply-requested").unique == ""  # an EventMQ peer's


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"unique:", "needs a key of 1 to 200 characters"),
        (b"unique:" + b"k" * 201, "needs a key of 1 to 200 characters"),
        (b"unique:k,unique-for:-1", "must be a finite number >= 0"),
        (b"unique:k,unique-for:soon", "needs a number"),
        (b"unique:k,unique-for:99999999999", "the most is"),
    ],
)
def test_a_bad_unique_header_is_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as caught:
        parse_headers(raw)
    assert caught.value.code == REFUSED_BAD_HEADER


def test_format_headers_refuses_a_bad_key_at_the_call_site() -> None:
    with pytest.raises(ValueError, match="comma"):
        format_headers(unique="a,b")
    with pytest.raises(ValueError, match="unique_for"):
        format_headers(unique="k", unique_for=-1)


def test_a_key_is_held_while_the_job_lives_then_for_its_unique_for() -> None:
    keys = UniqueKeys()
    assert keys.holder("k", 0.0) is None
    keys.hold("k", b"job-1", "q")
    assert keys.holder("k", 1.0) == b"job-1"
    keys.release("k", b"other", 0.0, 1.0)  # not the holder: nothing changes
    assert keys.holder("k", 1.0) == b"job-1"
    keys.release("k", b"job-1", 10.0, 2.0)  # ended: kept until 12
    assert keys.holder("k", 11.9) == b"job-1"
    assert keys.by_queue(11.9) == {"q": 1}
    assert keys.holder("k", 12.0) is None
    assert len(keys) == 0
    keys.hold("k", b"job-2", "q")
    keys.release("k", b"job-2", 0.0, 13.0)  # no unique_for: free at once
    assert keys.holder("k", 13.0) is None
