"""The broker loop's side of the lease (``broker/lease_watch.py``), with a fake clock
and a scripted lease: when it asks, and what it tells the loop. The real lease and
PostgreSQL are tested in tests/integration/test_lease.py and tests/e2e/test_ha_broker.py."""

from __future__ import annotations

from typing import Any

from emq_django.broker.lease_watch import TAKEN, ActiveWatch, StandbyWatch
from emq_django.exceptions import JournalError, LeaseLost


class ScriptedLease:
    """Answers what the test says; raises a JournalError given as an answer."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.acquire: list[Any] = []
        self.renewals: list[Any] = []
        self.announced: list[str] = []
        self.state_reads = 0

    def _next(self, answers: list[Any], default: Any) -> Any:
        answer = answers.pop(0) if answers else default
        if isinstance(answer, Exception):
            raise answer
        return answer

    def try_acquire(self) -> int | None:
        epoch = self._next(self.acquire, None)
        self.epoch = epoch
        return epoch

    def renew(self) -> bool:
        return bool(self._next(self.renewals, True))

    def release(self) -> None:
        self.epoch = None

    def mark_serving(self, took_s: float | None = None) -> None:
        pass

    def state(self) -> dict[str, Any]:
        self.state_reads += 1
        return {"active": "b1", "epoch": 7, "brokers": [{"name": "b2", "role": "standby"}]}

    def announce(self, role: str) -> None:
        self.announced.append(role)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_standby_polls_until_it_takes_the_lease() -> None:
    lease, clock = ScriptedLease(), Clock()
    lease.acquire = [None, None, 8]
    watch = StandbyWatch(lease, "b2", 0.1, clock)
    assert watch.due <= clock.now  # asks at once
    assert watch.tick(clock.now) is None
    assert watch.due == clock.now + 0.1
    assert lease.announced == ["standby"] and watch.status()["active"] == "b1"
    clock.now += 0.1
    assert watch.tick(clock.now) is None
    clock.now += 0.1
    assert watch.tick(clock.now) == TAKEN
    assert watch.epoch == 8


def test_a_standby_rides_out_postgresql_being_away() -> None:
    lease, clock = ScriptedLease(), Clock()
    lease.acquire = [JournalError("connection refused"), 3]
    watch = StandbyWatch(lease, "b2", 0.1, clock)
    assert watch.tick(clock.now) is None
    assert watch.status()["error"] == "connection refused"
    clock.now += 0.1
    assert watch.tick(clock.now) == TAKEN
    assert watch.status()["error"] is None


def test_the_active_renews_every_interval_and_leaves_when_the_lease_is_gone() -> None:
    lease, clock = ScriptedLease(), Clock()
    lease.renewals = [True, True, False]
    watch = ActiveWatch(lease, "b1", 0.2, epoch=5, clock=clock)
    assert watch.tick(clock.now) is None
    assert watch.due == clock.now + 0.2
    status = watch.status()
    assert status["role"] == "active" and status["epoch"] == 5 and status["name"] == "b1"
    clock.now += 0.2
    assert watch.tick(clock.now) is None
    clock.now += 0.2
    reason = watch.tick(clock.now)
    assert reason is not None and "epoch 5" in reason
    assert watch.tick(clock.now) == reason  # stays left


def test_the_active_serves_on_while_postgresql_cannot_say() -> None:
    lease, clock = ScriptedLease(), Clock()
    lease.renewals = [JournalError("server closed the connection"), True]
    watch = ActiveWatch(lease, "b1", 0.2, epoch=5, clock=clock)
    assert watch.tick(clock.now) is None  # unknown: not lost
    assert watch.status()["error"] == "server closed the connection"
    assert watch.due == clock.now + 0.2  # asks again at the next renewal
    clock.now += 0.2
    assert watch.tick(clock.now) is None
    assert watch.status()["error"] is None


def test_a_fenced_commit_makes_the_active_leave_at_the_next_wake() -> None:
    lease, clock = ScriptedLease(), Clock()
    watch = ActiveWatch(lease, "b1", 0.2, epoch=5, clock=clock)
    watch.tick(clock.now)
    watch.commit_failed(JournalError("disk full"))  # not about the lease: serve on
    assert watch.leave is None and watch.due == clock.now + 0.2
    watch.commit_failed(LeaseLost("epoch 5 is not the lease's"))
    assert watch.due == float("-inf")  # the loop wakes at once
    reason = watch.tick(clock.now)
    assert reason is not None and "lease lost" in reason


def test_the_lease_state_is_read_at_most_every_half_second() -> None:
    lease, clock = ScriptedLease(), Clock()
    watch = ActiveWatch(lease, "b1", 0.2, epoch=5, clock=clock)
    for _ in range(5):  # 1 s of renewals
        watch.tick(clock.now)
        clock.now += 0.2
    assert lease.state_reads == 2
    assert lease.announced == ["active", "active"]


def test_a_broker_not_heard_of_for_seconds_is_shown_unseen() -> None:
    lease, clock = ScriptedLease(), Clock()
    lease.state = lambda: {  # type: ignore[method-assign]
        "active": "b2",
        "brokers": [
            {"name": "b1", "role": "active", "seen_ago": 12.0},  # killed
            {"name": "b2", "role": "active", "seen_ago": 0.1},
        ],
    }
    watch = ActiveWatch(lease, "b2", 0.2, epoch=2, clock=clock)
    watch.tick(clock.now)
    assert [(b["name"], b["role"]) for b in watch.status()["brokers"]] == [
        ("b1", "unseen"),
        ("b2", "active"),
    ]
