"""A job a worker process cannot start is a failed attempt, answered with the
reason (issue 29, item 1): never a dead process and an uncounted requeue.

A ``retry-count`` of 2^31 used to reach the slot table (a signed 32-bit int) and
kill the process with ``struct.error`` before the job started; its job manager
then said ENDED and the broker requeued the job uncounted, for ever. The worker
side is a real ``SlotWorker`` forked to a ROUTER played by the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_run_body
from emq_django.worker.slots import SlotTable
from tests.integration.test_batched_jobs import FakeBroker, answers_of, job

TASKS = "tests.integration.test_batched_jobs"


@pytest.fixture
def worker(django_db_blocker: Any) -> Iterator[FakeBroker]:
    """A real SlotWorker, forked, connected to a ROUTER the test plays."""
    with django_db_blocker.unblock():  # as test_batched_jobs' ``broker`` fixture
        b = FakeBroker(SlotTable(1))
        try:
            b.wait_connected()
            yield b
        finally:
            b.close()


def raw_job(msgid: bytes, headers: bytes) -> list[bytes]:
    """A REQUEST with raw headers, as a foreign client (or an old broker) sends it."""
    return F.encode_request(msgid, b"batch", headers, encode_run_body(TASKS, "add", [1, 2]))


def test_a_job_with_an_out_of_range_retry_count_fails_with_the_reason(
    worker: FakeBroker,
) -> None:
    worker.send(raw_job(b"poison#1", b"reply-requested,retry-count:2147483648"))
    reply = worker.recv()
    body, ref, status = answers_of(reply)[0]
    assert ref == b"poison#1"
    assert status.split(b",")[0] == b"failed", status
    error = json.loads(body)["error"]
    assert error["type"] == "emq_django.exceptions.ProtocolError", error
    assert "retry-count" in error["message"] and "2147483647" in error["message"]
    # the process lives on, and its slot is free: the next job runs
    worker.send(job(b"next#1", "add", 2, 3))
    body, ref, _ = answers_of(worker.recv())[0]
    assert ref == b"next#1" and json.loads(body)["value"] == 5


def test_a_bad_job_in_a_batch_fails_alone(worker: FakeBroker) -> None:
    jobs = [
        job(b"a#1", "add", 1, 2),
        raw_job(b"bad#1", b"retry-count:99999999999"),
        job(b"c#1", "add", 5, 6),
    ]
    worker.send(F.join_requests(jobs[0], jobs[1:]))
    got: dict[bytes, tuple[bytes, bytes]] = {}
    while len(got) < 3:
        for body, ref, status in answers_of(worker.recv()):
            got[ref] = (body, status)
    assert json.loads(got[b"a#1"][0])["value"] == 3
    assert json.loads(got[b"c#1"][0])["value"] == 11
    body, status = got[b"bad#1"]
    assert status.split(b",")[0] == b"failed"
    assert "retry-count" in json.loads(body)["error"]["message"]
