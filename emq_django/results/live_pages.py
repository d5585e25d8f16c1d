"""The admin's live views (issue 35): a queue's waiting, delayed and running jobs,
paged from the broker's monitor channel (``JOBS WAITING``/``JOBS RUNNING``, never
the whole queue), with Pause/Resume and Cancel; and a job manager's page.

Arguments are masked as the job page masks them (``EMQ_RESULTS_SHOW_ARGS``): while
masked, the broker is not even asked for them. Every control needs its own
permission, and says what it did (a message) or why not.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from emq_django.exceptions import EmqError
from emq_django.monitor_client import command
from emq_django.protocol.flow import parse_rate
from emq_django.results.conf import results_settings
from emq_django.results.dashboard import monitor_url
from emq_django.results.display import human_span
from emq_django.results.permissions import (
    CANCEL_JOBS,
    DRAIN_MANAGERS,
    PAUSE_QUEUES,
    RATE_LIMIT_QUEUES,
    RESIZE_MANAGERS,
    STOP_MANAGERS,
    allowed,
    refused,
)

PAGE = 50  # jobs per page of each list
PREVIEW_CHARS = 80
MASKED = "•••• (masked)"


class NotAName(ValueError):
    pass


def _word(name: str, what: str) -> str:
    if not name or not name.isprintable() or any(c.isspace() for c in name):
        raise NotAName(f"{what} {name!r} cannot be asked for: it is empty or has spaces")
    return name


def ask(*words: str) -> dict[str, Any]:
    """One monitor command (``monitor_client.command``)."""
    return command(*words)


def preview(body: str | None) -> str:
    """A short text of a job's arguments (``[args] {kwargs}``) from its body's
    preview, or the masked marker when the admin masks arguments."""
    if body is None:
        return MASKED
    try:
        run = json.loads(body)
        payload = run[1]
        text = json.dumps(payload.get("args", []), ensure_ascii=False)
        if payload.get("kwargs"):
            text += " " + json.dumps(payload["kwargs"], ensure_ascii=False)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        text = body  # not a run body (or cut short): as it is
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _page_number(request: HttpRequest, key: str) -> int:
    try:
        return max(int(request.GET.get(key, "1")), 1)
    except ValueError:
        return 1


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for job in doc.get("jobs", []):
        rows.append(
            {
                **job,
                "args": preview(job.get("body")),
                "waited_text": human_span(job.get("waited")),
                "running_text": human_span(job.get("running_for")),
            }
        )
    return rows


def _pager(doc: dict[str, Any], page: int) -> dict[str, Any]:
    pages = max(math.ceil(doc.get("total", 0) / PAGE), 1)
    return {"page": page, "pages": pages, "previous": page - 1, "next": page + 1}


def queue_view(model_admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    bodies = ["BODIES"] if results_settings().show_args else []
    waiting_page = _page_number(request, "waiting")
    running_page = _page_number(request, "running")
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": f"Queue {name}",
        "page_size": PAGE,
        "queue": name,
        "monitor_url": monitor_url(),
        "can_pause": allowed(request, PAUSE_QUEUES),
        "can_rate_limit": allowed(request, RATE_LIMIT_QUEUES),
        "can_cancel": allowed(request, CANCEL_JOBS),
        "error": "",
    }
    try:
        _word(name, "the queue")
        waiting = ask("JOBS", "WAITING", name, str((waiting_page - 1) * PAGE), str(PAGE), *bodies)
        running = ask("JOBS", "RUNNING", name, str((running_page - 1) * PAGE), str(PAGE), *bodies)
    except (EmqError, NotAName) as exc:
        context["error"] = str(exc)
        return TemplateResponse(request, "emq/live_queue.html", context)
    context.update(
        paused=waiting.get("paused", False),
        rate_limit=_rate_text(waiting.get("rate_limit")),
        waiting=_rows(waiting),
        waiting_total=waiting.get("total", 0),
        waiting_pager=_pager(waiting, waiting_page),
        spilled=waiting.get("spilled", 0),
        delayed=_rows({"jobs": waiting.get("delayed", [])}),
        delayed_total=waiting.get("delayed_total", 0),
        running=_rows(running),
        running_total=running.get("total", 0),
        running_pager=_pager(running, running_page),
    )
    return TemplateResponse(request, "emq/live_queue.html", context)


def queue_action(model_admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    action = request.POST.get("action", "")
    if action not in ("pause", "resume", "rate"):
        return HttpResponseBadRequest(
            f"Not done: {action!r} is not a queue action; use pause, resume or rate."
        )
    perm = RATE_LIMIT_QUEUES if action == "rate" else PAUSE_QUEUES
    if not allowed(request, perm):
        what = "change a queue's rate limit" if action == "rate" else f"{action} a queue"
        return refused(what, perm)
    back = HttpResponseRedirect(reverse("admin:emq_live_queue", args=[name]))
    rate = "".join(request.POST.get("rate", "").split()) or "off"  # one word: "10/s"
    try:
        if action == "rate" and rate.lower() != "off":
            parse_rate(rate, "the rate")  # said here, before the broker is asked
        words = ("RATE", rate) if action == "rate" else (action.upper(),)
        doc = ask("QUEUE", words[0], _word(name, "the queue"), *words[1:])
    except (EmqError, NotAName, ValueError) as exc:
        model_admin.message_user(request, f"Not done: {exc}", messages.ERROR)
        return back
    if action == "rate":
        was = _rate_text(doc.get("was"))
        text = (
            f"Queue {name!r}: rate limit {_rate_text(doc.get('rate_limit'))} from now on "
            f"(it was {was}) until the broker restarts; {doc.get('dispatched', 0)} waiting "
            "jobs dispatched at once."
        )
    elif action == "pause":
        was = " (it was paused already)" if doc.get("was_paused") else ""
        text = (
            f"Paused queue {name!r}{was}: its {doc.get('waiting', 0)} waiting jobs and new "
            "ones wait (nothing is refused); running jobs finish."
        )
    else:
        was = "" if doc.get("was_paused") else " (it was not paused)"
        text = f"Resumed queue {name!r}{was}: {doc.get('dispatched', 0)} waiting jobs dispatched."
    model_admin.message_user(request, text, messages.SUCCESS)
    return back


def _rate_text(rate: float | None) -> str:
    """A queue's rate limit, jobs per second, as a person reads it."""
    if rate is None:
        return "none"
    for unit, seconds in (("s", 1), ("m", 60), ("h", 3600)):
        count = rate * seconds
        if count >= 1 and abs(count - round(count)) < 1e-6:
            return f"{round(count)}/{unit}"
    return f"{rate:.4g}/s"


def job_manager_view(model_admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    running_page = _page_number(request, "running")
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": f"Job manager {name}",
        "name": name,
        "monitor_url": monitor_url(),
        "can_cancel": allowed(request, CANCEL_JOBS),
        "can_drain": allowed(request, DRAIN_MANAGERS),
        "can_stop": allowed(request, STOP_MANAGERS),
        "can_resize": allowed(request, RESIZE_MANAGERS),
        "error": "",
        "manager": None,
    }
    try:
        _word(name, "the job manager")
        status = ask("MONITOR", "JSON")
        running = ask("JOBS", "RUNNING", "@" + name, str((running_page - 1) * PAGE), str(PAGE))
    except (EmqError, NotAName) as exc:
        context["error"] = str(exc)
        return TemplateResponse(request, "emq/job_manager.html", context)
    found = [m for m in status.get("job_managers", []) if m.get("identity") == name]
    wall = status.get("broker", {}).get("time") or 0.0
    if found:
        manager = found[0]
        beat = manager.get("last_heartbeat")
        manager["heartbeat_ago"] = human_span(wall - beat) if beat else None
        manager["queue_names"] = [q for _, q in manager.get("queues", [])]
        context["manager"] = manager
    context.update(
        running=_rows(running),
        running_total=running.get("total", 0),
        running_pager=_pager(running, running_page),
    )
    return TemplateResponse(request, "emq/job_manager.html", context)


def job_manager_action(model_admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    """Drain a job manager (it finishes its running jobs, gets no new one), give
    it jobs again, or stop it (drained, it exits once they finish): ``MANAGER
    DRAIN|RESUME|STOP``; or change how many worker processes it runs (``MANAGER
    RESIZE``, the POST's ``concurrency``). The broker's refusal (EventMQ's job
    managers cannot; a number out of its bounds) is shown with its reason."""
    action = request.POST.get("action", "")
    if action not in ("drain", "resume", "stop", "resize"):
        return HttpResponseBadRequest(
            f"Not done: {action!r} is not a job manager action; use drain, resume, stop or resize."
        )
    perm = {"stop": STOP_MANAGERS, "resize": RESIZE_MANAGERS}.get(action, DRAIN_MANAGERS)
    if not allowed(request, perm):
        return refused(f"{action} a job manager", perm)
    back = HttpResponseRedirect(reverse("admin:emq_live_job_manager", args=[name]))
    extra: list[str] = []
    if action == "resize":
        count = request.POST.get("concurrency", "").strip()
        if not count.isdigit():
            text = f"Not done: the number of worker processes is a whole number, not {count!r}."
            model_admin.message_user(request, text, messages.ERROR)
            return back
        extra.append(count)
    try:
        doc = ask("MANAGER", action.upper(), _word(name, "the job manager"), *extra)
    except (EmqError, NotAName) as exc:
        model_admin.message_user(request, f"Not done: {exc}", messages.ERROR)
        return back
    if action == "resize":
        text = (
            f"Job manager {name!r} runs {doc.get('concurrency')} worker processes from now on "
            f"(it ran {doc.get('was')}): it starts more, or stops idle ones first and lets "
            "busy ones finish their running job."
        )
    elif action == "stop":
        text = (
            f"Stopping job manager {name!r}: it gets no new job, its "
            f"{doc.get('running', 0)} running jobs finish, then its process exits."
        )
    elif action == "drain":
        was = " (it was drained already)" if doc.get("was_drained") else ""
        text = (
            f"Drained job manager {name!r}{was}: its {doc.get('running', 0)} running jobs "
            "finish, and it gets no new job; the other job managers of its queues take them."
        )
    else:
        was = "" if doc.get("was_drained") else " (it was not drained)"
        text = (
            f"Job manager {name!r} takes jobs again{was}: "
            f"{doc.get('dispatched', 0)} waiting jobs dispatched to it."
        )
    model_admin.message_user(request, text, messages.SUCCESS)
    return back
