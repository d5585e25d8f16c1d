"""The retry policy the job lifecycle calls once per failed attempt."""

from __future__ import annotations

import random

import pytest

from emq_django.broker.retry import RETRY_REQUESTED_LIMIT, RetryDecision, RetryPolicy


def policy() -> RetryPolicy:
    return RetryPolicy(base=1.0, cap=300.0, rng=random.Random(1))


@pytest.mark.parametrize(
    ("failures", "retries", "requested", "lost", "error", "death_limit", "retry", "bury"),
    [
        (1, 2, None, None, "ValueError", 0, True, False),  # a failure within retries
        (3, 2, None, None, "ValueError", 0, False, True),  # over them: a dead letter
        (1, 0, None, None, "ValueError", 0, False, False),  # no retries: forgotten
        (RETRY_REQUESTED_LIMIT, 0, 5.0, None, "x.Retry", 0, True, False),  # emq.Retry
        (RETRY_REQUESTED_LIMIT + 1, 0, 5.0, None, "x.Retry", 0, False, True),
        (2, 0, None, "killed", "x.WorkerLost", 3, True, False),  # a guaranteed job's death
        (1, 0, None, "killed", "TimeoutError", 3, False, False),  # a time-out: no death
    ],
)
def test_the_policy_decides_by_the_attempt(
    failures: int,
    retries: int,
    requested: float | None,
    lost: str | None,
    error: str,
    death_limit: int,
    retry: bool,
    bury: bool,
) -> None:
    decision = policy().decide(failures, retries, requested, lost, error, death_limit)
    assert (decision.retry, decision.bury) == (retry, bury)


def test_the_delay_is_the_task_s_else_a_capped_jittered_backoff() -> None:
    assert policy().decide(1, 2, 7.5, None, "x.Retry", 0) == RetryDecision(True, 7.5, False, False)
    first = policy().decide(1, 9, None, None, "E", 0).delay
    fourth = policy().decide(4, 9, None, None, "E", 0).delay
    assert 0.8 <= first <= 1.2 and 6.4 <= fourth <= 9.6
    assert policy().decide(30, 99, None, None, "E", 0).delay <= 300.0 * 1.2
