"""How many jobs a worker process asks the broker for (its credit).

Enough to cover a short horizon of its recent work, between 1 and the
configured maximum (``EMQ_PREFETCH``). Short tasks stream without a round trip
per job; a worker busy with long tasks holds no other jobs back from idle ones.
"""

from __future__ import annotations

HORIZON = 0.002  # seconds of work to hold: about a broker round trip under load
SMOOTHING = 0.2


class CreditPolicy:
    def __init__(self, maximum: int, horizon: float = HORIZON) -> None:
        if maximum < 1:
            raise ValueError("the maximum credit must be at least 1")
        self.maximum = maximum
        self.horizon = horizon
        self.average: float | None = None  # seconds per job, smoothed

    def observe(self, seconds: float) -> None:
        if self.average is None:
            self.average = seconds
        else:
            self.average += SMOOTHING * (seconds - self.average)

    def wanted(self) -> int:
        """The credit to hold now: 1 until a job has been timed."""
        if self.average is None:
            return 1
        return max(1, min(self.maximum, int(self.horizon / max(self.average, 1e-7))))
