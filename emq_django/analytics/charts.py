"""Line charts as inline SVG, drawn on the server: no JavaScript, no CDN."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from html import escape

from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
Point = tuple[dt.datetime, float]


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return value


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def line_chart(
    series: Mapping[str, Sequence[Point]],
    start: dt.datetime,
    end: dt.datetime,
    unit: str = "",
    width: int = 720,
    height: int = 220,
) -> SafeString:
    """One polyline per series over [start, end]; a y axis from 0 and a legend."""
    left, right, top, bottom = 56, 12, 10, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    span = max((end - start).total_seconds(), 60.0)
    ymax = _nice_max(max((v for pts in series.values() for _, v in pts), default=0.0))

    def x(t: dt.datetime) -> float:
        return left + plot_w * (t - start).total_seconds() / span

    def y(v: float) -> float:
        return top + plot_h * (1 - v / ymax)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 18}" '
        f'role="img" style="font:11px sans-serif">'
    ]
    for i in range(5):
        v = ymax * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            f'stroke="#ddd"/><text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">'
            f"{_fmt(v)}{escape(unit)}</text>"
        )
    for i in range(5):
        t = start + (end - start) * i / 4
        parts.append(f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">{t:%H:%M}</text>')
    for n, (name, points) in enumerate(sorted(series.items())):
        color = PALETTE[n % len(PALETTE)]
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        if len(points) == 1:
            parts.append(
                f'<circle cx="{coords.split(",")[0]}" cy="{coords.split(",")[1]}" '
                f'r="2" fill="{color}"/>'
            )
        elif points:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'
            )
        lx = left + 110 * n
        parts.append(
            f'<rect x="{lx}" y="{height + 6}" width="10" height="3" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{height + 11}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308  (every text is escaped above)
