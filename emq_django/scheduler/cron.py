"""Five-field cron expressions and their next fire time in a time zone. Pure.

Fields: minute hour day-of-month month day-of-week, each ``*``, a number, a
range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma list of those. Months
and days of the week also take names (``jan``, ``mon``); day 7 is Sunday. When
both day-of-month and day-of-week are restricted, a day matching either one
matches (as cron does). ``@hourly``, ``@daily``, ``@weekly``, ``@monthly`` and
``@yearly`` stand for the usual expressions.

Daylight saving time, in the job's time zone:
- a wall time that does not exist (clocks jump forward) fires at the first
  instant after the jump, once, however many matching times fell in the gap;
- a wall time that happens twice (clocks go back) fires at its first
  occurrence only, unless the hour field is ``*``: then the job keeps its real
  rhythm and fires in both passes (``*/15 * * * *`` stays every 15 minutes).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import lru_cache
from zoneinfo import ZoneInfo

from emq_django.exceptions import CronError

__all__ = ["CronError", "Cron", "parse_cron", "next_fire", "zone"]

UTC = dt.UTC
MAX_SEARCH_YEARS = 30  # "0 0 29 2 1" (Feb 29 or a Monday) still fires; impossible dates never
_MINUTE = dt.timedelta(minutes=1)
_FOLD_WINDOW = dt.timedelta(hours=3)  # longer than any clock change in the tz database

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# (name, lowest, highest, names for lowest..)
_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 7, DAYS),
)


@dataclass(frozen=True, slots=True)
class Cron:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month was "*"
    any_weekday: bool  # day-of-week was "*"

    @property
    def every_hour(self) -> bool:
        return len(self.hours) == 24

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week


@lru_cache(maxsize=512)
def parse_cron(text: str) -> Cron:
    """Parse a five-field expression; raises ``CronError`` saying what is wrong."""
    source = text.strip().lower()
    source = MACROS.get(source, source)
    parts = source.split()
    if len(parts) != 5:
        raise CronError(
            f"cron expression {text!r} has {len(parts)} fields; it needs 5: "
            "minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'"
        )
    try:
        sets = [_parse_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
    except CronError as exc:
        raise CronError(f"cron expression {text!r}: {exc}") from None
    weekdays = frozenset(d % 7 for d in sets[4])
    cron = Cron(
        text.strip(),
        sets[0],
        sets[1],
        sets[2],
        sets[3],
        weekdays,
        parts[2].startswith("*"),  # as cron does: "*/2" still counts as "any day"
        parts[4].startswith("*"),
    )
    if not _some_day_matches(cron):
        raise CronError(f"cron expression {text!r} never fires (no such date)")
    return cron


def _parse_field(
    text: str, name: str, low: int, high: int, names: tuple[str, ...]
) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"empty item in the {name} field {text!r}")
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            step = _number(step_text, name, 1, high - low + 1 if high > low else 1, names=())
        if base == "*":
            start, stop = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start = _number(a, name, low, high, names)
            stop = _number(b, name, low, high, names)
            if stop < start:
                raise CronError(f"range {base!r} in the {name} field runs backwards")
        else:
            start = _number(base, name, low, high, names)
            stop = high if step_text else start
        values.update(range(start, stop + 1, step))
    return frozenset(values)


def _number(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text in names:
        offset = 1 if name == "month" else 0
        return names.index(text) + offset
    if not text.isdigit():
        hint = f" or a name ({names[0]}..{names[-1]})" if names else ""
        raise CronError(f"{text!r} in the {name} field is not a number{hint}")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{value} is out of range for the {name} field ({low}-{high})")
    return value


def _some_day_matches(cron: Cron) -> bool:
    if not cron.any_weekday:
        return True  # some matching weekday always comes
    longest = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30}
    return any(d <= longest.get(m, 31) for m in cron.months for d in cron.days)


# ---- the next fire time -----------------------------------------------------


def next_fire(cron: Cron, after: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """The first instant strictly after ``after`` at which ``cron`` fires in ``tz``
    (see the module docstring for clock changes). ``after`` must be aware; the
    result is in UTC. Raises ``CronError`` if nothing fires within 30 years."""
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    after = after.astimezone(UTC)
    local = after.astimezone(tz)
    best = _first_on_or_after_wall(cron, _wall(local), after, tz)
    if cron.every_hour and _clock_goes_back_near(after, tz):
        second = _second_pass(cron, local, after, tz)
        if second is not None and second < best:
            best = second
    return best


def _wall(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=None, fold=0)


def _first_on_or_after_wall(
    cron: Cron, wall: dt.datetime, after: dt.datetime, tz: dt.tzinfo
) -> dt.datetime:
    """The first matching wall time from ``wall`` on whose (first) instant is after ``after``."""
    candidate = wall.replace(second=0, microsecond=0)
    limit = wall.year + MAX_SEARCH_YEARS
    while True:
        candidate = _next_wall_match(cron, candidate, limit)
        instant = resolve(candidate, tz)
        if instant > after:
            return instant
        candidate += _MINUTE


def _second_pass(
    cron: Cron, local: dt.datetime, after: dt.datetime, tz: dt.tzinfo
) -> dt.datetime | None:
    """The earliest second-pass (fold=1) instant of a repeated wall time after ``after``."""
    wall = _wall(local) - _FOLD_WINDOW
    end = _wall(local) + _FOLD_WINDOW
    while wall <= end:
        try:
            wall = _next_wall_match(cron, wall.replace(second=0, microsecond=0), end.year + 1)
        except CronError:
            return None
        if wall > end:
            return None
        second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
        first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
        if second != first and second > after:
            return second
        wall += _MINUTE
    return None


def _clock_goes_back_near(after: dt.datetime, tz: dt.tzinfo) -> bool:
    offsets = [(after + k * _FOLD_WINDOW).astimezone(tz).utcoffset() for k in (-1, 0, 1)]
    return offsets[0] != offsets[1] or offsets[1] != offsets[2]


def resolve(wall: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """The instant (UTC) of a naive wall time in ``tz``: the first occurrence of a
    repeated time; the end of the jump for a time that does not exist."""
    instant = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(instant.astimezone(tz)) == wall:
        return instant
    # In a gap, fold=0 and fold=1 map to either side of the jump: walk up to it.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    low, high = min(instant, other), max(instant, other)
    offset_after = high.astimezone(tz).utcoffset()
    moment = low.replace(second=0, microsecond=0)
    while moment < high and moment.astimezone(tz).utcoffset() != offset_after:
        moment += _MINUTE
    return moment


def _next_wall_match(cron: Cron, wall: dt.datetime, limit_year: int) -> dt.datetime:
    """The first naive wall time >= ``wall`` (whole minutes) that matches ``cron``."""
    w = wall
    while w.year <= limit_year:
        if not cron.matches_day(w.date()):
            w = dt.datetime.combine(w.date() + dt.timedelta(days=1), dt.time())
            continue
        if w.hour not in cron.hours:
            w = w.replace(minute=0) + dt.timedelta(hours=1)
            continue
        if w.minute not in cron.minutes:
            w += _MINUTE
            continue
        return w
    raise CronError(f"cron expression {cron.text!r} does not fire within {MAX_SEARCH_YEARS} years")


def zone(name: str) -> ZoneInfo:
    """The ``ZoneInfo`` called ``name``; raises ``ValueError`` naming it."""
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(
            f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin')"
        ) from exc
