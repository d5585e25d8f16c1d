"""The admin's permissions for what acts on the broker (issue 29 item 19).

Each action has its own permission (Meta.permissions of ``JobResult``,
``Dashboard`` and ``ScheduledJob``): a staff login may look at the dead letters,
and the view permission shows jobs and schedules, but neither retries, cancels,
runs, requeues or purges. A refusal says which permission is missing.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponseForbidden

RETRY_JOBS = "emq_results.retry_jobresult"
CANCEL_JOBS = "emq_results.cancel_jobresult"
REQUEUE_DEAD = "emq_results.requeue_deadletters"
PURGE_DEAD = "emq_results.purge_deadletters"
PAUSE_QUEUES = "emq_results.pause_queues"
DRAIN_MANAGERS = "emq_results.drain_job_managers"
STOP_MANAGERS = "emq_results.stop_job_managers"
RESIZE_MANAGERS = "emq_results.resize_job_managers"
RATE_LIMIT_QUEUES = "emq_results.rate_limit_queues"
RUN_SCHEDULES = "emq_scheduler.run_scheduledjob"


def allowed(request: HttpRequest, perm: str) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(perm))


def refused(what: str, perm: str) -> HttpResponseForbidden:
    """A 403 that names the missing permission and who can grant it."""
    return HttpResponseForbidden(
        f"Not done: to {what} you need the permission {perm!r}. Ask an administrator to "
        "grant it (admin: Users or Groups, user permissions).",
        content_type="text/plain; charset=utf-8",
    )
