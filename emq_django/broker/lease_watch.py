"""The broker's side of the lease (``broker/lease.py``): what its loop asks, when.

A broker with ``EMQ_JOURNAL_URL`` is active or standby, and its server loop runs
one of these watches (``BrokerServer(ha=...)``). The loop calls ``tick`` as soon
as it wakes at or after ``due``: right after ``poll`` returns and before it reads
any socket, so that a loop held longer than the lease's TTL (SIGSTOP, a VM pause,
a long turn) asks PostgreSQL whether it still holds the lease before it serves
anyone. ``tick`` answers a reason to leave the loop, or None to go on.

- ``StandbyWatch``: tries to take the lease every ``EMQ_LEASE_POLL``; leaves the
  loop ("lease taken") when it got it.
- ``ActiveWatch``: renews every ``EMQ_LEASE_RENEW`` (each journal commit renews it
  too, in the same transaction: ``PgJournal.fence``); leaves the loop when the
  lease is another broker's (renew False, or ``LeaseLost`` from a commit). When
  PostgreSQL cannot be reached it goes on (plain jobs keep flowing, guaranteed
  ones are refused by the failing commit) and renewal decides once it is back.

Both keep the lease's whole state (the active broker, the standbys, the last
failover: ``Lease.state()``), read at most every ``STATE_EVERY``, for the monitor's
``ha`` section: a monitor request never waits for PostgreSQL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from emq_django.exceptions import JournalError, LeaseLost

log = logging.getLogger(__name__)

STATE_EVERY = 0.5  # seconds between reads of the lease's whole state
ANNOUNCE_EVERY = 0.5  # seconds between upserts of this broker's row (emq_brokers)
UNREACHABLE_LOG_EVERY = 5.0  # seconds between log lines while PostgreSQL is away
# a broker not heard of for this long is shown as "unseen", whatever role it last
# announced (a killed active one stays listed a minute: Lease.state's LISTED_BROKER_S)
UNSEEN_AFTER = 3.0
UNSEEN = "unseen"

STANDBY = "standby"
ACTIVE = "active"
TAKEN = "lease taken"  # StandbyWatch's reason to leave its loop


class LeaseLike(Protocol):
    """What the watches use of ``broker.lease.Lease``."""

    epoch: int | None

    def try_acquire(self) -> int | None: ...
    def renew(self) -> bool: ...
    def release(self) -> None: ...
    def mark_serving(self, took_s: float) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def announce(self, role: str) -> None: ...


class LeaseWatch:
    """What both roles share: the cached state, announcing, the log of an outage."""

    role = ""

    def __init__(
        self,
        lease: LeaseLike,
        name: str,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self.name = name
        self.interval = interval
        self.clock = clock
        self.due = clock()  # the loop calls tick() at once
        self.leave: str | None = None  # set: the loop returns this reason at once
        self.epoch: int | None = None
        self.error: str | None = None  # PostgreSQL's last complaint, None once it answers
        self._state: dict[str, Any] = {}
        self._state_due = 0.0
        self._announce_due = 0.0
        self._error_logged = float("-inf")

    def tick(self, now: float) -> str | None:
        raise NotImplementedError

    def commit_failed(self, exc: JournalError) -> None:
        """A journal commit failed (the server refused its guaranteed jobs)."""

    def status(self) -> dict[str, Any]:
        """The monitor's ``ha`` section: this broker's role, then the lease's state
        as last read (``Lease.state()``: active, epoch, brokers, last_failover)."""
        brokers = [
            {**b, "role": UNSEEN} if (b.get("seen_ago") or 0.0) > UNSEEN_AFTER else b
            for b in self._state.get("brokers") or ()
        ]
        return {
            **self._state,
            "brokers": brokers,
            "role": self.role,
            "name": self.name,
            "epoch": self.epoch if self.epoch is not None else self._state.get("epoch"),
            "error": self.error,
        }

    def _chores(self, now: float) -> None:
        """Announce this broker and read the lease's state when each is due."""
        if now >= self._announce_due:
            self.lease.announce(self.role)
            self._announce_due = now + ANNOUNCE_EVERY
        if now >= self._state_due:
            self._state = self.lease.state()
            self._state_due = now + STATE_EVERY

    def _unreachable(self, exc: JournalError, now: float, doing: str) -> None:
        self.error = str(exc)
        if now - self._error_logged >= UNREACHABLE_LOG_EVERY:
            log.error("%s broker %s: %s failed: %s", self.role, self.name, doing, exc)
            self._error_logged = now

    def _reachable(self) -> None:
        if self.error is not None:
            log.info("%s broker %s: PostgreSQL answers again", self.role, self.name)
            self.error = None
            self._error_logged = float("-inf")


class StandbyWatch(LeaseWatch):
    """A standby: tries to take the lease every ``interval`` (EMQ_LEASE_POLL)."""

    role = STANDBY

    def tick(self, now: float) -> str | None:
        self.due = now + self.interval
        try:
            epoch = self.lease.try_acquire()
            self._reachable()
            if epoch is None:
                self._chores(now)
                return None
        except JournalError as exc:
            self._unreachable(exc, now, "taking the lease")
            return None
        self.epoch = epoch
        self.leave = TAKEN
        return TAKEN


class ActiveWatch(LeaseWatch):
    """The active broker: renews every ``interval`` (EMQ_LEASE_RENEW)."""

    role = ACTIVE

    def __init__(
        self,
        lease: LeaseLike,
        name: str,
        interval: float,
        epoch: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(lease, name, interval, clock)
        self.epoch = epoch
        self.renewals = 0

    def tick(self, now: float) -> str | None:
        if self.leave is not None:
            return self.leave
        self.due = now + self.interval
        try:
            kept = self.lease.renew()
        except JournalError as exc:
            # not lost, not known to be kept: serve on (commits are fenced), ask again
            self._unreachable(exc, now, "renewing the lease")
            return None
        self._reachable()
        if not kept:
            self.leave = f"the lease (epoch {self.epoch}) is another broker's now"
            return self.leave
        self.renewals += 1
        try:
            self._chores(now)
        except JournalError as exc:
            self._unreachable(exc, now, "reading the lease's state")
        return None

    def commit_failed(self, exc: JournalError) -> None:
        """A fenced commit found the lease gone: leave at the loop's next wake."""
        if isinstance(exc, LeaseLost) and self.leave is None:
            self.leave = f"a journal commit found the lease lost: {exc}"
            self.due = float("-inf")
