"""Structured logging: a log record about one job carries job_id, attempt, queue, task."""

from __future__ import annotations

import logging

import pytest

from emq_django.logconfig import JOB_FIELDS, job_fields
from emq_django.worker.execution import execute


def test_job_fields_split_the_attempt_from_the_job_id() -> None:
    assert job_fields(b"abc#3", "email", "app.send") == {
        "job_id": "abc",
        "attempt": 3,
        "queue": "email",
        "task": "app.send",
    }
    assert job_fields("abc") == {"job_id": "abc", "attempt": 1, "queue": "", "task": ""}
    assert tuple(job_fields("x")) == JOB_FIELDS


@pytest.mark.django_db  # execute() closes old connections around the job
def test_a_refused_job_is_logged_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="emq_django"):
        outcome = execute(b"not json", b"job-1#2")
    assert outcome.failed
    (record,) = [r for r in caplog.records if "refused job" in r.getMessage()]
    assert (record.job_id, record.attempt) == ("job-1", 2)  # type: ignore[attr-defined]
