"""The live lists and the queue controls of the monitor channel (issue 35), neutral
to protocols: waiting jobs of a queue (and its delayed ones, with their due time),
the jobs running now, and pausing or resuming a queue.

Every list is one bounded page (``offset``, ``limit`` up to ``MAX_PAGE``), so that
a queue of a million jobs is never sent whole; nothing here runs on the dispatch
path. A paused queue keeps taking jobs (nothing is refused: they wait), and no job
of it is dispatched until it is resumed; the pause lasts until resumed or the
broker restarts (it is not journaled).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from emq_django.broker.priority import RankedPending

if TYPE_CHECKING:
    from emq_django.broker.core import BrokerCore
    from emq_django.broker.state import Job

MAX_PAGE = 500
PREVIEW_BYTES = 200  # of a job's body, in the lists (the admin masks it by default)


def _preview(job: Job) -> str:
    text = job.body[:PREVIEW_BYTES].decode("utf-8", "replace")
    return text + "…" if len(job.body) > PREVIEW_BYTES else text


def _job(job: Job, wall_offset: float, now: float, bodies: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": job.id.decode("utf-8", "replace"),
        "task": job.headers.task,
        "queue": job.queue,
        "attempt": job.attempt,
        "enqueued": round(job.enqueued_at + wall_offset, 3),
        "waited": round(max(now - job.enqueued_at, 0.0), 3),
        "guaranteed": job.headers.guarantee,
    }
    if bodies:
        doc["body"] = _preview(job)
    return doc


def waiting(
    core: BrokerCore, queue_name: str, offset: int, limit: int, bodies: bool, now: float
) -> dict[str, Any]:
    """One page of a queue's waiting jobs in the order they go (oldest first; a
    queue with priorities: highest first, aging counted), and one of its delayed
    jobs (a ``run_after`` or a retry's back-off), soonest due first."""
    limit = min(limit, MAX_PAGE)
    wall_offset = core.wall_offset
    queue = core.queues.get(queue_name)
    jobs: list[dict[str, Any]] = []
    total = spilled = 0
    if queue is not None:
        total, spilled = len(queue.pending), queue.spilled
        pending = queue.pending
        if isinstance(pending, RankedPending):
            page: Iterable[Job] = pending.page(offset, limit)
        else:
            page = itertools.islice(pending, offset, offset + limit)
        jobs = [_job(job, wall_offset, now, bodies) for job in page]
    # the delayed jobs of every queue share one heap: this request walks it once
    heap = core.life.delayed._heap  # (read only: the monitor's view)
    mine = [(due, seq, job) for due, seq, job in heap if job.queue == queue_name]
    delayed = []
    for due, _, job in heapq.nsmallest(limit, mine):
        doc = _job(job, wall_offset, now, bodies)
        doc["due"] = round(due + wall_offset, 3)
        doc["countdown"] = round(max(due - now, 0.0), 3)
        delayed.append(doc)
    return {
        "queue": queue_name,
        "exists": queue is not None,
        "paused": bool(queue is not None and queue.paused),
        "rate_limit": core.flow.queue_rates.get(queue_name),  # jobs per second
        "total": total,
        "spilled": spilled,
        "offset": offset,
        "limit": limit,
        "jobs": jobs,
        "delayed_total": len(mine),
        "delayed": delayed,
    }


def _manager_of(job: Job) -> str:
    peer = job.peer
    return (peer.manager_name if peer is not None else None) or (job.manager or "")


def running(
    core: BrokerCore,
    queue_name: str | None,
    offset: int,
    limit: int,
    bodies: bool,
    now: float,
    manager: str | None = None,
) -> dict[str, Any]:
    """One page of the attempts in flight (of one queue or job manager, or all), in
    dispatch order: the job manager, the worker process (its pid), since when, and
    whether the process runs it already (a process takes several and runs them in
    turn)."""
    limit = min(limit, MAX_PAGE)
    wall_offset = core.wall_offset
    selected: Any = core.inflight.values()
    total = len(core.inflight)
    if queue_name is not None or manager is not None:
        selected = [
            j
            for j in selected
            if (queue_name is None or j.queue == queue_name)
            and (manager is None or _manager_of(j) == manager)
        ]
        total = len(selected)
    jobs = []
    for job in itertools.islice(selected, offset, offset + limit):
        doc = _job(job, wall_offset, now, bodies)
        peer = job.peer
        doc["job_manager"] = _manager_of(job)
        doc["pid"] = peer.meta.get("pid") if peer is not None else None
        doc["dispatched"] = round(job.dispatched_at + wall_offset, 3)
        doc["running_for"] = round(max(now - job.dispatched_at, 0.0), 3)
        doc["started"] = bool(
            peer is not None and next(iter(peer.inflight), None) == job.attempt_id
        )
        jobs.append(doc)
    return {
        "queue": queue_name,
        "job_manager": manager,
        "total": total,
        "offset": offset,
        "limit": limit,
        "jobs": jobs,
    }


def pause(core: BrokerCore, queue_name: str) -> dict[str, Any]:
    """Stop dispatching the queue's jobs; new ones keep coming in and wait."""
    queue = core._queue(queue_name)  # (a queue paused before its first job)
    was = queue.paused
    queue.paused = True
    return {"queue": queue_name, "paused": True, "was_paused": was, "waiting": len(queue.pending)}


def resume(core: BrokerCore, queue_name: str, now: float) -> dict[str, Any]:
    """Dispatch again: the waiting jobs go to the queue's ready workers at once."""
    queue = core.queues.get(queue_name)
    if queue is None:
        return {"queue": queue_name, "paused": False, "was_paused": False, "dispatched": 0}
    was = queue.paused
    queue.paused = False
    sent = 0
    if queue.gated:  # through the flow control's gate (broker/flow.py)
        before = core.counters["dispatched"]
        core._pump(queue, now)
        sent = core.counters["dispatched"] - before
    while queue.pending and not queue.gated:
        peer = queue.pick()
        if peer is None:
            break
        core._dispatch(queue.pop(), queue, peer, now)
        sent += 1
    if queue.spilled:
        core._check_spill(queue)  # (waiting on disk: read some back)
    return {"queue": queue_name, "paused": False, "was_paused": was, "dispatched": sent}


def set_rate(core: BrokerCore, queue_name: str, rate: float | None, now: float) -> dict[str, Any]:
    """The queue's rate limit from now on (jobs per second; None: none), as if
    ``EMQ_RATE_LIMITS`` said it, until the broker restarts (or a failover: the new
    active broker starts from its settings). Waiting jobs it lets go go now."""
    queue = core._queue(queue_name)
    was = core.flow.set_queue_rate(queue_name, rate, now)
    if rate is not None and not queue.gated:
        core._gate(queue)
    before = core.counters["dispatched"]
    if queue.gated and queue.pending and not queue.paused:
        core._pump(queue, now)
    return {
        "queue": queue_name,
        "rate_limit": rate,
        "was": was,
        "waiting": len(queue.pending),
        "dispatched": core.counters["dispatched"] - before,
    }


def paused_queues(core: BrokerCore) -> list[str]:
    return sorted(q.name for q in core.queues.values() if q.paused)
