"""What a job's admin page shows: the history row, its story from the trace log,
and where it came from (a schedule, an admin retry) and went (its retries)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.apps import apps
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from emq_django.conf import cached_settings
from emq_django.logconfig import job_fields
from emq_django.results import trace_lookup
from emq_django.results.conf import results_settings
from emq_django.results.display import (
    DASH,
    human_duration,
    human_span,
    precise_time,
    seconds_between,
    status_label,
)
from emq_django.results.models import JobResult, RetryLink
from emq_django.results.workflow_page import workflow_of

log = logging.getLogger(__name__)

MASK = "•••• (masked: set EMQ_RESULTS_SHOW_ARGS=true to show)"
# statuses in which the job may still wait at the broker: Cancel is offered
CANCELLABLE = ("retrying",)
# a job without a history row whose trace ends in one of these is over: no Cancel
OVER = ("succeeded", "failed", "timed_out", "dead_lettered", "cancelled")
# a job without a history row: its state from its last trace event, in the words its
# attempts use ("dispatched" is an attempt that runs)
STATE_OF_EVENT = {"enqueued": "waiting", "dispatched": "running", "requeued": "waiting"}


def _pretty(text: str) -> str:
    if not text:
        return DASH
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _story(job_id: str, around: dt.datetime) -> trace_lookup.JobStory:
    try:
        return trace_lookup.job_story(job_id, around)
    except OSError as exc:
        log.warning(
            "could not read the trace log for job %s: %s", job_id, exc, extra=job_fields(job_id)
        )
        return trace_lookup.JobStory()


def _schedule_run(job_id: str) -> Any:
    if not apps.is_installed("emq_django.scheduler"):
        return None
    from emq_django.scheduler.models import ScheduleRun

    return ScheduleRun.objects.filter(job_id=job_id).select_related("schedule").first()


def _task_state(job_id: str) -> Any:
    if not apps.is_installed("emq_django.backends"):
        return None
    from emq_django.backends.models import TaskState

    return TaskState.objects.filter(pk=job_id).first()


def origins(job_id: str) -> dict[str, Any]:
    retry_of = RetryLink.objects.filter(job_id=job_id).first()
    return {
        "retry_of": retry_of,
        "retried_as": list(RetryLink.objects.filter(original_id=job_id).order_by("created_at")),
        "schedule_run": _schedule_run(job_id),
        "task_state": _task_state(job_id),
    }


def enqueued_at(row: JobResult | None, story: trace_lookup.JobStory, links: dict[str, Any]) -> Any:
    """The first of: the row, the trace log, the Django task state, the schedule's
    run, the admin's retry (each is when the job was sent, seen from one side)."""
    candidates = [
        row.enqueued_at if row else None,
        story.enqueued,
        getattr(links["task_state"], "enqueued_at", None),
        getattr(links["schedule_run"], "sent_at", None),
        getattr(links["retry_of"], "created_at", None),
    ]
    return next((c for c in candidates if c is not None), None)


def _attempts(row: JobResult | None, story: trace_lookup.JobStory) -> list[dict[str, Any]]:
    attempts = story.attempts
    if not attempts and row is not None:
        attempts = [
            trace_lookup.Attempt(
                row.attempts,
                row.job_manager,
                row.started_at,
                row.finished_at,
                row.status,
                row.runtime,
                row.error_type,
            )
        ]
    return [
        {
            "number": a.number,
            "job_manager": a.job_manager or DASH,
            "dispatched": precise_time(a.dispatched),
            "finished": precise_time(a.finished),
            "outcome": status_label(a.outcome) if a.outcome else DASH,
            "run": human_duration(a.run_seconds),
            "error": a.error,
        }
        for a in attempts
    ]


def context(job_id: str) -> dict[str, Any]:
    row = JobResult.objects.filter(pk=job_id).first()
    links = origins(job_id)
    story = _story(job_id, row.finished_at if row else timezone.now())
    enqueued = enqueued_at(row, story, links)
    page: dict[str, Any] = {"job_id": job_id, "row": row, "story": story, **links}
    page["workflow"] = workflow_of(job_id)  # (workflow id, step path) of a workflow's step
    page["title"] = f"Job {job_id}"
    page["enqueued"] = precise_time(enqueued)
    state = links["task_state"]
    page["task"] = row.task if row else getattr(state, "task", "") or story.task
    page["queue"] = row.queue if row else getattr(state, "queue", "") or story.queue
    page["trace_id"], page["trace_url"] = trace_link(story)
    if row is None:
        page["state"] = STATE_OF_EVENT.get(story.final, story.final) or "not finished"
        page["state_label"] = status_label(page["state"])
        page["can_cancel"] = story.final not in OVER
        page["row_pending"] = story.final in OVER and story.final != "cancelled"
        page["attempts"] = _attempts(None, story)
        return page
    started = story.attempts[-1].dispatched if story.attempts else None
    started = started or row.started_at
    show = results_settings().show_args
    page.update(
        state=row.status,
        state_label=status_label(row.status),
        can_cancel=row.status in CANCELLABLE,
        started=precise_time(row.started_at),
        finished=precise_time(row.finished_at),
        wait=human_span(seconds_between(enqueued, started)),
        run=human_duration(row.runtime),
        end_to_end=human_span(seconds_between(enqueued, row.finished_at)),
        attempts=_attempts(row, story),
        args=_pretty(row.args) if show else MASK,
        kwargs=_pretty(row.kwargs) if show else MASK,
        result=_pretty(row.result),
        partials=getattr(row, "partials", None),
    )
    return page


def trace_link(story: trace_lookup.JobStory) -> tuple[str, str]:
    """The job's OpenTelemetry trace id (its enqueued line's ``otel``) and its link
    (``EMQ_TRACE_URL``), each '' when there is none."""
    trace_id = next((str(e["otel"]) for e in story.events if e.get("otel")), "")
    template = cached_settings().TRACE_URL
    if not trace_id or not template:
        return trace_id, ""
    return trace_id, template.replace("{trace_id}", trace_id)


def render(request: HttpRequest, page: dict[str, Any]) -> HttpResponse:
    return TemplateResponse(request, "emq/job_detail.html", page)
