"""The cron parser and ``next_fire``: a table, as arq tests its ``next_cron``.

Each row: expression, time zone, the instant after which to look (local wall time
in that zone, with its UTC offset), and the expected next fire as local wall
time with offset. DST rows: Europe/Berlin springs forward on 2024-03-31 at 02:00
(CET +01 -> CEST +02) and falls back on 2024-10-27 at 03:00; America/New_York on
2024-03-10 at 02:00 (EST -05 -> EDT -04) and 2024-11-03 at 02:00.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from emq_django.scheduler.cron import CronError, next_fire, parse_cron

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
UTC = "UTC"


def at(text: str) -> dt.datetime:
    """An ISO instant with its offset, e.g. ``2024-03-31T01:59+01:00``."""
    return dt.datetime.fromisoformat(text)


NEXT_FIRE = [
    # -- plain fields, steps, ranges, lists, names
    ("* * * * *", UTC, "2024-01-01T00:00:00+00:00", "2024-01-01T00:01:00+00:00"),
    ("* * * * *", UTC, "2024-01-01T00:00:30+00:00", "2024-01-01T00:01:00+00:00"),
    ("*/15 * * * *", UTC, "2024-01-01T00:14:59+00:00", "2024-01-01T00:15:00+00:00"),
    ("*/15 * * * *", UTC, "2024-01-01T00:45:00+00:00", "2024-01-01T01:00:00+00:00"),
    ("5-10/2 * * * *", UTC, "2024-01-01T00:07:00+00:00", "2024-01-01T00:09:00+00:00"),
    ("5-10/2 * * * *", UTC, "2024-01-01T00:09:00+00:00", "2024-01-01T01:05:00+00:00"),
    ("0 9-17/4 * * *", UTC, "2024-01-01T13:00:00+00:00", "2024-01-01T17:00:00+00:00"),
    ("0 9-17/4 * * *", UTC, "2024-01-01T17:00:00+00:00", "2024-01-02T09:00:00+00:00"),
    ("1,31,59 * * * *", UTC, "2024-01-01T00:31:00+00:00", "2024-01-01T00:59:00+00:00"),
    (
        "30 8 * * mon-fri",
        UTC,
        "2024-01-05T09:00:00+00:00",
        "2024-01-08T08:30:00+00:00",
    ),  # Fri -> Mon
    ("0 0 * * sun", UTC, "2024-01-01T00:00:00+00:00", "2024-01-07T00:00:00+00:00"),
    ("0 0 * * 7", UTC, "2024-01-01T00:00:00+00:00", "2024-01-07T00:00:00+00:00"),  # 7 = Sunday
    ("0 0 * * 1,3,5", UTC, "2024-01-01T00:00:00+00:00", "2024-01-03T00:00:00+00:00"),
    ("0 12 * jan,jul *", UTC, "2024-02-01T00:00:00+00:00", "2024-07-01T12:00:00+00:00"),
    ("0 0 1 */3 *", UTC, "2024-02-15T00:00:00+00:00", "2024-04-01T00:00:00+00:00"),
    ("@hourly", UTC, "2024-01-01T10:20:00+00:00", "2024-01-01T11:00:00+00:00"),
    ("@daily", UTC, "2024-01-01T10:20:00+00:00", "2024-01-02T00:00:00+00:00"),
    ("@weekly", UTC, "2024-01-01T10:20:00+00:00", "2024-01-07T00:00:00+00:00"),
    ("@yearly", UTC, "2024-01-01T10:20:00+00:00", "2025-01-01T00:00:00+00:00"),
    # -- day-of-month OR day-of-week when both are restricted (as cron does)
    ("0 0 13 * fri", UTC, "2024-01-01T00:00:00+00:00", "2024-01-05T00:00:00+00:00"),
    ("0 0 13 * fri", UTC, "2024-01-12T00:00:00+00:00", "2024-01-13T00:00:00+00:00"),
    # -- month ends, leap years, year end
    ("0 0 31 * *", UTC, "2024-01-31T00:00:00+00:00", "2024-03-31T00:00:00+00:00"),
    ("0 0 30 * *", UTC, "2024-01-30T00:00:00+00:00", "2024-03-30T00:00:00+00:00"),
    ("0 0 29 2 *", UTC, "2024-03-01T00:00:00+00:00", "2028-02-29T00:00:00+00:00"),
    ("0 0 29 2 *", UTC, "2023-06-01T00:00:00+00:00", "2024-02-29T00:00:00+00:00"),
    ("59 23 31 12 *", UTC, "2024-12-31T23:59:00+00:00", "2025-12-31T23:59:00+00:00"),
    ("0 0 1 * *", UTC, "2024-12-31T23:59:59+00:00", "2025-01-01T00:00:00+00:00"),
    ("0 0 28-31 2 *", UTC, "2023-02-28T00:00:00+00:00", "2024-02-28T00:00:00+00:00"),
    # -- time zones without a change
    ("0 9 * * *", BERLIN, "2024-01-15T09:00:00+01:00", "2024-01-16T09:00:00+01:00"),
    ("0 9 * * *", NEW_YORK, "2024-07-15T08:00:00-04:00", "2024-07-15T09:00:00-04:00"),
    # -- Europe/Berlin springs forward: 02:00-02:59 does not exist on 2024-03-31
    ("30 2 * * *", BERLIN, "2024-03-30T12:00:00+01:00", "2024-03-31T03:00:00+02:00"),
    ("30 2 * * *", BERLIN, "2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"),
    ("*/15 2 * * *", BERLIN, "2024-03-31T01:50:00+01:00", "2024-03-31T03:00:00+02:00"),  # once
    ("*/15 2 * * *", BERLIN, "2024-03-31T03:00:00+02:00", "2024-04-01T02:00:00+02:00"),
    ("0 3 * * *", BERLIN, "2024-03-31T01:30:00+01:00", "2024-03-31T03:00:00+02:00"),
    ("*/30 * * * *", BERLIN, "2024-03-31T01:30:00+01:00", "2024-03-31T03:00:00+02:00"),
    ("*/30 * * * *", BERLIN, "2024-03-31T03:00:00+02:00", "2024-03-31T03:30:00+02:00"),
    ("0 9 * * *", BERLIN, "2024-03-30T09:00:00+01:00", "2024-03-31T09:00:00+02:00"),  # 23 h
    # -- Europe/Berlin falls back: 02:00-02:59 happens twice on 2024-10-27
    ("30 2 * * *", BERLIN, "2024-10-27T01:50:00+02:00", "2024-10-27T02:30:00+02:00"),
    ("30 2 * * *", BERLIN, "2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"),  # once
    ("*/30 * * * *", BERLIN, "2024-10-27T02:30:00+02:00", "2024-10-27T02:00:00+01:00"),
    ("*/30 * * * *", BERLIN, "2024-10-27T02:00:00+01:00", "2024-10-27T02:30:00+01:00"),
    ("*/30 * * * *", BERLIN, "2024-10-27T02:30:00+01:00", "2024-10-27T03:00:00+01:00"),
    ("0 9 * * *", BERLIN, "2024-10-26T09:00:00+02:00", "2024-10-27T09:00:00+01:00"),  # 25 h
    # -- America/New_York springs forward: 02:00-02:59 does not exist on 2024-03-10
    ("30 2 * * *", NEW_YORK, "2024-03-09T12:00:00-05:00", "2024-03-10T03:00:00-04:00"),
    ("30 2 * * *", NEW_YORK, "2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"),
    ("0 * * * *", NEW_YORK, "2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00"),
    # -- America/New_York falls back: 01:00-01:59 happens twice on 2024-11-03
    ("30 1 * * *", NEW_YORK, "2024-11-03T00:00:00-04:00", "2024-11-03T01:30:00-04:00"),
    ("30 1 * * *", NEW_YORK, "2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"),  # once
    ("0 * * * *", NEW_YORK, "2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00"),  # twice
    ("0 * * * *", NEW_YORK, "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"),
    ("*/20 * * * *", NEW_YORK, "2024-11-03T01:40:00-04:00", "2024-11-03T01:00:00-05:00"),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), NEXT_FIRE)
def test_next_fire(expr: str, tz: str, after: str, expected: str) -> None:
    got = next_fire(parse_cron(expr), at(after), ZoneInfo(tz))
    assert got == at(expected), f"{got.astimezone(ZoneInfo(tz)).isoformat()} != {expected}"
    assert got.astimezone(ZoneInfo(tz)).utcoffset() == at(expected).utcoffset()


def test_next_fire_is_in_utc_and_strictly_after() -> None:
    after = at("2024-01-01T00:00:00+00:00")
    got = next_fire(parse_cron("0 0 * * *"), after, ZoneInfo(UTC))
    assert got.tzinfo is dt.UTC and got > after


def test_next_fire_needs_an_aware_time() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire(parse_cron("* * * * *"), dt.datetime(2024, 1, 1), ZoneInfo(UTC))


def test_a_day_of_fall_back_every_15_minutes_keeps_real_rhythm() -> None:
    """Through the repeated hour, ``*/15`` fires every 15 real minutes: 100 fires a day."""
    tz = ZoneInfo(BERLIN)
    moment = at("2024-10-27T00:00:00+02:00") - dt.timedelta(seconds=1)
    fires = []
    while True:
        moment = next_fire(parse_cron("*/15 * * * *"), moment, tz)
        if moment >= at("2024-10-28T00:00:00+01:00"):
            break
        fires.append(moment)
    assert len(fires) == 25 * 4
    assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {dt.timedelta(minutes=15)}


PARSED = [
    ("*/20 * * * *", "minutes", {0, 20, 40}),
    ("0-10/5,30 * * * *", "minutes", {0, 5, 10, 30}),
    ("0 22-23 * * *", "hours", {22, 23}),
    ("0 0 * feb-apr *", "months", {2, 3, 4}),
    ("0 0 * * sat,sun", "weekdays", {0, 6}),
    ("0 0 * * 5-7", "weekdays", {0, 5, 6}),
    ("0 0 * * */2", "weekdays", {0, 2, 4, 6}),
    ("0 0 10/10 * *", "days", {10, 20, 30}),
    ("  0   0  *  *  MON ", "weekdays", {1}),
]


@pytest.mark.parametrize(("expr", "field", "values"), PARSED)
def test_parse_fields(expr: str, field: str, values: set[int]) -> None:
    assert set(getattr(parse_cron(expr), field)) == values


BAD = [
    ("", "has 0 fields"),
    ("* * * *", "has 4 fields; it needs 5"),
    ("* * * * * *", "has 6 fields"),
    ("60 * * * *", "60 is out of range for the minute field (0-59)"),
    ("* 24 * * *", "out of range for the hour field"),
    ("* * 0 * *", "out of range for the day of month field (1-31)"),
    ("* * * 13 *", "out of range for the month field"),
    ("* * * * 8", "out of range for the day of week field"),
    ("10-5 * * * *", "runs backwards"),
    ("*/0 * * * *", "out of range"),
    ("a * * * *", "'a' in the minute field is not a number"),
    ("* * * foo *", "or a name (jan..dec)"),
    ("1,,2 * * * *", "empty item"),
    ("0 0 30 2 *", "never fires"),
    ("0 0 31 4,6 *", "never fires"),
    ("@often", "has 1 fields"),
]


@pytest.mark.parametrize(("expr", "message"), BAD)
def test_bad_expressions_say_what_is_wrong(expr: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cron(expr)


def test_cron_error_is_a_value_error_naming_the_expression() -> None:
    with pytest.raises(ValueError, match="cron expression '61 \\* \\* \\* \\*'"):
        parse_cron("61 * * * *")
