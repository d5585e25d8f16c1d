"""The admin's metrics page (issue 17): a young demo's minutes fill the chart, round
ticks, labels inside the chart, job manager figures over the minutes with data,
rounded numbers in the metric rows."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from emq_django.analytics.charts import nice_ticks, tick_label
from emq_django.analytics.models import JobManagerMetric, QueueMetric

pytestmark = pytest.mark.django_db
PAGE = "/admin/emq_analytics/metricsdashboard/"


@pytest.fixture
def staff() -> Client:
    user = User.objects.create_superuser("admin", "a@example.com", "admin")
    c = Client()
    c.force_login(user)
    return c


def two_minutes_of_data() -> dt.datetime:
    first = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    for n, throughput in enumerate((1.6166666666666667, 26.05, 15.6)):
        QueueMetric.objects.create(
            queue="default",
            minute=first + dt.timedelta(minutes=n),
            jobs=int(throughput * 60),
            succeeded=int(throughput * 60),
            failed=0,
            timed_out=0,
            retried=0,
            throughput=throughput,
            e2e_p95_ms=3.63 * (n + 1),
        )
    for n in range(2):  # busy 30 s in each of 2 minutes: 0.5 busy processes
        JobManagerMetric.objects.create(
            jm="jm-1",
            minute=first + dt.timedelta(minutes=n),
            attempts=10,
            succeeded=10,
            failed=0,
            busy_ms=30_000.0,
            utilisation=0.5,
        )
    return first


def test_nice_ticks_are_round() -> None:
    assert nice_ticks(3.63) == [0, 1, 2, 3, 4]
    assert nice_ticks(1560) == [0, 500, 1000, 1500, 2000]
    assert [tick_label(v, 500) for v in (0, 1500)] == ["0", "1,500"]
    assert [tick_label(v, 0.05) for v in (0.05, 0.1)] == ["0.05", "0.10"]
    assert [tick_label(v, 0.25) for v in (0.25, 1.0)] == ["0.25", "1.00"]
    assert "e+" not in "".join(tick_label(v, 2000) for v in nice_ticks(11_000))


def test_two_minute_demo_fills_the_chart(staff: Client) -> None:
    two_minutes_of_data()
    page = staff.get(PAGE).content.decode()
    assert "<title>Metrics" in page and "Job metrics" not in page
    svg = page[page.index("<svg", page.index("<figure>")) :]
    svg = svg[: svg.index("</svg>")]
    width = float(re.search(r'viewBox="0 0 (\d+) ', svg).group(1))  # type: ignore[union-attr]
    points = re.search(r'<polyline[^>]*points="([^"]+)"', svg).group(1)  # type: ignore[union-attr]
    xs = [float(p.split(",")[0]) for p in points.split()]
    assert xs[0] < 0.1 * width and xs[-1] > 0.6 * width, xs  # across the chart, not a sliver
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle">([^<]+)<', svg)
    # one tick per minute (the data's resolution), not 11:38:10 ticks between points
    assert len(labels) >= 2 and all(re.fullmatch(r"\d\d:\d\d", t) for _, t in labels), labels
    assert all(float(x) + 30 <= width for x, _ in labels), labels  # no label cut at the edge
    y_labels = re.findall(r'text-anchor="end">([^<]+)<', svg)
    assert y_labels == ["0", "5", "10", "15", "20", "25", "30"], y_labels
    assert 'width="100%"' in svg  # the page's width


def test_job_manager_mean_over_minutes_with_data(staff: Client) -> None:
    two_minutes_of_data()
    page = staff.get(PAGE + "?hours=6").content.decode()
    table = page[page.index("<h2>Job managers</h2>") :]
    row = re.search(r"<td>jm-1</td>(.*?)</tr>", table, re.S).group(1)  # type: ignore[union-attr]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells == ["20", "2", "0.50", "0.50"], cells


def test_queue_metric_rows_are_rounded(staff: Client) -> None:
    two_minutes_of_data()
    page = staff.get("/admin/emq_analytics/queuemetric/").content.decode()
    assert "1.62" in page and "1.6166666666666667" not in page
