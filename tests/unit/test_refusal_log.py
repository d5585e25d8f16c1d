"""While the journal cannot commit, the broker says so at most once a second, with
the count of refused jobs, not one ERROR line per loop turn (issue 32: about 600
lines in 3 s during a PostgreSQL outage)."""

from __future__ import annotations

import logging

import pytest

from emq_django.broker.refusal_log import RefusalLog


def test_one_line_a_second_with_the_count_and_the_rest_when_it_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    refusals = RefusalLog(logging.getLogger("test.refusals"), 1.0, lambda: now[0])
    with caplog.at_level(logging.ERROR, "test.refusals"):
        for _ in range(600):  # 3 s of failed commits, one job each
            refusals.refused("journal pg: connection refused", 1)
            now[0] += 0.005
        assert len(caplog.records) == 3  # the first at once, then one a second
        assert caplog.records[0].getMessage() == (
            "journal pg: connection refused: refusing 1 guaranteed jobs"
        )
        assert "failed commits since the last line" in caplog.records[1].getMessage()
        refusals.flush()  # the journal works again: what was held back is said
        assert len(caplog.records) == 4 and refusals.held == 0
        logged = [int(r.getMessage().split("refusing ")[1].split()[0]) for r in caplog.records]
        assert sum(logged) == 600
        refusals.flush()  # nothing held: no line
        assert len(caplog.records) == 4
