"""How the admin shows times, durations and numbers: pure functions, no Django models."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

DASH = "—"


def status_label(status: str) -> str:
    """How a status reads everywhere in the admin: ``timed_out`` -> "timed out"."""
    return status.replace("_", " ")


def human_duration(seconds: float | None) -> str:
    """``0.000712`` -> "712 µs", ``1.6`` -> "1.6 s", ``185`` -> "3 min 5 s"."""
    if seconds is None:
        return DASH
    s = max(float(seconds), 0.0)
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 60:
        return f"{s:.3g} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(s) // 60, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def human_span(seconds: float | None) -> str:
    """A wait or an end-to-end time: the span between two timestamps, "< 1 ms" below a
    millisecond. The broker reads its clock once per batch of messages, so a job
    dispatched in the batch that brought it shows a wait of exactly 0."""
    if seconds is not None and seconds < 1e-3:
        return "< 1 ms"
    return human_duration(seconds)


def precise_time(value: dt.datetime | None) -> str:
    """Local time to the millisecond: "2026-11-22 09:34:05.123"."""
    if value is None:
        return DASH
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d}"


def short_time(value: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """To the second; the date only when it is not today: "09:34:05", "Nov 21 09:34:05"."""
    if value is None:
        return DASH
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    today = timezone.localtime(now or timezone.now()).date()
    return f"{local:%H:%M:%S}" if local.date() == today else f"{local:%b %d %H:%M:%S}"


def seconds_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def round_number(value: float | None, digits: int = 3) -> str:
    """A figure for a table: 1.6166666666666667 -> "1.62", 1234.5 -> "1,234"."""
    if value is None:
        return DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    text = f"{value:.{digits}g}"
    return text if "e" not in text else f"{value:.{digits}f}"
