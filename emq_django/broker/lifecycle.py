"""A job's life in the broker after it is accepted: delays, retries, dead letters,
de-duplication, the journal of guaranteed jobs and spilling to disk.

An object the core owns (``core.life``). It keeps the jobs that are not simply
waiting or running (delayed, dead, spilled, recently finished) and decides what
an ended attempt comes to; it never routes, sends or answers: it returns its
decisions and the jobs to route, and the core acts on them. Pure like the core:
it only queues journal operations in ``journal_ops``, which the server writes in
one transaction per loop turn, before it sends what that turn produced.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from emq_django.broker.effects import Outcome
from emq_django.broker.holding import (
    DeadLetter,
    DeadLetters,
    DelayedJobs,
    RecentIds,
)
from emq_django.broker.journal import (
    JobDone,
    JournalOp,
    KeepReply,
    PruneDone,
    PruneEvents,
    PutJob,
    SaveEvent,
    SetState,
    StoredJob,
)
from emq_django.broker.retry import RETRY_REQUESTED_LIMIT, TIMEOUT_ERROR, RetryPolicy
from emq_django.broker.state import BrokerConfig, Job, show_identity
from emq_django.broker.task_stats import FAILED, RETRIED, SUCCEEDED, TaskStats
from emq_django.logconfig import job_fields
from emq_django.protocol.headers import parse_stored_headers, with_first_attempt
from emq_django.protocol.limits import GUARANTEED_DEATH_RETRIES
from emq_django.protocol.reply_status import reply_span

if TYPE_CHECKING:
    from emq_django.broker.topics import Event
    from emq_django.broker.trace import JobTracer

log = logging.getLogger(__name__)

__all__ = ["RETRY_REQUESTED_LIMIT", "TIMEOUT_ERROR", "JobLifecycle"]


class JobLifecycle:
    def __init__(
        self,
        config: BrokerConfig,
        counters: dict[str, int],
        tracer: JobTracer | None = None,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.counters = counters
        self.tracer = tracer
        # per task and queue, for Prometheus (EMQ_TASK_METRICS)
        self.task_stats = TaskStats() if config.task_metrics else None
        self.wall_offset = 0.0
        self.jobs: dict[bytes, Job] = {}  # every live job: waiting, in flight, delayed, dead
        self.delayed = DelayedJobs()
        self.dead = DeadLetters(config.max_dead_letters)
        self.recent = RecentIds(config.dedupe_window)
        self.spilled_ids: dict[bytes, str] = {}  # on disk only -> queue name
        self.spill_requests: set[str] = set()  # queues to refill from the journal
        self.journal_ops: list[JournalOp] | None = None  # None: no journal
        self.rng = random.Random(seed)

    @property
    def journaled(self) -> bool:
        return self.journal_ops is not None

    def known(self, job_id: bytes) -> bool:
        """Accepted already (live, just finished, or waiting on disk)."""
        return job_id in self.jobs or job_id in self.recent or job_id in self.spilled_ids

    def footprint(self) -> int:
        """The jobs it keeps (live, and spilled ones by id): what its memory grows
        with in a backlog (the recently finished ids are bounded, see RecentIds)."""
        return len(self.jobs) + len(self.spilled_ids)

    def compact(self) -> None:
        """Rebuild its indexes at their present size: a dict never shrinks when its
        entries are deleted (see ``emq_django.broker.memory``)."""
        self.jobs = dict(self.jobs)
        self.spilled_ids = dict(self.spilled_ids)
        self.recent.compact()
        self.dead.compact()

    # ---- accepting ----------------------------------------------------------------

    def keep(self, job: Job, queue_name: str, now: float, spill: bool) -> float:
        """Take a new job: journal it if guaranteed, spill it to disk (``spill``),
        else hold it. Returns when it may run (monotonic; 0 for now): the caller
        routes it when that is not in the future and it was not spilled."""
        guaranteed = job.headers.guarantee and self.journal_ops is not None
        run_at = job.headers.run_after - self.wall_offset if job.headers.run_after else 0.0
        if spill:
            self._journal_put(job, "spilled")
            self.spilled_ids[job.id] = queue_name
            self.counters["spilled"] += 1
            return 0.0
        if guaranteed:
            self._journal_put(job, "delayed" if run_at > now else "ready")
        self.jobs[job.id] = job
        if run_at > now:
            self.delayed.add(job, run_at)
        return run_at

    def forget_unsaved(self, job_id: bytes) -> str | None:
        """The journal could not save a new job: forget it. Returns the queue it was
        spilled to, if it was; the caller takes it out of wherever else it was."""
        spilled_to = self.spilled_ids.pop(job_id, None)
        if spilled_to is None:
            self.jobs.pop(job_id, None)
            self.delayed.remove(job_id)
        return spilled_to

    # ---- settling -----------------------------------------------------------------

    def settle(self, job: Job, outcome: Outcome, now: float) -> bool:
        """A job's attempt is over: done, retried or dead-lettered. Returns whether
        that was its final outcome (its client's answer goes out then)."""
        stats = self.task_stats
        if not outcome.failed:
            self.counters["succeeded"] += 1
            if self.tracer is not None:
                self.tracer.succeeded(job, now)
            if stats is not None:
                stats.attempt(job, SUCCEEDED, now)
            self.forget(job, now)
            return True
        job.failures += 1
        error = outcome.error or "Error"
        if job.cancelled:
            self.end_cancelled(job, now, failed_now=True)
            return True
        decision = RetryPolicy(self.config.retry_base, self.config.retry_cap, self.rng).decide(
            job.failures,
            job.headers.retry_count,
            outcome.retry,
            outcome.lost,
            error,
            self._death_limit(job),
        )
        died, bury = decision.died, decision.bury
        if decision.retry:  # also while stopping: journaled
            if stats is not None:
                stats.attempt(job, RETRIED, now)
            if outcome.raw:  # the failed attempt's span, for its retries' links
                span = reply_span(outcome.raw)
                if span:
                    job.headers = with_first_attempt(job.headers, span)
            self._retry(job, error, decision.delay, now)
            return False
        self.counters["failed"] += 1
        if stats is not None:
            stats.attempt(job, FAILED, now)
        if self.tracer is not None:
            event = "timed_out" if error == TIMEOUT_ERROR else "failed"
            # not final when a dead letter follows: that line ends the job
            self.tracer.event(event, job, now, error, final=not bury, failed_now=True)
        if died:  # a job that keeps killing its worker: the dead letters say how
            short = error.rpartition(".")[2]
            self._bury(job, f"{short}: {outcome.lost}" if outcome.lost else short, now)
        elif bury:
            self._bury(job, error, now)
        else:
            self.forget(job, now)
        return True

    def _death_limit(self, job: Job) -> int:
        """How many deaths of its worker process the job is retried after: its
        retries, and at least ``GUARANTEED_DEATH_RETRIES`` when it is guaranteed."""
        limit = job.headers.retry_count
        if job.headers.guarantee and self.journal_ops is not None:
            limit = max(limit, GUARANTEED_DEATH_RETRIES)
        return limit

    def last_chance(self, job: Job) -> bool:
        """Whether a death of the job's current attempt would end the job: one with
        ``retries=0`` that is not guaranteed (at most once), or its last retry. Such
        an attempt, once it may have started, is never run again."""
        return job.failures >= self._death_limit(job)

    def end_cancelled(self, job: Job, now: float, failed_now: bool = False) -> None:
        self.counters["cancelled"] += 1
        if self.tracer is not None:
            self.tracer.event("cancelled", job, now, final=True, failed_now=failed_now)
        self.forget(job, now)

    def _retry(self, job: Job, error: str, delay: float, now: float) -> None:
        self.counters["retried"] += 1
        job.peer = None
        self.delayed.add(job, now + delay)
        if self.tracer is not None:
            self.tracer.event("retried", job, now, error, extra=delay)
        if job.headers.guarantee and self.journal_ops is not None:
            self.journal_ops.append(
                SetState(
                    "state",
                    job.id,
                    "delayed",
                    job.failures,
                    now + delay + self.wall_offset,
                    error,
                    now + self.wall_offset,
                    job.attempt,
                )
            )

    def _bury(self, job: Job, error: str, now: float) -> None:
        self.counters["dead_lettered"] += 1
        if self.task_stats is not None:
            self.task_stats.dead_lettered(job)
        log.warning(
            "job %s (%s) failed %d times (%s): moved to the dead letters",
            show_identity(job.id),
            job.headers.task or job.queue,
            job.failures,
            error,
            extra=job_fields(job.attempt_id or job.id, job.queue, job.headers.task),
        )
        if self.tracer is not None:
            self.tracer.event("dead_lettered", job, now, error, final=True, failed_now=True)
        evicted = self.dead.add(DeadLetter(job, error, now + self.wall_offset))
        if job.headers.guarantee and self.journal_ops is not None:
            self.journal_ops.append(
                SetState(
                    "state",
                    job.id,
                    "dead",
                    job.failures,
                    0.0,
                    error,
                    now + self.wall_offset,
                    job.attempt,
                )
            )
        if evicted is not None:
            log.warning(
                "dead letters full (%d): dropped the oldest, %s",
                self.dead.limit,
                show_identity(evicted.job.id),
            )
            self.forget(evicted.job, now)

    def forget(self, job: Job, now: float) -> None:
        """The job is over for good: remember its id for de-duplication only."""
        self.jobs.pop(job.id, None)
        self.recent.add(job.id, now)
        if job.headers.guarantee and self.journal_ops is not None:
            if job.headers.unique_for and job.headers.unique:
                # its row stays, as a done one, for its key's unique-for after the end
                # (broker/unique.py ``restore_ended`` reads the key from its headers):
                # a done row with an empty reply (PostgreSQL's plain done deletes it)
                self.journal_ops.append(KeepReply("reply", job.id, b"", now + self.wall_offset))
            else:
                self.journal_ops.append(JobDone("done", job.id, now + self.wall_offset))

    # ---- timers -------------------------------------------------------------------

    def due(self, now: float) -> list[Job]:
        """Delayed jobs (run-after, retry back-off) whose time has come: to route."""
        return self.delayed.pop_due(now)

    def housekeeping(self, now: float) -> None:
        self.recent.expire(now)
        if self.journal_ops is not None:
            self.journal_ops.append(
                PruneDone("prune_done", now + self.wall_offset - self.config.dedupe_window)
            )

    def check_spill(self, queue_name: str, pending: int, pending_bytes: int, spilled: int) -> None:
        """Ask the server to read spilled jobs back once the queue has room."""
        if (
            spilled
            and pending < self.config.max_pending // 2
            and pending_bytes < self.config.max_queue_bytes // 2
        ):
            self.spill_requests.add(queue_name)

    # ---- the journal --------------------------------------------------------------

    def journal_event(self, event: Event, rule: str) -> None:
        """A topic event to save (the topic space's ``OpsSink``)."""
        assert self.journal_ops is not None
        self.journal_ops.append(SaveEvent("event", event, rule))

    def journal_prune_events(self, rules: Any, wall: float, last_seq: int) -> None:
        assert self.journal_ops is not None
        self.journal_ops.append(PruneEvents("prune_events", rules, wall, last_seq))

    def _journal_put(self, job: Job, state: str) -> None:
        assert self.journal_ops is not None
        run_after = job.headers.run_after if state == "delayed" else 0.0
        enqueued_wall = job.enqueued_at + self.wall_offset
        self.journal_ops.append(
            PutJob(
                "put",
                job.id,
                job.queue,
                job.headers.raw,
                job.body,
                state,
                job.failures,
                run_after,
                enqueued_wall,
                enqueued_wall,
            )
        )

    def restore(
        self, stored: list[StoredJob], now: float
    ) -> tuple[dict[str, int], list[Job], dict[str, int]]:
        """Reload the journal at start-up: (counts by state, jobs ready to run,
        spilled jobs per queue)."""
        counts: dict[str, int] = {}
        ready: list[Job] = []
        spilled: dict[str, int] = {}
        wall = now + self.wall_offset
        for row in stored:
            counts[row.state] = counts.get(row.state, 0) + 1
            if row.state == "done":
                if wall - row.updated_at <= self.config.dedupe_window:
                    self.recent.add(row.id, now - (wall - row.updated_at))
                continue
            if row.state == "spilled":
                self.spilled_ids[row.id] = row.queue
                spilled[row.queue] = spilled.get(row.queue, 0) + 1
                continue
            job = self.job_from(row, now)
            self.jobs[job.id] = job
            if row.state == "dead":
                self.dead.add(DeadLetter(job, row.error, row.updated_at))
            elif row.run_after > wall:
                self.delayed.add(job, row.run_after - self.wall_offset)
            else:
                ready.append(job)
        return counts, ready, spilled

    def restore_spilled(self, stored: list[StoredJob], now: float) -> list[Job]:
        """Spilled jobs read back from the journal: the ones still spilled, to route."""
        jobs = []
        for row in stored:
            if self.spilled_ids.pop(row.id, None) is None:
                continue
            job = self.job_from(row, now)
            self.jobs[job.id] = job
            assert self.journal_ops is not None
            self.journal_ops.append(
                SetState(
                    "state",
                    job.id,
                    "ready",
                    job.failures,
                    0.0,
                    "",
                    now + self.wall_offset,
                    job.attempt,
                )
            )
            jobs.append(job)
        return jobs

    def job_from(self, row: StoredJob, now: float) -> Job:
        job = Job(
            row.id,
            row.queue,
            parse_stored_headers(row.headers),
            row.body,
            None,
            now - (now + self.wall_offset - row.enqueued_at),
        )
        job.failures = row.attempts
        # its attempts are numbered after the last one the journal had the outcome
        # of: an outcome a job manager hands over from the previous broker under a
        # number up to that one was had already (``BrokerCore._restored_outcome``),
        # and this broker's own attempts never take such an id. That number is past
        # the count of failures when an attempt was given back unstarted (counted
        # as no failure); a journal that predates it has the count only.
        job.attempt = max(row.attempts, row.last_attempt)
        return job

    # ---- cancelling -----------------------------------------------------------------

    def cancel_spilled(self, job_id: bytes, now: float, keep_row: bool = False) -> str | None:
        """Cancel a job waiting on disk only; returns its queue, None if it is not.
        ``keep_row``: its unique key is kept for a while (``UniqueKeys.end_spilled``):
        its row stays, a done one with no reply, as ``forget`` keeps a unique job's."""
        queue_name = self.spilled_ids.pop(job_id, None)
        if queue_name is None:
            return None
        self.recent.add(job_id, now)
        if self.journal_ops is not None:
            wall = now + self.wall_offset
            self.journal_ops.append(
                KeepReply("reply", job_id, b"", wall) if keep_row else JobDone("done", job_id, wall)
            )
        self.counters["cancelled"] += 1
        return queue_name

    def take_held(self, job_id: bytes) -> bool:
        """Take a delayed job or a dead letter out. True if it was delayed: its caller
        still waits for an answer (a dead letter's caller has had it)."""
        if self.delayed.remove(job_id) is not None:
            return True
        return not self.dead.take([job_id])

    # ---- dead letters ---------------------------------------------------------------

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

    def requeue_dead(self, job_ids: list[bytes] | None, now: float) -> list[Job]:
        """These dead letters (all when None), with their retries reset: to route."""
        jobs = []
        for letter in self.dead.take(job_ids):
            job = letter.job
            job.failures = 0
            job.peer = None
            if job.headers.guarantee and self.journal_ops is not None:
                self.journal_ops.append(
                    SetState(
                        "state", job.id, "ready", 0, 0.0, "", now + self.wall_offset, job.attempt
                    )
                )
            jobs.append(job)
        return jobs

    def purge_dead(self, job_ids: list[bytes] | None, now: float) -> int:
        letters = self.dead.take(job_ids)
        for letter in letters:
            self.forget(letter.job, now)
        return len(letters)

    def unsave_ops(self, job_ids: Iterable[bytes]) -> None:
        """Drop this turn's queued journal operations for jobs that were not saved."""
        ids = set(job_ids)
        if self.journal_ops:
            self.journal_ops = [op for op in self.journal_ops if op[1] not in ids]
