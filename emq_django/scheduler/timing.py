"""When a schedule fires: its first run, and what to do when a tick is due. Pure.

An interval schedule keeps its phase: its ticks are ``first + k * interval``
whichever scheduler fires them, so that several schedulers agree on the ticks.
A cron schedule's ticks come from ``cron.next_fire`` in the schedule's zone.

Catch-up policies, for ticks that passed while no scheduler ran:
- ``once`` (default): one run for all the missed ticks, then the next future tick
  (the one after it, when that one is less than half an interval away);
- ``none``: missed ticks are skipped; only a tick that is on time runs;
- ``all``: one run per missed tick (at most ``MAX_CATCH_UP``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from emq_django.protocol.limits import MAX_INTERVAL
from emq_django.scheduler.cron import next_fire, parse_cron, zone

CATCH_UP_ONCE = "once"
CATCH_UP_NONE = "none"
CATCH_UP_ALL = "all"
CATCH_UP_POLICIES = (CATCH_UP_ONCE, CATCH_UP_NONE, CATCH_UP_ALL)
MAX_CATCH_UP = 1000
DEFAULT_GRACE = dt.timedelta(seconds=1)  # a tick later than this counts as missed


@dataclass(frozen=True, slots=True)
class Timing:
    """Every ``interval`` seconds, or at the times of ``cron`` in ``timezone``."""

    interval: float | None = None
    cron: str = ""
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.interval is None) == (not self.cron):
            raise ValueError("give an interval or a cron expression, not both or neither")
        if self.interval is not None and not 0 < self.interval <= MAX_INTERVAL:
            raise ValueError(
                f"the interval must be > 0 seconds and at most {MAX_INTERVAL:.0f} (ten years), "
                f"got {self.interval!r}"
            )
        if self.cron:
            parse_cron(self.cron)  # raises CronError
        zone(self.timezone)  # raises ValueError

    @property
    def key(self) -> str:
        """Changes when the timing changes: a changed schedule is planned afresh."""
        interval = "" if self.interval is None else f"{self.interval:g}"
        return f"{interval}|{self.cron}|{self.timezone}"

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``moment`` for a cron schedule, or
        ``moment + interval``."""
        if self.interval is not None:
            return moment + dt.timedelta(seconds=self.interval)
        return next_fire(parse_cron(self.cron), moment, zone(self.timezone))

    def describe(self) -> str:
        if self.interval is not None:
            return f"every {self.interval:g} s"
        return f"cron {self.cron} ({self.timezone})"


def first_run(timing: Timing, now: dt.datetime, nohaste: bool) -> dt.datetime:
    """A new interval schedule runs at once, or with ``nohaste`` after one interval;
    a cron schedule at the next time its expression matches (as django-celery-beat's:
    "30 2 * * *" created at noon means 2:30, not noon)."""
    return now if timing.interval is not None and not nohaste else timing.next_after(now)


@dataclass(frozen=True, slots=True)
class Due:
    """What to do with a due tick: send ``runs`` jobs, then wait for ``next_run``."""

    runs: int
    next_run: dt.datetime
    missed: int  # ticks that passed without a run of their own


def on_due(
    timing: Timing,
    due: dt.datetime,
    now: dt.datetime,
    policy: str = CATCH_UP_ONCE,
    grace: dt.timedelta = DEFAULT_GRACE,
) -> Due:
    """The runs for the tick due at ``due`` (<= ``now``) and the next tick after now."""
    if policy not in CATCH_UP_POLICIES:
        raise ValueError(f"unknown catch-up policy {policy!r}; use one of {CATCH_UP_POLICIES}")
    ticks, latest, next_run = _ticks_until(timing, due, now)
    if policy == CATCH_UP_ALL:
        runs = min(ticks, MAX_CATCH_UP)
    elif policy == CATCH_UP_NONE:
        runs = 1 if now - latest <= grace else 0
    else:
        runs = 1
        if ticks > 1:
            # A catch-up run stands for the missed ticks; a tick due less than half
            # an interval after it is absorbed too, or it would run twice at once.
            after = timing.next_after(next_run)
            if next_run - now < (after - next_run) / 2:
                next_run, ticks = after, ticks + 1
    return Due(runs, next_run, ticks - runs if ticks > runs else 0)


def tick_times(timing: Timing, first: dt.datetime, count: int) -> list[dt.datetime]:
    """The ``count`` ticks from ``first`` on: what each run of a catch-up stands for."""
    ticks = [first]
    while len(ticks) < count:
        ticks.append(timing.next_after(ticks[-1]))
    return ticks[:count]


def _ticks_until(
    timing: Timing, due: dt.datetime, now: dt.datetime
) -> tuple[int, dt.datetime, dt.datetime]:
    """(ticks in [due, now], the latest of them, the first tick after now)."""
    if timing.interval is not None:
        step = dt.timedelta(seconds=timing.interval)
        if now < due:
            return 0, due, due
        behind = int((now - due) / step)
        latest = due + behind * step
        return behind + 1, latest, latest + step
    ticks, latest, tick = 0, due, due
    while tick <= now and ticks <= MAX_CATCH_UP:
        ticks, latest = ticks + 1, tick
        tick = timing.next_after(tick)
    if tick <= now:  # more than MAX_CATCH_UP missed: jump ahead
        tick = timing.next_after(now)
    return ticks, latest, tick
