"""The worker's credit policy: how many jobs a worker process asks for."""

from __future__ import annotations

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
