"""Line charts as inline SVG, drawn on the server: no JavaScript, no CDN.

The SVG scales to the page's width (``viewBox``); the y axis has round ticks
(1, 2 or 5 times a power of ten) and the time axis round times that fit inside.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from html import escape

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
Point = tuple[dt.datetime, float]
# seconds between time ticks, the smallest that leaves room for each label
TIME_STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 4 * 3600, 6 * 3600, 86400)


def nice_ticks(top: float, most: int = 6) -> list[float]:
    """0 up to at least ``top`` in round steps (1, 2, 2.5 or 5 x 10^k), at most ``most``+1."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def tick_label(value: float, step: float) -> str:
    """A tick as few digits as its step needs: 0, 0.5, 1,500, 2.5k never 1.56e+3."""
    decimals = 0
    while decimals < 6 and abs(round(step * 10**decimals) - step * 10**decimals) > 1e-9:
        decimals += 1
    if value >= 10_000 and decimals == 0:
        return f"{value / 1000:,.{0 if value % 1000 == 0 else 1}f}k"
    return f"{value:,.{decimals}f}"


def time_step(span: float, most: int, least: int = 0) -> int:
    """The smallest of TIME_STEPS (at least ``least``) that gives at most ``most`` ticks."""
    steps = [s for s in TIME_STEPS if s >= least] or [TIME_STEPS[-1]]
    return next((s for s in steps if span / s <= most), steps[-1])


def time_ticks(
    start: dt.datetime, end: dt.datetime, most: int, least: int = 0
) -> list[dt.datetime]:
    span = max((end - start).total_seconds(), 1.0)
    step = time_step(span, most, least)
    first = math.ceil(start.timestamp() / step) * step
    ticks, t = [], first
    while t <= end.timestamp() + 1e-6:
        ticks.append(dt.datetime.fromtimestamp(t, dt.UTC))
        t += step
    return ticks


def _time_label(t: dt.datetime, span: float, step: int) -> str:
    local = timezone.localtime(t) if timezone.is_aware(t) else t
    if span > 2 * 86400:
        return f"{local:%b %d %H:%M}"
    return f"{local:%H:%M}" if step % 60 == 0 else f"{local:%H:%M:%S}"


def line_chart(
    series: Mapping[str, Sequence[Point]],
    start: dt.datetime,
    end: dt.datetime,
    unit: str = "",
    width: int = 1200,
    height: int = 240,
    resolution: int = 60,
) -> SafeString:
    """One polyline per series over [start, end]; a y axis from 0 and a legend.
    ``resolution``: seconds between the data's points, the smallest tick step (a
    chart of minutes gets no 11:38:10 ticks between its points)."""
    left, right, top, bottom = 64, 40, 10, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    span = max((end - start).total_seconds(), 1.0)
    ticks = nice_ticks(max((v for pts in series.values() for _, v in pts), default=0.0))
    ymax = ticks[-1]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else ymax

    def x(t: dt.datetime) -> float:
        return left + plot_w * (t - start).total_seconds() / span

    def y(v: float) -> float:
        return top + plot_h * (1 - v / ymax)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height + 18}" '
        f'width="100%" role="img" class="emq-line-chart" style="font:12px sans-serif">'
    ]
    for v in ticks:
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            f'stroke="#ddd"/><text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
            f"{tick_label(v, step)}{escape(unit)}</text>"
        )
    label_room = 80 if span > 2 * 86400 else 60
    most = max(2, plot_w // label_room)
    t_step = time_step(span, most, resolution)
    for t in time_ticks(start, end, most, resolution):
        parts.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" '
            f'stroke="#999"/><text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">'
            f"{_time_label(t, span, t_step)}</text>"
        )
    for n, (name, points) in enumerate(sorted(series.items())):
        color = PALETTE[n % len(PALETTE)]
        coords = [(x(t), y(v)) for t, v in points]
        if len(coords) == 1:
            cx, cy = coords[0]
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}"/>')
        elif coords:
            text = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{text}"/>'
            )
        lx = left + 140 * n
        parts.append(
            f'<rect x="{lx}" y="{height + 6}" width="12" height="4" fill="{color}"/>'
            f'<text x="{lx + 16}" y="{height + 12}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308  (every text is escaped above)
