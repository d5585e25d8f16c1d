"""The admin's workflow page (issue 34): a workflow's steps, read from the job
history (a step's job id is ``<workflow id>/<path>``), in graph order, with their
state, timings and a link to each step's job page. The job page of a step links
back here (``workflow_of``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from emq_django.results.display import human_duration, precise_time, status_label
from emq_django.results.models import JobResult


def workflow_of(job_id: str) -> tuple[str, str] | None:
    """(workflow id, step path) if ``job_id`` is a workflow's step, else None."""
    workflow_id, sep, step = job_id.partition("/")
    if not sep or not workflow_id or not step.startswith("root"):
        return None
    return workflow_id, step


def _order(path: str) -> tuple[tuple[int, int | str], ...]:
    """Graph order: ``root.2`` before ``root.10``, members before ``body``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in path.split("."))


def context(workflow_id: str) -> dict[str, Any]:
    rows = JobResult.objects.filter(id__startswith=f"{workflow_id}/")
    steps: list[dict[str, object]] = []
    for row in rows:
        path = row.id.partition("/")[2]
        steps.append(
            {
                "id": row.id,
                "path": path,
                "depth": path.count("."),
                "task": row.task,
                "state": row.status,
                "state_label": status_label(row.status),
                "started": precise_time(row.started_at),
                "finished": precise_time(row.finished_at),
                "run": human_duration(row.runtime),
                "attempts": row.attempts,
                "error": f"{row.error_type}: {row.error}" if row.error_type else "",
            }
        )
    steps.sort(key=lambda s: _order(str(s["path"])))
    return {"workflow_id": workflow_id, "steps": steps, "title": f"Workflow {workflow_id}"}


def render(request: HttpRequest, page: dict[str, Any]) -> HttpResponse:
    return TemplateResponse(request, "emq/workflow_detail.html", page)
