"""A job's life in the broker after it is accepted: delays, retries, dead letters,
de-duplication, the journal of guaranteed jobs and spilling to disk.

A mixin of ``BrokerCore`` (core.py keeps the protocol handlers and the peers).
Pure like the core: it only queues journal operations in ``self.journal_ops``;
the server writes them in one transaction per loop turn, before it sends the
messages queued in the same turn.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from emq_django.broker.holding import (
    DeadLetter,
    DeadLetters,
    DelayedJobs,
    RecentIds,
    backoff,
)
from emq_django.broker.journal import JournalOp, StoredJob
from emq_django.broker.state import Job, Queue
from emq_django.protocol import frames as F
from emq_django.protocol.headers import parse_headers

if TYPE_CHECKING:
    from emq_django.broker.core import BrokerConfig

log = logging.getLogger(__name__)

RETRY_REQUESTED_LIMIT = 3  # emq.Retry on a task declared with no retries


class JobLifecycle:
    # provided by BrokerCore
    config: BrokerConfig
    queues: dict[str, Queue]
    counters: dict[str, int]
    wall_offset: float
    stopping: bool
    trace: list[str] | None
    out: list[tuple[int, bytes, list[bytes]]]

    def _init_lifecycle(self, seed: int | None = None) -> None:
        self.jobs: dict[bytes, Job] = {}  # every live job: waiting, in flight, delayed, dead
        self.delayed = DelayedJobs()
        self.dead = DeadLetters(self.config.max_dead_letters)
        self.recent = RecentIds(self.config.dedupe_window)
        self.spilled_ids: dict[bytes, str] = {}  # on disk only -> queue name
        self.spill_requests: set[str] = set()  # queues to refill from the journal
        self.journal_ops: list[JournalOp] | None = None  # None: no journal
        self.rng = random.Random(seed)

    # ---- accepting ----------------------------------------------------------

    def _accept(self, identity: bytes, cmd: F.Request, queue: Queue, now: float) -> None:
        """Take a new REQUEST: de-duplicate, journal, delay or spill, then route."""
        if cmd.msgid in self.jobs or cmd.msgid in self.recent or cmd.msgid in self.spilled_ids:
            self.counters["duplicates"] += 1
            self._ack(0, identity, cmd.msgid)  # ACK again: the client did not get the first
            return
        headers = cmd.headers
        guaranteed = headers.guarantee and self.journal_ops is not None
        over = self._over_bound(queue)
        if over and not guaranteed and not headers.run_after:
            self._refuse_full(identity, cmd, queue)
            return
        client = identity if headers.reply_requested else None
        job = Job(cmd.msgid, cmd.queue, headers, cmd.body, client, now)
        job.enqueued_wall = now + self.wall_offset
        if self.trace is not None:
            self._trace_enqueued(job, now)
        run_at = headers.run_after - self.wall_offset if headers.run_after else 0.0
        if guaranteed and (over or queue.spilled) and run_at <= now:
            self._spill(job, queue)
        else:
            if guaranteed:
                self._journal_put(job, "delayed" if run_at > now else "ready")
            self.jobs[job.id] = job
            if run_at > now:
                self.delayed.add(job, run_at)
            else:
                self._route(job, queue, now)
        self._ack(0, identity, cmd.msgid)

    def _over_bound(self, queue: Queue) -> bool:
        return (
            len(queue.pending) >= self.config.max_pending
            or queue.pending_bytes >= self.config.max_queue_bytes
        )

    def _refuse_full(self, identity: bytes, cmd: F.Request, queue: Queue) -> None:
        self._refuse(
            identity,
            cmd.msgid,
            "queue-full",
            f"queue {cmd.queue!r} is full ({len(queue.pending)} jobs, "
            f"{queue.pending_bytes} bytes waiting; none of {len(queue.servers)} job managers "
            "has a free slot); send it again later, or as guaranteed to wait on disk",
        )

    def _route(self, job: Job, queue: Queue, now: float) -> None:
        """Dispatch ``job`` to the best ready job manager, or let it wait."""
        target = None if queue.pending or self.stopping else queue.pick()
        if target is not None:
            self._dispatch(job, queue, self.peers[target], now)
        else:
            queue.push(job)

    def _spill(self, job: Job, queue: Queue) -> None:
        """Over the memory bound: a guaranteed job waits in the journal only."""
        self._journal_put(job, "spilled")
        self.spilled_ids[job.id] = queue.name
        queue.spilled += 1
        self.counters["spilled"] += 1

    # ---- settling -----------------------------------------------------------

    def _settle(self, job: Job, failed: bool, status: bytes, now: float) -> bool:
        """A job's attempt is over: done, or retried, or dead-lettered. Returns
        whether that was its final outcome (the client's REPLY goes out then)."""
        if not failed:
            self.counters["succeeded"] += 1
            if self.trace is not None:
                self._trace_succeeded(job, now)
            self._forget(job, now)
            return True
        job.failures += 1
        error = F.reply_error(status) or "Error"
        asked = F.reply_retry(status)
        lost = F.reply_lost(status)
        died = lost is not None and error != "TimeoutError"  # a time-out is a failure
        limit = job.headers.retry_count
        if asked is not None and not limit:
            limit = RETRY_REQUESTED_LIMIT
        if died and job.headers.guarantee and self.journal_ops is not None:
            limit = max(limit, F.GUARANTEED_DEATH_RETRIES)
        if job.cancelled:
            self._end_cancelled(job, now)
            return True
        if job.failures <= limit:  # also while stopping: journaled
            if asked is not None and asked >= 0:
                delay = asked
            else:
                delay = backoff(
                    job.failures, self.config.retry_base, self.config.retry_cap, self.rng
                )
            self._retry(job, error, delay, now)
            return False
        self.counters["failed"] += 1
        if self.trace is not None:
            self._trace("timed_out" if error == "TimeoutError" else "failed", job, now, error)
        if died:  # a job that keeps killing its worker: the dead letters say how
            short = error.rpartition(".")[2]
            self._bury(job, f"{short}: {lost}" if lost else short, now)
        elif job.headers.retry_count or asked is not None:
            self._bury(job, error, now)
        else:
            self._forget(job, now)
        return True

    def _end_cancelled(self, job: Job, now: float) -> None:
        self.counters["cancelled"] += 1
        if self.trace is not None:
            self._trace("cancelled", job, now)
        self._forget(job, now)

    def _retry(self, job: Job, error: str, delay: float, now: float) -> None:
        self.counters["retried"] += 1
        job.peer = None
        self.delayed.add(job, now + delay)
        if self.trace is not None:
            self._trace("retried", job, now, error, extra=delay)
        if job.headers.guarantee and self.journal_ops is not None:
            self.journal_ops.append(
                (
                    "state",
                    job.id,
                    "delayed",
                    job.failures,
                    now + delay + self.wall_offset,
                    error,
                    now + self.wall_offset,
                )
            )

    def _bury(self, job: Job, error: str, now: float) -> None:
        self.counters["dead_lettered"] += 1
        log.warning(
            "job %s (%s) failed %d times (%s): moved to the dead letters",
            job.id.decode(errors="replace"),
            job.headers.task or job.queue,
            job.failures,
            error,
        )
        if self.trace is not None:
            self._trace("dead_lettered", job, now, error)
        evicted = self.dead.add(DeadLetter(job, error, now + self.wall_offset))
        if job.headers.guarantee and self.journal_ops is not None:
            self.journal_ops.append(
                ("state", job.id, "dead", job.failures, 0.0, error, now + self.wall_offset)
            )
        if evicted is not None:
            log.warning(
                "dead letters full (%d): dropped the oldest, %s",
                self.dead.limit,
                evicted.job.id.decode(errors="replace"),
            )
            self._forget(evicted.job, now)

    def _forget(self, job: Job, now: float) -> None:
        """The job is over for good: remember its id for de-duplication only."""
        self.jobs.pop(job.id, None)
        self.recent.add(job.id, now)
        if job.headers.guarantee and self.journal_ops is not None:
            self.journal_ops.append(("done", job.id, now + self.wall_offset))

    # ---- timers -------------------------------------------------------------

    def _release_due(self, now: float) -> None:
        for job in self.delayed.pop_due(now):
            queue = self.queues.get(job.queue) or self.queues.setdefault(
                job.queue, Queue(job.queue)
            )
            self._route(job, queue, now)

    def _housekeeping(self, now: float) -> None:
        self.recent.expire(now)
        if self.journal_ops is not None:
            self.journal_ops.append(
                ("prune_done", now + self.wall_offset - self.config.dedupe_window)
            )

    def _check_spill(self, queue: Queue) -> None:
        if (
            queue.spilled
            and len(queue.pending) < self.config.max_pending // 2
            and queue.pending_bytes < self.config.max_queue_bytes // 2
        ):
            self.spill_requests.add(queue.name)

    # ---- the journal --------------------------------------------------------

    def _journal_put(self, job: Job, state: str) -> None:
        assert self.journal_ops is not None
        run_after = job.headers.run_after if state == "delayed" else 0.0
        self.journal_ops.append(
            (
                "put",
                job.id,
                job.queue,
                job.headers.raw,
                job.body,
                state,
                job.failures,
                run_after,
                job.enqueued_wall,
                job.enqueued_wall,
            )
        )

    def restore(self, stored: list[StoredJob], now: float) -> dict[str, int]:
        """Reload the journal at start-up. Returns counts by state."""
        counts: dict[str, int] = {}
        wall = now + self.wall_offset
        for row in stored:
            counts[row.state] = counts.get(row.state, 0) + 1
            if row.state == "done":
                if wall - row.updated_at <= self.config.dedupe_window:
                    self.recent.add(row.id, now - (wall - row.updated_at))
                continue
            queue = self.queues.get(row.queue) or self.queues.setdefault(
                row.queue, Queue(row.queue)
            )
            if row.state == "spilled":
                self.spilled_ids[row.id] = row.queue
                queue.spilled += 1
                continue
            job = self._job_from(row, now)
            self.jobs[job.id] = job
            if row.state == "dead":
                self.dead.add(DeadLetter(job, row.error, row.updated_at))
            elif row.run_after > wall:
                self.delayed.add(job, row.run_after - self.wall_offset)
            else:
                queue.push(job)
        for queue in self.queues.values():
            self._check_spill(queue)
        return counts

    def restore_spilled(self, queue_name: str, stored: list[StoredJob], now: float) -> None:
        queue = self.queues[queue_name]
        for row in stored:
            if self.spilled_ids.pop(row.id, None) is None:
                continue
            queue.spilled -= 1
            job = self._job_from(row, now)
            self.jobs[job.id] = job
            assert self.journal_ops is not None
            self.journal_ops.append(
                ("state", job.id, "ready", job.failures, 0.0, "", now + self.wall_offset)
            )
            self._route(job, queue, now)
        self._check_spill(queue)  # more on disk, and nothing waiting in memory: go on

    def unsave(self, job_ids: set[bytes], now: float) -> None:
        """The journal could not save these new jobs: forget them entirely, as if
        never received (their clients get an ERROR instead of an ACK)."""
        for job_id in job_ids:
            spilled_to = self.spilled_ids.pop(job_id, None)
            if spilled_to is not None:
                self.queues[spilled_to].spilled -= 1
                continue
            job = self.jobs.pop(job_id, None)
            if job is None:
                continue
            queue = self.queues[job.queue]
            if job.attempt_id in self.inflight:  # dispatched in this very turn: take it back
                del self.inflight[job.attempt_id]
                queue.in_flight -= 1
                peer = self.peers.get(job.peer or b"")
                if peer is not None:
                    peer.inflight.pop(job.attempt_id, None)
                    self._credit(peer, now)
            elif job in queue.pending:
                queue.pending.remove(job)
                queue.pending_bytes -= len(job.body)
            else:
                self.delayed.remove(job_id)

    def _job_from(self, row: StoredJob, now: float) -> Job:
        job = Job(
            row.id,
            row.queue,
            parse_headers(row.headers),
            row.body,
            None,
            now - (now + self.wall_offset - row.enqueued_at),
        )
        job.failures = row.attempts
        job.enqueued_wall = row.enqueued_at
        return job

    # ---- cancelling (the monitor's CANCEL command) ---------------------------

    def cancel(self, job_id: bytes, now: float) -> str:
        """Cancel a job. One that has not started (waiting, delayed, dead): gone,
        ``cancelled``. One running on our job manager: its worker process is killed
        (the KILL command) and the job ends as cancelled, ``stopping``. One running
        on an EventMQ job manager cannot be stopped but will not be retried:
        ``running``. Else ``unknown``."""
        spilled_to = self.spilled_ids.pop(job_id, None)
        if spilled_to is not None:
            self.queues[spilled_to].spilled -= 1
            self.recent.add(job_id, now)
            if self.journal_ops is not None:
                self.journal_ops.append(("done", job_id, now + self.wall_offset))
            self.counters["cancelled"] += 1
            return "cancelled"
        job = self.jobs.get(job_id)
        if job is None:
            return "unknown"
        if job.attempt_id in self.inflight and job.peer is not None:
            job.cancelled = True
            return "stopping" if self._kill_attempt(job) else "running"
        queue = self.queues[job.queue]
        waiting = True
        if job in queue.pending:
            queue.pending.remove(job)
            queue.pending_bytes -= len(job.body)
        elif self.delayed.remove(job_id) is None:
            waiting = not self.dead.take([job_id])  # a dead letter's caller has its answer
        job.cancelled = True
        self._end_cancelled(job, now)
        if waiting:
            self._answer_client(job, b"", b"failed", True)  # its get() raises Cancelled
        return "cancelled"

    # ---- dead letters (the monitor's commands) ------------------------------

    def dead_letters(self, limit: int = 1000) -> list[dict[str, Any]]:
        return [
            {
                "id": letter.job.id.decode("utf-8", "replace"),
                "queue": letter.job.queue,
                "task": letter.job.headers.task or None,
                "attempts": letter.job.failures,
                "error": letter.error,
                "died_at": round(letter.died_at, 3),
                "guaranteed": letter.job.headers.guarantee,
            }
            for letter in list(self.dead.items.values())[:limit]
        ]

    def requeue_dead(self, job_ids: list[bytes] | None, now: float) -> int:
        """Run these dead letters again (all when None), with their retries reset."""
        letters = self.dead.take(job_ids)
        for letter in letters:
            job = letter.job
            job.failures = 0
            job.peer = None
            queue = self.queues.get(job.queue) or self.queues.setdefault(
                job.queue, Queue(job.queue)
            )
            if job.headers.guarantee and self.journal_ops is not None:
                self.journal_ops.append(
                    ("state", job.id, "ready", 0, 0.0, "", now + self.wall_offset)
                )
            self._route(job, queue, now)
        return len(letters)

    def purge_dead(self, job_ids: list[bytes] | None, now: float) -> int:
        letters = self.dead.take(job_ids)
        for letter in letters:
            self._forget(letter.job, now)
        return len(letters)

    if TYPE_CHECKING:  # provided by BrokerCore
        peers: dict[bytes, Any]
        inflight: dict[bytes, Job]

        def _credit(self, peer: Any, now: float) -> None: ...

        def _ack(self, socket: int, identity: bytes, msgid: bytes) -> None: ...
        def _refuse(self, identity: bytes, msgid: bytes, code: str, reason: str) -> None: ...
        def _dispatch(
            self, job: Job, queue: Queue, peer: Any, now: float, returning: bool = False
        ) -> None: ...
        def _trace(
            self,
            event: str,
            job: Job,
            now: float,
            error: str = "",
            peer: Any = None,
            extra: float = 0.0,
        ) -> None: ...
        def _trace_enqueued(self, job: Job, now: float) -> None: ...
        def _kill_attempt(self, job: Job) -> bool: ...
        def _answer_client(self, job: Job, body: bytes, status: bytes, failed: bool) -> None: ...
        def _trace_succeeded(self, job: Job, now: float) -> None: ...
