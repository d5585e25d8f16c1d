"""The Event BUS codec's fast paths (timestamps and UUIDs on every event) give what
the datetime and uuid modules give, including at half-millisecond edges."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import pytest

from emq_django.exceptions import ProtocolError
from emq_django.protocol.eventbus import decode_ts, decode_uuid, encode_ts, encode_uuid
from emq_django.pubsub import new_uuid


def by_datetime(ts: float) -> bytes:
    when = datetime.fromtimestamp(ts, UTC)
    return (when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z").encode()


def test_timestamps_as_datetime_writes_them() -> None:
    rng = random.Random(14)
    edges = [0.0, 0.0005, 0.9995, 0.9999996, 1.0009999996, 1_795_360_016.7799995]
    values = edges + [rng.uniform(0, 4e9) for _ in range(20_000)]
    values += [rng.randint(0, 2**31) + rng.randint(0, 999) / 1000 + 0.0005 for _ in range(20_000)]
    for ts in values:
        assert encode_ts(ts) == by_datetime(ts), ts
    assert encode_ts(1_795_360_016.0) == b"2026-11-22T15:06:56.000Z"


def test_uuids_both_ways() -> None:
    for _ in range(1000):
        u = uuid.uuid4()
        assert encode_uuid(u.bytes) == str(u).encode()
        for text in (str(u), str(u).upper(), u.hex, "{" + str(u) + "}"):
            assert decode_uuid(text.encode()) == u.bytes
    assert encode_uuid(b"short") == b""
    for bad in (b"x" * 36, b"zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", b"\xff" * 8 + b"-" + b"a" * 27):
        with pytest.raises(ProtocolError):
            decode_uuid(bad)


def test_timestamps_read_back_as_datetime_reads_them() -> None:
    rng = random.Random(15)
    values = [0.0, 0.9995, 1_795_360_016.7799995] + [rng.uniform(0, 4e9) for _ in range(20_000)]
    for ts in values:
        text = encode_ts(ts)
        by_dt = datetime.fromisoformat(text.decode().replace("Z", "+00:00")).timestamp()
        assert decode_ts(text) == by_dt, text
    assert decode_ts(b"2026-13-22T15:06:56.000Z") is None  # no 13th month
    assert decode_ts(b"2026-11-22T15:06:56.5Z") == 1_795_360_016.5  # other forms still read
    assert decode_ts(b"1795360016.25") == 1_795_360_016.25


def test_new_uuids_are_version_4() -> None:
    for _ in range(1000):
        u = uuid.UUID(bytes=new_uuid())
        assert u.version == 4 and u.variant == uuid.RFC_4122
