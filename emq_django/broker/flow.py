"""Flow control at the broker: global rate limits and per-key concurrency
(docs/features/flow-control.md). The broker holds jobs back at dispatch; no job
fails or is retried because of a limit.

A queue is *gated* once a job with a flow header (``rate-limit``,
``max-concurrency``) waited in it, or from its start when ``EMQ_RATE_LIMITS``
names it; a queue that is not gated never reaches this module (one attribute
read per job in ``BrokerCore._accept``), so the features cost nothing unused.

- **Rate limits**: a token bucket per task (the ``task`` header; without one,
  per queue) and per queue named in ``EMQ_RATE_LIMITS``, of capacity ``BURST``:
  a job of a task (queue) limited to *r* per second is dispatched only with a
  token, and the bucket gains *r* tokens a second up to ``BURST``. So in any
  *T* seconds at most ``BURST + r * T`` of them are dispatched.
- **Concurrency**: at most ``max-concurrency`` attempts of a task (per
  ``concurrency-key`` when the job has one) are in flight at once, counted over
  every job manager (an attempt counts from its dispatch to its end: held by a
  worker process, running, or held under its job manager after the process
  died).

Dispatch takes the first job of the queue, in its order (priority, then FIFO),
that no limit holds back: a job blocked by its key or its task's rate does not
hold up jobs of other keys or tasks behind it; a queue's own rate holds up the
whole queue. Gated queues do not prefetch (as ranked ones: ``state.holds_jobs``),
so that a job's dispatch is its start.

Pure: no sockets, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from emq_django.broker.priority import RankedPending

if TYPE_CHECKING:
    from emq_django.broker.state import Job, Queue

# tokens a bucket holds at most: jobs of a rate-limited task (queue) that may be
# dispatched at once after a quiet spell; 1: evenly spaced, 1/r seconds apart
BURST = 1.0
_EPSILON = 1e-9  # tokens: float rounding must not make a token "almost there"
NEVER = float("inf")
THROTTLED = "rate"  # held back by a rate limit (its task's or its queue's)
BLOCKED = "key"  # held back by its concurrency key (or its task's max_concurrency)


class TokenBucket:
    """``rate`` tokens a second, at most ``burst``; full when made."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, now: float, burst: float = BURST) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a bucket needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at = now

    def _fill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def ready(self, now: float) -> bool:
        """A token is there now."""
        self._fill(now)
        return self.tokens >= 1.0 - _EPSILON

    def take(self, now: float) -> None:
        """Use a token (``ready`` said there is one)."""
        self._fill(now)
        self.tokens -= 1.0

    def next_token(self, now: float) -> float:
        """When the next token is there (``now`` if it is)."""
        self._fill(now)
        missing = 1.0 - _EPSILON - self.tokens
        return now if missing <= 0 else now + missing / self.rate

    def set_rate(self, rate: float, now: float) -> None:
        """A new rate from now on (the tokens earned so far are kept)."""
        self._fill(now)
        self.rate = rate


def concurrency_key(job: Job) -> str:
    """What a job's ``max-concurrency`` counts over: its task, and its key."""
    headers = job.headers
    return f"{headers.task or job.queue}\x00{headers.concurrency_key}"


def rate_key(job: Job) -> str:
    """Whose token bucket a job with a ``rate-limit`` draws on: its task's (its
    queue's, for a job that names no task)."""
    return job.headers.task or f"\x00{job.queue}"


class FlowControl:
    """The buckets and the attempts in flight per concurrency key. ``queue_rates``:
    ``EMQ_RATE_LIMITS``, jobs per second by queue name."""

    __slots__ = (
        "queue_rates",
        "buckets",
        "queue_buckets",
        "running",
        "wake",
        "changes",
        "stuck",
        "_scan_wake",
    )

    def __init__(self, queue_rates: Iterable[tuple[str, float]] = ()) -> None:
        self.queue_rates = dict(queue_rates)
        self.buckets: dict[str, TokenBucket] = {}  # by rate_key
        self.queue_buckets: dict[str, TokenBucket] = {}  # by queue name
        # concurrency key -> job id -> job, for the jobs dispatched under it; one
        # counts while its attempt is in flight (``_count``: pruned when asked)
        self.running: dict[str, dict[bytes, Job]] = {}
        self.wake = NEVER  # the soonest a throttled job may go: the core's timer
        # bumped when a key may have come free (``released``); a queue found with no
        # job that may go is ``stuck`` (the count then, and when its first token
        # comes): until either moves, only a job pushed since needs a look
        self.changes = 0
        self.stuck: dict[str, tuple[int, float, list[Job]]] = {}
        self._scan_wake = NEVER

    # ---- the gate ---------------------------------------------------------------------

    def released(self) -> None:
        """An attempt of a job with ``max-concurrency`` ended: its key may be free."""
        self.changes += 1

    def pushed(self, queue_name: str, job: Job) -> None:
        """``job`` waits in the gated queue now (pushed, or given back)."""
        stuck = self.stuck.get(queue_name)
        if stuck is not None:
            stuck[2].append(job)

    def take(
        self, queue: Queue, now: float, inflight: dict[bytes, Job], force: bool = False
    ) -> Job | None:
        """The first job of ``queue`` (which has waiting jobs) that no limit holds
        back, out of the queue and counted against its limits; None if all wait
        (``wake`` says when a token comes). ``force``: look at every job whatever
        ``stuck`` says (the core's safety net, for a key freed where nobody called
        ``released``).

        A look at every job is O(waiting jobs) (jobs with the same headers object,
        as ``parse_headers`` caches them, are looked at once per look); it is made
        only when a key may have come free or a token came."""
        bucket = self._queue_bucket(queue.name, now)
        if bucket is not None and not bucket.ready(now):
            self.wake = min(self.wake, bucket.next_token(now))
            return None
        pending = queue.pending
        stuck = self.stuck.get(queue.name)
        job: Job | None = None
        if stuck is not None and not force and stuck[0] == self.changes and now < stuck[1]:
            # nothing that waited before may go yet: only the jobs pushed since may
            fresh = stuck[2]
            self._scan_wake = stuck[1]
            while fresh and job is None:
                candidate = fresh.pop(0)
                if self.why_waiting(candidate, now, inflight) is None:
                    job = candidate
            if self._scan_wake < stuck[1]:  # a throttled one's token comes sooner
                self.stuck[queue.name] = (stuck[0], self._scan_wake, fresh)
            if job is None:
                return None
            if job is not pending[0] and job not in pending:
                return self.take(queue, now, inflight, force=True)  # gone (cancelled)
        else:
            self.stuck.pop(queue.name, None)
            self._scan_wake = NEVER
            blocked: set[int] = set()  # id() of the headers found held back
            for waiting in _in_order(pending, 0):
                if id(waiting.headers) in blocked:
                    continue
                if self.why_waiting(waiting, now, inflight) is None:
                    job = waiting
                    break
                blocked.add(id(waiting.headers))
            if job is None:
                self.stuck[queue.name] = (self.changes, self._scan_wake, [])
                return None
        if job is pending[0]:
            queue.pop()
        else:
            pending.remove(job)
            queue.pending_bytes -= len(job.body)
        if bucket is not None:
            bucket.take(now)
        headers = job.headers
        if headers.rate_limit:
            self.buckets[rate_key(job)].take(now)
        if headers.max_concurrency:
            self.running.setdefault(concurrency_key(job), {})[job.id] = job
        return job

    def why_waiting(self, job: Job, now: float, inflight: dict[bytes, Job]) -> str | None:
        """``BLOCKED``, ``THROTTLED`` (for its task's rate), or None: it may go now
        (as far as the job's own limits say; the queue's rate is ``take``'s)."""
        headers = job.headers
        if headers.max_concurrency:
            key = concurrency_key(job)
            running = self.running.get(key)
            if running:
                if _count(running, inflight) >= headers.max_concurrency:
                    return BLOCKED
                if not running:
                    del self.running[key]
        if headers.rate_limit:
            rkey = rate_key(job)
            bucket = self.buckets.get(rkey)
            if bucket is None:
                bucket = self.buckets[rkey] = TokenBucket(headers.rate_limit, now)
            elif bucket.rate != headers.rate_limit:
                bucket.set_rate(headers.rate_limit, now)  # the latest sender's rate
            if not bucket.ready(now):
                token = bucket.next_token(now)
                self.wake = min(self.wake, token)
                self._scan_wake = min(self._scan_wake, token)
                return THROTTLED
        return None

    def _queue_bucket(self, name: str, now: float) -> TokenBucket | None:
        rate = self.queue_rates.get(name)
        if rate is None:
            return None
        bucket = self.queue_buckets.get(name)
        if bucket is None:
            bucket = self.queue_buckets[name] = TokenBucket(rate, now)
        return bucket

    def set_queue_rate(self, name: str, rate: float | None, now: float) -> float | None:
        """Queue ``name``'s rate from now on, jobs per second (None: no limit), as
        ``EMQ_RATE_LIMITS`` would set it, until the broker restarts; returns the rate
        before. A bucket keeps the tokens it earned."""
        was = self.queue_rates.get(name)
        if rate is None:
            self.queue_rates.pop(name, None)
            self.queue_buckets.pop(name, None)
        else:
            self.queue_rates[name] = rate
            bucket = self.queue_buckets.get(name)
            if bucket is not None:
                bucket.set_rate(rate, now)
        self.changes += 1  # what waited may go sooner (or later): look again
        return was

    # ---- the monitor ------------------------------------------------------------------

    def waiting(self, queue: Queue, now: float, inflight: dict[bytes, Job]) -> dict[str, int]:
        """The queue's waiting jobs that a limit holds back now: ``throttled`` (a
        rate: every one, while the queue's own bucket is empty) and ``blocked``
        (a concurrency key). O(waiting jobs): for the monitor only."""
        bucket = self._queue_bucket(queue.name, now)
        if bucket is not None and queue.pending and not bucket.ready(now):
            return {"throttled": len(queue.pending), "blocked": 0}
        counts = {THROTTLED: 0, BLOCKED: 0}
        for job in queue.pending:
            if job.headers.flow:
                why = self.why_waiting(job, now, inflight)
                if why is not None:
                    counts[why] += 1
        return {"throttled": counts[THROTTLED], "blocked": counts[BLOCKED]}

    def sweep(self, inflight: dict[bytes, Job]) -> None:
        """Forget the keys with nothing in flight (the core's housekeeping): a key
        that is never asked about again must not keep its last jobs."""
        for key in [k for k, running in self.running.items() if not _count(running, inflight)]:
            del self.running[key]


def _count(running: dict[bytes, Job], inflight: dict[bytes, Job]) -> int:
    """The jobs of ``running`` whose attempt is in flight; the others are dropped
    (their attempt ended: done, failed, given back, lost)."""
    ended = [j for j, job in running.items() if inflight.get(job.attempt_id) is not job]
    for job_id in ended:
        del running[job_id]
    return len(running)


def _in_order(pending: deque[Job] | RankedPending[Job], start: int) -> Iterator[Job]:
    """The waiting jobs from the ``start``-th on, in dispatch order."""
    if isinstance(pending, RankedPending):
        return iter(pending.page(start, len(pending)))
    return islice(pending, start, None)
