"""The retry policy: whether a failed attempt is tried again, after how long, and
where a job that is not goes.

The attempt is the unit (DESIGN.md): a failure, a time-out, a worker death and a
cancel each end one and count against the job's ``retries``. A task that raises
``emq.Retry`` with no ``retries`` declared gets ``RETRY_REQUESTED_LIMIT``; a worker
death is retried at least ``death_limit`` times (a guaranteed job's
``GUARANTEED_DEATH_RETRIES``, decided by the lifecycle, which knows the journal).
The delay is the one the task asked for, else an exponential backoff from ``base``,
capped at ``cap`` (``EMQ_RETRY_BASE``, ``EMQ_RETRY_CAP``), with +-20% jitter.
Pure: the lifecycle calls ``decide`` once per failed attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRY_REQUESTED_LIMIT = 3  # emq.Retry on a task declared with no retries
TIMEOUT_ERROR = "TimeoutError"


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Delay before retry ``attempt`` (1 = the first retry): exponential with cap,
    and +-20% jitter so that jobs failing together do not retry together."""
    # the exponent stops at 64: 2.0 ** 1024 overflows, and retries go up to 2**31 - 1
    delay: float = min(cap, base * (2.0 ** min(max(attempt - 1, 0), 64)))
    return delay * rng.uniform(0.8, 1.2)


def retry_limit(retries: int, requested: bool) -> int:
    """The failed attempts a job is retried after: its ``retries``, or
    ``RETRY_REQUESTED_LIMIT`` when the task asked (``emq.Retry``) and declared none."""
    return RETRY_REQUESTED_LIMIT if requested and not retries else retries


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool  # try it again after ``delay`` seconds
    delay: float
    died: bool  # the attempt ended with its process (a time-out is a failure, not a death)
    bury: bool  # not retried: into the dead letters (else forgotten)


@dataclass(slots=True)
class RetryPolicy:
    base: float  # the first retry's delay, doubling for each one after
    cap: float  # the longest delay
    rng: random.Random  # the jitter's

    def decide(
        self,
        failures: int,
        retries: int,
        requested: float | None,
        lost: str | None,
        error: str,
        death_limit: int,
    ) -> RetryDecision:
        """After the job's ``failures``-th failed attempt (counted already): its
        ``retries``, the delay its task asked for (``requested``, ``emq.Retry``;
        negative: the policy's), ``lost`` (how its process ended, if it did),
        ``error`` (the error's type) and ``death_limit`` (the deaths it survives)."""
        died = lost is not None and error != TIMEOUT_ERROR
        limit = retry_limit(retries, requested is not None)
        if died:
            limit = max(limit, death_limit)
        if failures <= limit:
            if requested is not None and requested >= 0:
                delay = requested
            else:
                delay = backoff(failures, self.base, self.cap, self.rng)
            return RetryDecision(True, delay, died, False)
        bury = died or bool(retries) or requested is not None
        return RetryDecision(False, 0.0, died, bury)
