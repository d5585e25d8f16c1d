"""A worker process runs the ranked queue's jobs it holds best-ranked first (issue
33): the broker lets a ranked queue prefetch and puts each job's rank on the wire
(the ``rank`` header), so a higher job sent after lower ones that the process
holds unstarted (in its socket, or read already) does not wait behind them.

A real ``SlotWorker`` forked to a ROUTER played by the test (test_batched_jobs's
``FakeBroker``), on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from emq_django.worker.ranked import LocalOrder
from tests.integration.test_batched_jobs import (  # noqa: F401 (fixtures)
    FakeBroker,
    answers_of,
    job,
    table,
    unblocked,
)


def ranked(msgid: bytes, rank: float, name: str = "add", *args: Any) -> list[bytes]:
    """A REQUEST as the broker sends a ranked queue's job to a worker process."""
    body = encode_run_body("tests.integration.test_batched_jobs", name, args or (1, 1))
    headers = format_headers(
        reply_requested=True, task=f"tests.integration.test_batched_jobs.{name}"
    )
    return F.encode_request(msgid, b"batch", b"%s,rank:%r" % (headers, rank), body)


@pytest.fixture
def fake(table: Any, unblocked: None) -> Iterator[FakeBroker]:  # noqa: F811
    b = FakeBroker(table)
    try:
        b.wait_connected()
        yield b
    finally:
        b.close()


def run_order(broker: FakeBroker, count: int) -> list[bytes]:
    refs: list[bytes] = []
    while len(refs) < count:
        refs += [ref for _, ref, _ in answers_of(broker.recv())]
    return refs


def test_the_best_ranked_job_held_runs_first_fifo_within_a_rank(fake: FakeBroker) -> None:
    broker = fake
    broker.send(job(b"long#1", "nap", 0.3))  # (unranked) it runs while the others come
    broker.send(F.join_requests(ranked(b"low1#1", 10.0), [ranked(b"low2#1", 10.0)]))
    broker.send(ranked(b"low3#1", 10.0))
    broker.send(ranked(b"high#1", -5.0))  # sent last, outranks the three held
    broker.send(ranked(b"mid#1", 3.0))
    order = run_order(broker, 6)
    assert order == [b"long#1", b"high#1", b"mid#1", b"low1#1", b"low2#1", b"low3#1"]


def unexpected(msgid: bytes, error: str, reason: str) -> None:
    raise AssertionError(f"{msgid!r} failed unstarted: {error}: {reason}")


def test_jobs_without_a_rank_keep_their_order_and_go_before_ranked_ones_of_their_queue() -> None:
    order = LocalOrder()

    def request(msgid: bytes, queue: bytes, rank: float | None) -> list[bytes]:
        headers = b"task:t" if rank is None else b"task:t,rank:%r" % rank
        return F.encode_request(msgid, queue, headers, b"")

    held = [(b"r1", 2.0), (b"plain1", None), (b"r0", 1.0), (b"plain2", None)]
    order.take([request(msgid, b"q", rank) for msgid, rank in held], fail=unexpected)
    order.take([request(b"other", b"other-queue", -100.0)], fail=unexpected)
    got = [order.pop()[0] for _ in range(len(order))]
    # within queue q: unranked first (FIFO), then by rank; queue turns as they arrived
    assert got == [b"plain1", b"plain2", b"r0", b"r1", b"other"]


def test_a_rank_that_is_not_a_number_fails_that_job_unstarted_and_keeps_the_rest() -> None:
    order = LocalOrder()
    failed: list[tuple[bytes, str, str]] = []
    good = F.encode_request(b"good", b"q", b"task:t,rank:5", b"")
    bad = F.encode_request(b"bad", b"q", b"task:t,rank:abc", b"")
    order.take([bad, good], fail=lambda *failure: failed.append(failure))
    assert [(m, reason) for m, _, reason in failed] == [
        (b"bad", "header 'rank' is not a number: b'abc'")
    ]
    assert [order.pop()[0] for _ in range(len(order))] == [b"good"]
