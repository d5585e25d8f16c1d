"""Unique jobs (issue 33): the headers' parsing and the broker's held keys
(broker/unique.py), without sockets; tests/e2e/test_unique.py has the processes."""

from __future__ import annotations

import pytest

from emq_django.broker.journal import StoredJob
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


def row(job_id: bytes, state: str, headers: bytes, updated_at: float) -> StoredJob:
    return StoredJob(job_id, "q", headers, b"", state, 1, 0.0, 0.0, "", updated_at)


def test_restored_rows_hold_their_keys_and_unsaved_jobs_free_theirs() -> None:
    keys = UniqueKeys()
    rows = [
        row(b"spilled-1", "spilled", b"guarantee,unique:s", 0.0),
        row(b"done-1", "done", b"guarantee,unique:d,unique-for:100", 950.0),  # 50 s left
        row(b"done-2", "done", b"guarantee,unique:old,unique-for:10", 950.0),  # over
        row(b"plain", "done", b"guarantee", 990.0),
    ]
    keys.restore_ended(rows, now=5.0, wall=1000.0)
    assert keys.holder("s", 5.0) == b"spilled-1"
    assert keys.holder("d", 54.9) == b"done-1"
    assert keys.holder("d", 55.0) is None
    assert keys.holder("old", 5.0) is None
    keys.hold("n", b"new-1", "q")
    keys.forget({b"new-1", b"spilled-1"})  # a journal commit failed
    assert keys.holder("n", 5.0) is None and keys.holder("s", 5.0) is None


def test_a_restored_spilled_job_cancelled_ends_its_key_with_its_unique_for() -> None:
    """A spilled row read at start-up holds its key; cancelled, the key is kept its
    unique-for from the cancel (the journal then keeps the row: True)."""
    keys = UniqueKeys()
    keys.restore_ended(
        [
            row(b"s-10", "spilled", b"guarantee,unique:a,unique-for:10", 0.0),
            row(b"s-0", "spilled", b"guarantee,unique:b", 0.0),
        ],
        now=5.0,
        wall=1000.0,
    )
    assert keys.end_spilled(b"s-10", 6.0) is True
    assert keys.holder("a", 15.9) == b"s-10" and keys.holder("a", 16.0) is None
    assert keys.end_spilled(b"s-0", 6.0) is False and keys.holder("b", 6.0) is None
    assert keys.end_spilled(b"never-spilled", 6.0) is False and keys.spilled == {}
