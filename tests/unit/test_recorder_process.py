"""The job records' trip from a worker process to its job manager's recorder
process: the message format, and the forwarder over a real ZeroMQ socket."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import zmq

from emq_django.worker.recorder_process import (
    RecordForwarder,
    decode_records,
    encode_records,
    parse_priority,
)
from emq_django.worker.recording import JobRecord


def rec(job_id: str = "a1", **kw: Any) -> JobRecord:
    fields: dict[str, Any] = dict(
        job_id=job_id,
        attempt=2,
        task="app.tasks.send",
        queue="mail",
        args=["ü", 1, None],
        kwargs={"to": ["x@example.com"], "n": 1.5},
        started=1_795_000_000.25,
        finished=1_795_000_001.5,
        failed=False,
        error_type="",
        body=b'{"value":{"sent":true}}',
        manager="host:42",
    )
    fields.update(kw)
    return JobRecord(**fields)


def test_records_survive_the_trip_field_for_field() -> None:
    records = [
        rec(),
        rec("b2", failed=True, error_type="ValueError", lost=True, retry_count=3),
        # a REPLY body that is not UTF-8 comes back byte for byte
        rec("c3", body=b'{"value":"\xff\xfe"}'),
    ]
    message = encode_records(records)
    assert isinstance(message, bytes)
    assert decode_records(message) == records


@pytest.mark.parametrize(
    "message",
    [
        b"not json",
        b'{"a": 1}',
        b"[1, 2]",
        json.dumps([["too", "short"]]).encode(),
        json.dumps([[*list(rec())[:10], 5, "host:1", False, 0]]).encode(),  # body not text
    ],
)
def test_malformed_messages_raise_value_error(message: bytes) -> None:
    with pytest.raises((ValueError, IndexError)):
        decode_records(message)


def test_forwarder_sends_one_message_per_flush(tmp_path: Any) -> None:
    context: zmq.Context[Any] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/rec.sock"
    pull = context.socket(zmq.PULL)
    pull.bind(endpoint)
    forwarder = RecordForwarder(context, endpoint, max_buffer=5)
    try:
        forwarder.flush()  # nothing recorded: nothing sent
        assert not pull.poll(50)
        forwarder.record(rec("1"))
        forwarder.record(rec("2"))
        forwarder.flush()
        assert pull.poll(2000)
        assert [r.job_id for r in decode_records(pull.recv())] == ["1", "2"]
        assert forwarder.sent == 2 and not forwarder._records
    finally:
        forwarder.close(linger=0)
        pull.close(linger=0)
        context.term()


def test_forwarder_keeps_what_it_cannot_send_then_sends_it(tmp_path: Any) -> None:
    """No recorder process yet: the socket's queue fills, then the forwarder keeps
    records (at most max_buffer, the oldest dropped and counted) until it can send."""
    context: zmq.Context[Any] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/rec.sock"
    forwarder = RecordForwarder(context, endpoint, max_buffer=5)
    forwarder.sock.sndhwm = 1
    pull = None
    try:
        for i in range(40):
            forwarder.record(rec(f"x{i}"))
            forwarder.flush()
        kept = [r.job_id for r in forwarder._records]
        assert 0 < len(kept) <= 5 and kept[-1] == "x39"
        assert forwarder.dropped > 0
        pull = context.socket(zmq.PULL)
        pull.bind(endpoint)
        received: list[str] = []
        deadline = time.monotonic() + 5
        while forwarder._records and time.monotonic() < deadline:
            while pull.poll(50):
                received += [r.job_id for r in decode_records(pull.recv())]
            forwarder.flush()
        while pull.poll(200):
            received += [r.job_id for r in decode_records(pull.recv())]
        assert received[-len(kept) :] == kept
        assert forwarder.sent + forwarder.dropped == 40
        assert len(received) == forwarder.sent
    finally:
        forwarder.close(linger=0)
        if pull is not None:
            pull.close(linger=0)
        context.term()


@pytest.mark.parametrize(
    ("text", "nice"), [("idle", None), (" IDLE ", None), ("normal", 0), ("1", 1), ("19", 19)]
)
def test_priority_setting(text: str, nice: int | None) -> None:
    assert parse_priority(text) == nice


@pytest.mark.parametrize("text", ["", "0", "20", "-5", "high", "10.5"])
def test_bad_priority_setting(text: str) -> None:
    with pytest.raises(ValueError, match="idle, normal or a nice value"):
        parse_priority(text)
