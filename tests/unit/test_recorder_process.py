"""The job records' trip from a worker process to its job manager's recorder
process: the message format, and the forwarder over a real ZeroMQ socket."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
import zmq

from emq_django.worker.recorder_process import (
    MachineBusy,
    RecordBatch,
    RecorderProcess,
    RecordForwarder,
    decode_batch,
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


def add(batch: RecordBatch | RecordForwarder, record: JobRecord) -> None:
    """What a worker process gives for ``record``: its request and REPLY bodies."""
    request = json.dumps(
        ["run", {"path": "app.tasks", "callable": "send", "args": record.args,
                 "kwargs": record.kwargs}]
    ).encode()  # fmt: skip
    batch.add(
        f"{record.job_id}#{record.attempt}".encode(),
        record.task,
        record.queue,
        round(record.started * 1e6),
        round(record.finished * 1e6),
        record.failed,
        record.error_type,
        record.retry_count,
        request,
        record.body,
        lost=record.lost,
    )


def ids(frames: list[bytes]) -> list[str]:
    return [r.job_id for r in decode_batch(frames)]


def test_records_survive_the_trip_field_for_field() -> None:
    records = [
        rec(),
        rec("b2", failed=True, error_type="ValueError", lost=True, retry_count=3),
        # a REPLY body that is not UTF-8 comes back byte for byte
        rec("c3", body=b'{"value":"\xff\xfe"}'),
        rec("d4", args=[], kwargs={}, attempt=1),
    ]
    batch = RecordBatch("host:42")
    for r in records:
        add(batch, r)
    frames = batch.encode()
    assert all(isinstance(f, bytes) for f in frames)
    assert decode_batch(frames) == records


def test_a_request_that_is_not_a_run_body_records_no_arguments() -> None:
    """A job refused as malformed, or lost (the job manager has no body): the
    record is still made, with empty args and kwargs."""
    batch = RecordBatch("m")
    batch.add(b"x#1", "", "q", 1, 2, True, "ProtocolError", 0, b"\xffnot json", b"{}")
    batch.add(b"y", "", "", 1, 2, True, "WorkerLost", 0, b"", b"{}", lost=True)
    batch.add(b"z#2", "t", "q", 1, 2, False, "", 0, b'["run", {"args": 5}]', b"{}")
    x, y, z = decode_batch(batch.encode())
    assert (x.job_id, x.attempt, x.args, x.kwargs) == ("x", 1, [], {})
    assert (y.job_id, y.attempt, y.lost, y.manager) == ("y", 1, True, "m")
    assert (z.job_id, z.attempt, z.args, z.kwargs) == ("z", 2, [], {})


def header(*row: object) -> bytes:
    return json.dumps({"manager": "m", "rows": [list(row)]}).encode()


GOOD_ROW = ("t", "q", 1, 2, False, "", 0, False, 3, 0, 2)


def _good_header() -> bytes:
    return header(*GOOD_ROW)


@pytest.mark.parametrize(
    "frames",
    [
        [b"not json", b""],
        [b'{"a": 1}', b""],
        [b'{"manager": "m", "rows": [1, 2]}', b""],
        [json.dumps({"manager": "m", "rows": [["too", "short"]]}).encode(), b""],
        [json.dumps({"rows": []}).encode(), b""],  # no manager
        [_good_header()],  # one frame
        [_good_header(), b"a#1{}", b"x"],  # three frames
        [_good_header(), b"a#1{}xx"],  # bodies longer than the rows say
        [_good_header(), b"a#1"],  # ... or shorter
        [header(*GOOD_ROW[:8], -3, 0, 2), b"a#1{}"],  # a negative length
        [header("t", "q", "x", *GOOD_ROW[3:]), b"a#1{}"],  # a time that is no number
        [header(*GOOD_ROW[:6], None, *GOOD_ROW[7:]), b"a#1{}"],  # retry count None
    ],
)
def test_malformed_batches_raise_value_or_type_error(frames: list[bytes]) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode_batch(frames)


def test_the_good_batch_of_the_malformed_ones_decodes() -> None:
    assert ids([_good_header(), b"a#1{}"]) == ["a"]


def test_forwarder_sends_one_message_per_flush(tmp_path: Any) -> None:
    context: zmq.Context[Any] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/rec.sock"
    pull = context.socket(zmq.PULL)
    pull.bind(endpoint)
    forwarder = RecordForwarder(context, endpoint, max_buffer=5, manager="m")
    try:
        forwarder.flush()  # nothing recorded: nothing sent
        assert not pull.poll(50)
        add(forwarder, rec("1"))
        add(forwarder, rec("2"))
        forwarder.flush()
        assert pull.poll(2000)
        assert ids(pull.recv_multipart()) == ["1", "2"]
        assert forwarder.sent == 2 and not len(forwarder)
    finally:
        forwarder.close(linger=0)
        pull.close(linger=0)
        context.destroy(linger=0)


def test_forwarder_keeps_what_it_cannot_send_then_sends_it(tmp_path: Any) -> None:
    """No recorder process yet: the socket's queue fills, then the forwarder keeps
    records (at most max_buffer, the oldest dropped and counted) until it can send."""
    context: zmq.Context[Any] = zmq.Context()
    endpoint = f"ipc://{tmp_path}/rec.sock"
    forwarder = RecordForwarder(context, endpoint, max_buffer=5, manager="m")
    forwarder.sock.sndhwm = 1
    pull = None
    try:
        for i in range(40):
            add(forwarder, rec(f"x{i}"))
            forwarder.flush()
        kept = [f.decode().split("#")[0] for f in forwarder.batch.parts[::3]]
        assert 0 < len(kept) <= 5 and kept[-1] == "x39"
        assert forwarder.dropped > 0
        pull = context.socket(zmq.PULL)
        pull.bind(endpoint)
        received: list[str] = []
        deadline = time.monotonic() + 5
        while len(forwarder) and time.monotonic() < deadline:
            while pull.poll(50):
                received += ids(pull.recv_multipart())
            forwarder.flush()
        while pull.poll(200):
            received += ids(pull.recv_multipart())
        assert received[-len(kept) :] == kept
        assert forwarder.sent + forwarder.dropped == 40
        assert len(received) == forwarder.sent
    finally:
        forwarder.close(linger=0)
        if pull is not None:
            pull.close(linger=0)
        context.destroy(linger=0)


@pytest.mark.parametrize(
    ("text", "nice"), [("idle", None), (" IDLE ", None), ("normal", 0), ("1", 1), ("19", 19)]
)
def test_priority_setting(text: str, nice: int | None) -> None:
    assert parse_priority(text) == nice


@pytest.mark.parametrize("text", ["", "0", "20", "-5", "high", "10.5"])
def test_bad_priority_setting(text: str) -> None:
    with pytest.raises(ValueError, match="idle, normal or a nice value"):
        parse_priority(text)


# ---- the recorder process: a real forked process, real sockets ---------------------

RECORD_FILE_ENV = "EMQ_TEST_RECORD_FILE"


class FileRecorder:
    """A JobRecorder for these tests: each flush appends its job ids as one line."""

    def __init__(self) -> None:
        self.pending: list[str] = []

    def record(self, record: JobRecord) -> None:
        self.pending.append(record.job_id)

    def flush(self) -> None:
        if self.pending:
            with open(os.environ[RECORD_FILE_ENV], "a") as f:
                f.write(json.dumps(self.pending) + "\n")
            self.pending = []


class Busy:
    fraction_value = 1.0

    def fraction(self) -> float:
        return self.fraction_value


class Idle(Busy):
    fraction_value = 0.0


def written(path: Any) -> list[str]:
    if not path.exists():
        return []
    return [job for line in path.read_text().splitlines() for job in json.loads(line)]


def start_recorder(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, busy: type, delay: float) -> int:
    from emq_django.worker import recorder_process

    monkeypatch.setenv(RECORD_FILE_ENV, str(tmp_path / "records.jsonl"))
    monkeypatch.setattr(recorder_process, "MachineBusy", busy)
    endpoint = f"ipc://{tmp_path}/rec.sock"
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            code = RecorderProcess(
                endpoint, f"{__name__}.FileRecorder", "normal", max_delay=delay
            ).run(idle_wait=0.1)
        finally:
            os._exit(code)
    return pid


def stop(pid: int) -> int:
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def wait_for(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return check()


@pytest.fixture
def forwarder(tmp_path: Any) -> Any:
    context: zmq.Context[Any] = zmq.Context()
    fwd = RecordForwarder(context, f"ipc://{tmp_path}/rec.sock", max_buffer=1000, manager="m")
    yield fwd
    fwd.close(linger=1)
    context.destroy(linger=0)


def test_recorder_process_writes_at_once_on_an_idle_machine(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, forwarder: RecordForwarder
) -> None:
    pid = start_recorder(tmp_path, monkeypatch, Idle, delay=30)
    try:
        for i in range(3):
            add(forwarder, rec(f"j{i}"))
        forwarder.flush()
        # a malformed message is dropped; what comes after it is still written
        forwarder.sock.send_multipart([b"not json", b""])
        add(forwarder, rec("after"))
        forwarder.flush()
        got = wait_for(lambda: len(written(tmp_path / "records.jsonl")) == 4, 5)
        assert got, written(tmp_path / "records.jsonl")
        assert written(tmp_path / "records.jsonl") == ["j0", "j1", "j2", "after"]
    finally:
        assert stop(pid) == 0


def test_recorder_process_waits_for_a_busy_machine_at_most_max_delay(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, forwarder: RecordForwarder
) -> None:
    pid = start_recorder(tmp_path, monkeypatch, Busy, delay=1.5)
    try:
        add(forwarder, rec("late"))
        forwarder.flush()
        sent = time.monotonic()
        time.sleep(0.7)
        assert written(tmp_path / "records.jsonl") == [], "written while the machine was busy"
        assert wait_for(lambda: written(tmp_path / "records.jsonl"), 5) == ["late"]
        print(f"written {time.monotonic() - sent:.2f} s after it was sent (max delay 1.5 s)")
    finally:
        assert stop(pid) == 0


def test_a_stopping_recorder_process_writes_what_waits(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, forwarder: RecordForwarder
) -> None:
    pid = start_recorder(tmp_path, monkeypatch, Busy, delay=60)
    add(forwarder, rec("held"))
    forwarder.flush()
    time.sleep(0.5)
    assert written(tmp_path / "records.jsonl") == []
    assert stop(pid) == 0
    assert written(tmp_path / "records.jsonl") == ["held"]


def test_machine_busy_reads_a_fraction() -> None:
    busy = MachineBusy(interval=0.05)
    sum(i * i for i in range(300_000))  # some CPU time to see
    time.sleep(0.06)
    assert 0.0 <= busy.fraction() <= 1.0
