"""The worker's credit policy: how many jobs a worker process asks for."""

from __future__ import annotations

from typing import Any

import pytest

from emq_django.worker.credit import CreditPolicy


def test_one_credit_until_a_job_has_been_timed() -> None:
    assert CreditPolicy(64).wanted() == 1


@pytest.mark.parametrize(
    ("seconds_per_job", "maximum", "wanted"),
    [
        (0.00002, 64, 64),  # no-op tasks: capped at the maximum
        (0.0001, 64, 20),  # 2 ms of work / 0.1 ms
        (0.001, 64, 2),
        (0.002, 64, 1),
        (0.5, 64, 1),  # long tasks: never hold a job back from an idle worker
        (0.00002, 1, 1),  # EMQ_PREFETCH=1: strictly one at a time
    ],
)
def test_credit_covers_the_horizon_within_bounds(
    seconds_per_job: float, maximum: int, wanted: int
) -> None:
    policy = CreditPolicy(maximum)
    for _ in range(50):
        policy.observe(seconds_per_job)
    assert policy.wanted() == wanted


def test_credit_falls_when_jobs_get_slower() -> None:
    policy = CreditPolicy(64)
    for _ in range(20):
        policy.observe(0.00001)
    assert policy.wanted() == 64
    for _ in range(30):
        policy.observe(1.0)
    assert policy.wanted() == 1


def test_maximum_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CreditPolicy(0)


def unconnected_worker(table: Any, prefetch: int = 1, max_jobs: int = 0) -> Any:
    """A worker process's object, as its job manager's fork makes it, never
    connected (its link's broker address is a closed port): for its own logic.
    The caller destroys its ``context``."""
    from emq_django.worker.process import SlotConfig, SlotWorker

    config = SlotConfig(
        broker_url="tcp://127.0.0.1:1",  # never connected here
        queues=((10, "default"),),
        manager="m",
        slot=0,
        heartbeat_interval=1.0,
        heartbeat_liveness=3,
        prefetch=prefetch,
        max_jobs=max_jobs,
    )
    return SlotWorker(config, table)


@pytest.mark.parametrize(
    ("wanted", "maximum", "max_jobs", "done", "ceiling"),
    [
        (0, 64, 0, 0, 0),  # retiring or stopping: no credit back
        (1, 64, 0, 0, 1),  # small wishes: no slack
        (3, 64, 0, 0, 3),
        (20, 64, 0, 0, 25),  # a quarter over the wish
        (60, 64, 0, 0, 64),  # never past EMQ_PREFETCH
        (20, 64, 100, 90, 10),  # never more than the jobs left before recycling
    ],
)
def test_a_worker_keeps_a_little_more_credit_than_it_wants(
    wanted: int, maximum: int, max_jobs: int, done: int, ceiling: int
) -> None:
    from emq_django.worker.slots import SlotTable

    worker = unconnected_worker(SlotTable(1), prefetch=maximum, max_jobs=max_jobs)
    try:
        worker.jobs_done = done
        assert worker._ceiling(wanted) == ceiling
    finally:
        worker.context.destroy(linger=0)
