"""The broker as a pure, protocol-neutral state machine.

Ports (``broker/ports/``) decode their wire and call the command methods here
(``client_request``, ``worker_join``, ``worker_result``, ...) with typed values
and ``now`` (monotonic seconds); the core appends typed effects
(``broker/effects.py``) to ``self.out``, which the ports encode for their wire.
No sockets, no clock, no Django and no protocol's bytes: unit-testable and
fuzzable on its own. The job lifecycle (retries, dead letters, the journal) is
an object it owns, ``self.life``.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any
from uuid import uuid4

from emq_django.broker import manager_control
from emq_django.broker.effects import (
    Acknowledge,
    Answer,
    Beat,
    ClientRef,
    Deliver,
    Effect,
    Forget,
    Forward,
    Goodbye,
    Kill,
    Outcome,
    Published,
    Refuse,
)
from emq_django.broker.flow import FlowControl
from emq_django.broker.journal import JobDone, KeepReply
from emq_django.broker.kept_replies import decode_reply, encode_reply
from emq_django.broker.lifecycle import JobLifecycle
from emq_django.broker.spans import DispatchSpans
from emq_django.broker.state import (
    ROLE_MANAGER,
    ROLE_PLAIN,
    ROLE_SLOT,
    BrokerConfig,
    HeldSlot,
    Job,
    Peer,
    Queue,
    held_worst,
    holder_of_lower,
    holds_jobs,
    show_identity,
)
from emq_django.broker.topics import Event, TopicSpace, check_topic
from emq_django.broker.trace import JobTracer
from emq_django.broker.unique import UniqueKeys
from emq_django.broker.workflows import WAITING, WorkflowEngine
from emq_django.exceptions import ProtocolError
from emq_django.logconfig import job_fields
from emq_django.protocol.body import encode_failure
from emq_django.protocol.headers import Headers, parse_stored_headers
from emq_django.protocol.limits import (
    DUPLICATE,
    DUPLICATE_OF,
    MAX_DELAY,
    REFUSAL_CODES,
    REFUSED_BAD_HEADER,
    REFUSED_BAD_RUN_AFTER,
    REFUSED_BODY_TOO_BIG,
    refusal_counter,
)
from emq_django.protocol.reply_status import status_frame
from emq_django.protocol.workflow import WORKFLOW_QUEUE, check_workflow_id, parse_workflow

log = logging.getLogger(__name__)

MAX_QUEUES = 10_000
TOPIC_PRUNE_INTERVAL = 5.0  # seconds between applications of the retention rules
MAX_HELD_SCHEDULES = 10_000
# the final outcomes of restored jobs whose client had not said it waits (it sends
# the job again to say so: ``_claim``), kept for it at most this many
MAX_UNCLAIMED = 10_000
WORKER_LOST = "emq_django.exceptions.WorkerLost"
CANCELLED = "emq_django.exceptions.Cancelled"
CANCELLED_OUTCOME = Outcome(failed=True, error=CANCELLED)
CANCELLED_UNSTARTED = encode_failure(CANCELLED, "the job was cancelled before it started", "")
# a lease (a peer's time to answer a delivery) ran out: the attempt failed, and the
# job goes out again at once; the peer's credit comes back
LEASE_EXPIRED = Outcome(failed=True, ready=True, error="TimeoutError", retry=0.0)
TIMEOUT_ERROR = "TimeoutError"
# an attempt the broker ended past its time limit: a time-out (retried as its job
# says); its peer's credit does not come back (its worker may be dead or stuck)
TIMED_OUT = Outcome(failed=True, error=TIMEOUT_ERROR)
EXPIRED = Outcome(failed=True, error="Expired")

COUNTERS = (
    "received",
    "acked",
    "dispatched",
    "succeeded",
    "failed",
    "refused",
    "requeued",
    "protocol_errors",
    "stale_replies",
    # answers our job manager sent again for a worker process that died, which the
    # broker had already (or had stopped waiting for): dropped
    "stale_resends",
    "unknown_peer",
    "peers_expired",
    "unroutable",
    "published",
    "schedules_forwarded",
    "duplicates",
    "retried",
    "dead_lettered",
    "spilled",
    "cancelled",
    "worker_lost",
    "partials",  # partial results from workers for attempts in flight
    "partials_forwarded",  # ... sent on to their client (one that asked for them)
    "stale_partials",  # partial results for no attempt in flight at that peer: dropped
    "dropped_malformed",  # too broken to answer: no msgid, or a command nobody awaits
    "lease_expired",  # deliveries to a leasing peer (PZQ) not answered in time
    "expired",  # jobs older than their queue's max_age when their turn came: dropped
    # attempts the broker ended itself, over their time limit and its grace with no
    # answer (an EventMQ job manager whose worker process died or hangs)
    "time_limits",
    "events_published",  # events numbered and kept in the topic space
    "events_refused",  # events refused: a bad topic
    # outcomes of attempts a previous broker dispatched (a failover, a restart) for
    # jobs restored from the journal: each completes its job once
    "restored_outcomes",
    # a ranked queue's jobs sent beyond its credit to a worker process of ours that
    # held a lower-ranked job unstarted (BrokerCore._overtake)
    "overtakes",
    *(refusal_counter(code) for code in REFUSAL_CODES),  # refused, by the ERROR's code
)


class BrokerCore:
    def __init__(
        self,
        config: BrokerConfig,
        now: float,
        seed: int | None = None,
        trace: bool = False,
        topics: TopicSpace | None = None,
    ) -> None:
        self.config = config
        self.queues: dict[str, Queue] = {}
        self.peers: dict[Peer, None] = {}  # workers of every port, in join order
        self.schedulers: dict[Peer, None] = {}
        self.managers: dict[str, Peer] = {}  # our job managers: name -> control peer
        self.drained_managers: set[str] = set()  # the admin's drain (manager_control.py)
        self.inflight: dict[bytes, Job] = {}  # attempt id -> job
        # (deadline, attempt id) of deliveries to peers with a lease, soonest first
        self.leases: list[tuple[float, bytes]] = []
        # the attempts of our worker processes that are gone, held under their job
        # manager until it says which ran (or until the group's deadline): attempt
        # id -> its group, and the groups by the process they were in flight at
        self.held: dict[bytes, HeldSlot] = {}
        self.held_slots: dict[Peer, HeldSlot] = {}
        self.done_by_manager: dict[str, int] = {}  # Peer.manager -> attempts finished
        self.failed_by_manager: dict[str, int] = {}  # of those, the failed ones
        self.held_schedules: list[Any] = []  # schedule payloads waiting for a scheduler
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.out: list[Effect] = []
        self.tracer = JobTracer() if trace else None
        # the broker's OpenTelemetry spans (EMQ_OTEL_BROKER_SPANS; the server sets it)
        self.spans: DispatchSpans | None = None
        self.life = JobLifecycle(config, self.counters, self.tracer, seed)
        self.started_at = now
        # this run of the broker: a client that finds another after connecting again
        # knows the plain jobs it had are lost (frames.INCARNATION)
        self.incarnation = uuid4().hex.encode()
        self._wall_offset = 0.0
        self.next_heartbeat = now + config.heartbeat_interval
        self.next_expiry_check = now + config.heartbeat_interval / 4
        self.next_housekeeping = now + 60.0
        self.topics = topics if topics is not None else TopicSpace()
        # retention runs every few seconds once there are events (an idle broker
        # that nobody publishes on does not wake for it)
        self.next_topic_prune = float("inf")
        self.stopping = False
        # jobs restored from the journal at start-up (a failover, a restart), not
        # finished yet: their client is unknown until it sends the job again, and
        # an outcome of an attempt the previous broker dispatched completes them;
        # each with the number of the last attempt the journal had the outcome of
        # (an outcome handed over under a number up to it was had: ``_restored_outcome``)
        self.restored: dict[bytes, int] = {}
        # job id -> (job, body, outcome, more): restored jobs' final outcomes that no
        # client has claimed yet (oldest first, MAX_UNCLAIMED)
        self.unclaimed: dict[bytes, tuple[Job, bytes, Outcome, tuple[bytes, ...]]] = {}
        # chain, group, chord: started here, moved on in _answer (broker/workflows.py)
        self.workflows = WorkflowEngine(
            self._start_step, self.cancel, self._emit, self._end_workflow
        )
        self.unique = UniqueKeys()  # unique jobs' keys (broker/unique.py)
        # rate limits and per-key concurrency (broker/flow.py), and the queues gated
        self.flow = FlowControl(config.rate_limits)
        self.gated: dict[str, Queue] = {}

    @property
    def wall_offset(self) -> float:
        """Wall clock minus ``now``: for heartbeats, the journal and the trace."""
        return self._wall_offset

    @wall_offset.setter
    def wall_offset(self, value: float) -> None:
        self._wall_offset = self.life.wall_offset = value
        if self.tracer is not None:
            self.tracer.wall_offset = value

    # ---- timers and shutdown -------------------------------------------------------

    def on_timer(self, now: float) -> None:
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.config.heartbeat_interval
            self._send_heartbeats(now)
            if self.inflight:
                self._enforce_time_limits(now)
        if now >= self.next_expiry_check:
            # a quarter interval: a dead peer is noticed within liveness + 1/4 intervals
            self.next_expiry_check = now + self.config.heartbeat_interval / 4
            self._expire_peers(now)
            if self.held_slots:
                self._expire_held(now)
            if self.gated:  # a safety net: a key freed by an attempt that was lost
                self._pump_gated(now, force=True)
        if now >= self.flow.wake:  # a token is due for a throttled job
            self._pump_gated(now)
        if now >= self.life.delayed.next_due():
            for job in self.life.due(now):
                self._route(job, self._queue(job.queue), now)
        if self.leases and now >= self.leases[0][0]:
            self._expire_leases(now)
        if now >= self.next_housekeeping:
            self.next_housekeeping = now + 60.0
            self.life.housekeeping(now)
            if self.flow.running:
                self.flow.sweep(self.inflight)
        if now >= self.next_topic_prune:
            self.next_topic_prune = now + TOPIC_PRUNE_INTERVAL
            self.topics.prune(now + self._wall_offset)

    def next_deadline(self) -> float:
        return min(
            self.next_heartbeat,
            self.next_expiry_check,
            self.life.delayed.next_due(),
            self.next_housekeeping,
            self.next_topic_prune,
            self.leases[0][0] if self.leases else float("inf"),
            self.flow.wake,
        )

    def _enforce_time_limits(self, now: float) -> None:
        """End the attempts that have run past their time limit and the grace with no
        answer (once a heartbeat interval: the attempts in flight, not a timer per
        job). A worker process of ours runs its attempts one by one, from when the
        one before ended; anybody else's run from when they were sent. One that may
        run a later one first (a ranked queue's: ``_reordering_over``) is dropped."""
        grace = self.config.time_limit_grace
        over = []
        dropped = []
        for peer in self.peers:
            if not peer.inflight or peer.role == ROLE_MANAGER:
                continue  # (a manager holds the attempts of a lost process: _expire_held)
            if peer.role == ROLE_SLOT:
                head = next(iter(peer.inflight))
                if head != peer.running or peer.jobs_done != peer.running_done:
                    peer.running, peer.running_since = head, now
                    peer.running_done = peer.jobs_done
                if peer.reorders and len(peer.inflight) > 1:
                    if self._reordering_over(peer, now):
                        dropped.append(peer)
                    continue
                running: Any = ((head, peer.running_since),)
            else:
                running = ((a, 0.0) for a in peer.inflight)
            for attempt_id, since in running:
                job = self.inflight.get(attempt_id)
                limit = job.headers.timeout if job is not None else 0.0
                if (
                    job is not None
                    and limit
                    and now - max(since, job.dispatched_at) > limit + grace
                ):
                    over.append(job)
        for job in over:
            self._time_out(job, now)
        for peer in dropped:
            for attempt_id in list(peer.inflight):
                job = self.inflight.get(attempt_id)
                if job is not None:
                    self._kill_attempt(job)  # the one running; the others never start
            self._drop_peer(peer, now, "ran past a time limit and its grace with no answer")

    def _reordering_over(self, peer: Peer, now: float) -> bool:
        """Whether the worker process ``peer``, which holds ranked jobs and runs the
        best-ranked first (not the oldest-dispatched), has run one past its time
        limit and the grace: the broker cannot tell which it runs, so it counts from
        when the slot's last attempt ended (or the latest was sent) against the
        longest limit of those it holds; none when one has none. Then its attempts
        are held until its job manager says which ran (``_drop_peer``)."""
        latest, longest = peer.running_since, 0.0
        for attempt_id in peer.inflight:
            job = self.inflight.get(attempt_id)
            if job is None or not job.headers.timeout:
                return False
            latest = max(latest, job.dispatched_at)
            longest = max(longest, job.headers.timeout)
        if now - latest <= longest + self.config.time_limit_grace:
            return False
        self.counters["time_limits"] += 1
        log.warning(
            "worker process %s: no answer %g s past the time limits of the jobs it "
            "holds; the broker ends its attempts (its job manager says which ran)",
            show_identity(peer.identity),
            self.config.time_limit_grace,
        )
        return True

    def _time_out(self, job: Job, now: float) -> None:
        """The broker ends ``job``'s attempt: over its time limit, and nobody said."""
        peer = job.peer
        assert peer is not None
        limit, grace = job.headers.timeout, self.config.time_limit_grace
        self.counters["time_limits"] += 1
        log.warning(
            "job %s: no answer %g s past its time limit of %g s from job manager %s: "
            "the broker ends the attempt",
            show_identity(job.id),
            grace,
            limit,
            show_identity(peer.identity),
        )
        self._kill_attempt(job)  # ours: its process goes too (EventMQ's cannot be told)
        message = (
            f"job ran longer than its time limit of {limit:g} s, and its job manager had "
            f"not answered for it {grace:g} s later: the broker ended the attempt"
        )
        body = encode_failure(TIMEOUT_ERROR, message, "")
        self.worker_result(peer, job.attempt_id, TIMED_OUT, body, now)

    def _expire_leases(self, now: float) -> None:
        leases = self.leases
        while leases and now >= leases[0][0]:
            _, attempt_id = heapq.heappop(leases)
            job = self.inflight.get(attempt_id)
            if job is None or job.peer is None:
                continue  # answered already
            self.counters["lease_expired"] += 1
            self.worker_result(job.peer, attempt_id, LEASE_EXPIRED, b"", now)

    def stalled(self, seconds: float, now: float) -> None:
        """The broker's loop was held up for ``seconds`` (SIGSTOP, a VM pause, swap,
        CPU throttling, a slow disk): it heard nobody then, so that time is not the
        peers' silence. Their heartbeat clocks and the held attempts' deadlines move
        on by it; peers that really are gone are dropped a full liveness later."""
        log.warning(
            "the broker's loop was held up for %.1f s (paused, swapping or throttled): "
            "its peers' silence in that time is not held against them",
            seconds,
        )
        for peer in (*self.peers, *self.schedulers):
            peer.last_seen = min(now, peer.last_seen + seconds)
        for group in self.held_slots.values():
            group.deadline += seconds
        # read what waits first (our peers connected again meanwhile, under new
        # identities): a heartbeat now would find their old ones unreachable and
        # drop them, and their jobs with them, before their new INFORMs are read
        self.next_heartbeat = self.next_expiry_check = now + self.config.heartbeat_interval

    def begin_shutdown(self) -> None:
        """Goodbye to every peer; in-flight work may still finish."""
        if self.stopping:
            return
        self.stopping = True
        for peer in self.peers:
            self.out.append(Goodbye(peer))
        for peer in self.schedulers:
            self.out.append(Goodbye(peer))

    @property
    def drained(self) -> bool:
        return not self.inflight

    # ---- memory -------------------------------------------------------------------

    def footprint(self) -> int:
        """The jobs the broker keeps (waiting, running, delayed, dead, spilled):
        what its memory grows with in a backlog."""
        return self.life.footprint()

    def compact(self) -> None:
        """Rebuild the indexes that grew with a backlog at their present size (a
        dict keeps its largest table when emptied; see also ``RecentIds.compact``).
        ``emq_django.broker.memory`` says when."""
        self.life.compact()
        self.inflight = dict(self.inflight)
        self.held = dict(self.held)
        self.held_slots = dict(self.held_slots)
        for peer in self.peers:
            peer.inflight = dict(peer.inflight)

    # ---- clients --------------------------------------------------------------------

    def client_request(
        self,
        client: ClientRef,
        msgid: bytes,
        queue_name: str,
        headers: Headers,
        body: bytes,
        now: float,
        more: tuple[bytes, ...] = (),
        fresh: bool = False,
    ) -> None:
        """A new job. ``client`` gets the ACK (or the refusal), and the result when
        ``headers.reply_requested``. ``fresh``: the port made ``msgid`` itself (the
        broker's id generator), so it cannot be a resent job and is not looked up
        among the known ones (a lookup in the recently finished ids, a large table,
        took a tenth of the broker's time per Majordomo round trip: py-spy)."""
        self.counters["received"] += 1
        if queue_name == WORKFLOW_QUEUE:  # (a job manager may name it too: checked first)
            self._workflow(client, msgid, headers, body, now)
            return
        queue = self.queues.get(queue_name)
        if queue is None:
            if len(self.queues) >= MAX_QUEUES:
                reason = f"the broker already has {MAX_QUEUES} queues"
                self.refuse(client, msgid, "too-many-queues", reason)
                return
            queue = self._queue(queue_name)
        if self.stopping:
            self.refuse(client, msgid, "shutting-down", "the broker is shutting down")
            return
        if headers.run_after or len(body) > self.config.max_body_bytes or headers.rank is not None:
            refusal = self._check_request(headers, body, now)
            if refusal is not None:
                self.refuse(client, msgid, *refusal)
                return
        if headers.unique:  # a unique job: the existing one's id, or this one holds the key
            holder = self.unique.holder(headers.unique, now)
            if holder is not None and holder != msgid:
                self.counters["unique_duplicates"] = self.counters.get("unique_duplicates", 0) + 1
                self.out.append(
                    Refuse(client, msgid, DUPLICATE, DUPLICATE_OF + holder.decode(errors="replace"))
                )
                return
            self._accept(client, msgid, queue, headers, body, more, now, fresh)
            if msgid in self.life.jobs:  # accepted
                self.unique.hold(headers.unique, msgid, queue.name)
            elif msgid in self.life.spilled_ids:  # accepted, waiting on disk
                self.unique.hold(headers.unique, msgid, queue.name, headers.unique_for)
            return
        # the ACK goes out after the job: the worker can start a little sooner
        self._accept(client, msgid, queue, headers, body, more, now, fresh)

    def _workflow(
        self, client: ClientRef, msgid: bytes, headers: Headers, body: bytes, now: float
    ) -> None:
        """A workflow's REQUEST (broker/workflows.py): ACKed and started, or refused."""
        if self.workflows.known(msgid) or self.life.known(msgid):
            self.counters["duplicates"] += 1
            self._ack(client, msgid)
            if headers.reply_requested and not self.workflows.claim(msgid, client):
                self._claim(client, msgid)  # it ended: its kept REPLY, if any
            return
        if self.stopping:
            self.refuse(client, msgid, "shutting-down", "the broker is shutting down")
            return
        refusal = self._check_request(headers, body, now)
        if refusal is not None:
            self.refuse(client, msgid, *refusal)
            return
        try:
            check_workflow_id(msgid)
            spec = parse_workflow(body)
        except ProtocolError as exc:
            self.refuse(client, msgid, exc.code, f"workflow refused: {exc.reason}")
            return
        job = Job(msgid, WORKFLOW_QUEUE, headers, body, client, now)
        if headers.guarantee and self.life.journal_ops is not None:
            self.life.keep(job, WORKFLOW_QUEUE, now, False)  # its graph, journaled
        self._ack(client, msgid)
        self.workflows.submit(job, spec, now)

    def _end_workflow(self, job: Job, body: bytes, outcome: Outcome, now: float) -> None:
        if self.life.jobs.get(job.id) is job:  # a guaranteed one: its row is done
            self.life.forget(job, now)
        self._answer(job, body, outcome, now=now)

    def _resume_workflow(self, job: Job, now: float) -> None:
        """A guaranteed workflow restored from the journal (``restore``)."""
        try:
            spec = parse_workflow(job.body)
        except ProtocolError as exc:
            log.error("journal: workflow %s cannot be resumed: %s", show_identity(job.id), exc)
            self.life.forget(job, now)
            return
        self.workflows.resume(job, spec, now, self._kept_step)

    def _kept_step(self, job_id: bytes) -> str | tuple[bytes, Outcome] | None:
        """What the restored journal says of a workflow's step (``resume``)."""
        kept = self.unclaimed.pop(job_id, None)
        if kept is not None:
            self.restored.pop(job_id, None)
            return kept[1], kept[2]
        letter = self.life.dead.items.get(job_id)
        if letter is not None:
            body = encode_failure(letter.error, "dead-lettered: it failed past its retries", "")
            return body, Outcome(failed=True, error=letter.error)
        if job_id in self.life.jobs:
            self.restored.pop(job_id, None)
            return WAITING
        return None

    def _start_step(
        self,
        job_id: bytes,
        queue_name: str,
        headers: Headers,
        body: bytes,
        client: ClientRef | None,
        now: float,
    ) -> None:
        """A workflow's step, as a job of its queue: journaled when guaranteed, never
        refused for a full queue (its workflow was accepted whole)."""
        queue = self._queue(queue_name)
        job = Job(job_id, queue.name, headers, body, client, now)
        self.counters["received"] += 1
        if self.tracer is not None:
            self.tracer.enqueued(job, now)
        if headers.guarantee and self.life.journal_ops is not None:
            self.life.keep(job, queue.name, now, False)  # journaled, as any guaranteed job
        else:
            self.life.jobs[job_id] = job
        self._route(job, queue, now)

    def _emit(self, effect: Effect) -> None:
        self.out.append(effect)

    def _check_request(self, headers: Headers, body: bytes, now: float) -> tuple[str, str] | None:
        """(code, reason) if the broker refuses this job outright, else None."""
        if len(body) > self.config.max_body_bytes:
            return (
                REFUSED_BODY_TOO_BIG,
                f"the body is {len(body)} bytes; the most is {self.config.max_body_bytes} "
                "(EMQ_MAX_BODY_BYTES): pass large data by reference (a path, a key)",
            )
        if headers.rank is not None:
            return (
                REFUSED_BAD_HEADER,
                "header 'rank' is the broker's, to its worker processes; a client sends 'priority'",
            )
        run_after = headers.run_after
        if run_after and run_after - (now + self._wall_offset) > MAX_DELAY:
            return (
                REFUSED_BAD_RUN_AFTER,
                f"run-after {run_after:.0f} is more than {MAX_DELAY:.0f} s ahead; "
                "use the scheduler for jobs that far out",
            )
        return None

    def _accept(
        self,
        client: ClientRef,
        msgid: bytes,
        queue: Queue,
        headers: Headers,
        body: bytes,
        more: tuple[bytes, ...],
        now: float,
        fresh: bool = False,
    ) -> None:
        """De-duplicate, journal, delay or spill, then route; then ACK."""
        life = self.life
        if not fresh and life.known(msgid):
            self.counters["duplicates"] += 1
            self._ack(client, msgid)  # ACK again: the client did not get the first
            if headers.reply_requested and (self.restored or self.unclaimed):
                self._claim(client, msgid)
            return
        guaranteed = headers.guarantee and life.journal_ops is not None
        config = self.config
        waiting = len(queue.pending)  # (a ranked queue's len is a Python call: once)
        over = waiting >= config.max_pending or queue.pending_bytes >= config.max_queue_bytes
        if over and not guaranteed and not headers.run_after:
            self._refuse_full(client, msgid, queue)
            return
        job = Job(
            msgid, queue.name, headers, body, client if headers.reply_requested else None, now
        )
        if more:
            job.more = more
        if headers.priority and not queue.ranked:
            queue.rank()  # from now on in priority order, with ranks on the wire (state.Queue)
        if headers.flow and not queue.gated:
            self._gate(queue)  # from now on through the flow control's gate (broker/flow.py)
        if self.tracer is not None:
            self.tracer.enqueued(job, now)
        if not guaranteed and not headers.run_after:  # the common case: run it now
            life.jobs[msgid] = job
            if queue.gated:
                queue.push(job)
                self._pump(queue, now, job)
            elif waiting or self.stopping:
                queue.push(job)
                if queue.ranked and headers.priority > queue.floor:
                    self._overtake(job, queue, now)
            else:
                target = queue.pick()
                if target is not None:
                    self._dispatch(job, queue, target, now)
                else:
                    queue.push(job)
                    if queue.ranked and headers.priority > queue.floor:
                        self._overtake(job, queue, now)
            self.counters["acked"] += 1
            if client.port.acknowledges:
                # lazy: a job whose sender does not wait for the ACK (not marked
                # guaranteed) and may wait for its REPLY, which the ACK can go with
                lazy = headers.reply_requested and not headers.guarantee
                self.out.append(Acknowledge(client, msgid, lazy))
            return
        ready_now = not headers.run_after or headers.run_after - self._wall_offset <= now
        spill = guaranteed and (over or queue.spilled > 0) and ready_now
        run_at = life.keep(job, queue.name, now, spill)
        if spill:
            queue.spilled += 1
        elif run_at <= now:
            self._route(job, queue, now)
        self._ack(client, msgid)

    def _over_bound(self, queue: Queue) -> bool:
        return (
            len(queue.pending) >= self.config.max_pending
            or queue.pending_bytes >= self.config.max_queue_bytes
        )

    def _refuse_full(self, client: ClientRef, msgid: bytes, queue: Queue) -> None:
        self.refuse(
            client,
            msgid,
            "queue-full",
            f"queue {queue.name!r} is full ({len(queue.pending)} jobs, "
            f"{queue.pending_bytes} bytes waiting; none of {len(queue.servers)} job managers "
            "has a free slot); send it again later, or as guaranteed to wait on disk",
        )

    def client_schedule(self, client: ClientRef, msgid: bytes, payload: Any, now: float) -> None:
        """A schedule command for the schedulers (SCHEDULE/UNSCHEDULE), passed on as is."""
        self._ack(client, msgid)
        if not self.schedulers:
            if len(self.held_schedules) < MAX_HELD_SCHEDULES:
                self.held_schedules.append(payload)
            else:
                log.warning(
                    "no scheduler connected and %d schedules held; dropping %s",
                    MAX_HELD_SCHEDULES,
                    show_identity(msgid),
                )
            return
        for scheduler in self.schedulers:
            self.out.append(Forward(scheduler, payload))
        self.counters["schedules_forwarded"] += 1

    def client_publish(self, client: ClientRef, msgid: bytes, now: float) -> None:
        self._ack(client, msgid)
        self.counters["published"] += 1

    # ---- topics ---------------------------------------------------------------------

    def topic_publish(
        self,
        topic: str,
        data: bytes,
        *,
        producer: str,
        content_type: str,
        headers: tuple[tuple[str, str], ...] = (),
        uuid: bytes = b"",
        ts: float | None = None,
        now: float,
    ) -> Event:
        """Number and keep one event, and offer it to every port (``Published``).
        With a journal, the event is written with the turn's journal operations,
        before the effect leaves. Raises ``ValueError`` for a bad topic."""
        try:
            check_topic(topic)
        except ValueError:
            self.counters["events_refused"] += 1
            raise
        wall = now + self._wall_offset
        event = self.topics.add(
            topic,
            data,
            producer,
            content_type,
            headers,
            uuid or uuid4().bytes,
            wall if ts is None else ts,
            wall,
        )
        self.counters["events_published"] += 1
        if self.next_topic_prune == float("inf"):
            self.next_topic_prune = now + TOPIC_PRUNE_INTERVAL
        self.out.append(Published(event))
        return event

    def lose_unsaved_events(self) -> int:
        """The journal failed to write this turn's events: they are not sent."""
        lost = {id(e) for e in self.topics.lose_unsaved()}
        if lost:
            self.out = [e for e in self.out if not (type(e) is Published and id(e.event) in lost)]
        return len(lost)

    # ---- schedulers -----------------------------------------------------------------

    def scheduler_join(self, peer: Peer, client: ClientRef, msgid: bytes, now: float) -> None:
        self.schedulers[peer] = None
        log.info("scheduler %s connected", show_identity(peer.identity))
        self._ack(client, msgid)
        self.out.append(Beat(peer, now + self._wall_offset))
        held, self.held_schedules = self.held_schedules, []
        for payload in held:
            self.out.append(Forward(peer, payload))

    def scheduler_leave(self, peer: Peer, now: float, answer: bool) -> None:
        """A scheduler said goodbye; ``answer``: with a goodbye of ours."""
        if self.schedulers.pop(peer, None) is not None:
            log.info("scheduler %s said goodbye", show_identity(peer.identity))
            peer.gone = True
            if answer:
                self.out.append(Goodbye(peer))
            self.out.append(Forget(peer))

    # ---- workers --------------------------------------------------------------------

    def worker_join(
        self, peer: Peer, now: float, client: ClientRef | None = None, msgid: bytes = b""
    ) -> None:
        """A new worker (``peer``, made by its port with its queues and meta); ``client``
        and ``msgid``: where the join is acknowledged, when the protocol does that."""
        self.peers[peer] = None
        peer.last_seen = peer.connected_at = now
        if peer.role == ROLE_MANAGER and peer.manager:
            self.managers[peer.manager] = peer
            if self.held_slots:
                self._adopt_held(peer)
        if self.drained_managers and peer.manager in self.drained_managers:
            manager_control.hold(self, peer)  # a drained job manager's new process
        for weight, name in peer.queues:
            self._queue(name).add_server(peer, weight)
        if peer.role != ROLE_SLOT:
            log.info(
                "job manager %s connected: queues %s, %s",
                show_identity(peer.identity),
                ",".join(f"{n}:{w}" for w, n in peer.queues),
                _describe(peer.meta),
            )
        if client is not None:
            self._ack(client, msgid)
        self.out.append(Beat(peer, now + self._wall_offset))
        if peer.manager is not None:
            self._supersede(peer, now)

    def _supersede(self, peer: Peer, now: float) -> None:
        """``peer`` is one of ours that connected again under a new identity (it
        heard nothing for a while: a broker stall, a network cut): the same job
        manager's control connection, or the same worker process (its pid). Its
        jobs are still its. The old connection goes; a worker process's attempts
        that it answered (its INFORM lists them, and it sends those answers again
        on this connection) stay in flight at it, and the others never reached it
        and go back to their queue uncounted."""
        if peer.role == ROLE_MANAGER:
            for former in [p for p in self.peers if p.role == ROLE_MANAGER]:
                if former.manager == peer.manager and former is not peer:
                    self._drop_peer(former, now, "connected again", verdict=True)
            return
        answered = _attempt_ids(peer.meta.get("answered"))
        for former in [p for p in self.peers if p is not peer and _same_process(p, peer)]:
            for attempt_id in [a for a in former.inflight if a in answered]:
                self._move_attempt(attempt_id, former, peer)
            self._drop_peer(former, now, "connected again", verdict=True)
        # dropped already (unreachable, silent) and held under its job manager
        for group in [g for g in self.held_slots.values() if _same_process(g.slot, peer)]:
            for attempt_id in [a for a in group.attempts if a in answered]:
                self._unhold(attempt_id)
                self._move_attempt(attempt_id, group.manager, peer)
            self._release_held(group, now)

    def _move_attempt(self, attempt_id: bytes, former: Peer | None, peer: Peer) -> None:
        job = self.inflight.get(attempt_id)
        if job is not None:
            if former is not None:
                former.inflight.pop(attempt_id, None)
            peer.inflight[attempt_id] = None
            job.peer = peer

    def worker_ready(self, peer: Peer, now: float) -> None:
        """One more job may go to ``peer`` (a READY)."""
        self._credit(peer, now)

    def worker_result(
        self,
        peer: Peer,
        attempt_id: bytes,
        outcome: Outcome,
        body: bytes,
        now: float,
        more: tuple[bytes, ...] = (),
    ) -> None:
        """How the attempt ``attempt_id`` ended, from ``peer``."""
        job = self.inflight.get(attempt_id)
        if job is None or (job.peer is not peer and not self._may_answer(peer, job)):
            if self.restored and self._restored_outcome(attempt_id, outcome, body, more, now):
                pass
            elif peer.role == ROLE_MANAGER and outcome.lost is None:
                self.counters["stale_resends"] += 1
            else:
                self.counters["stale_replies"] += 1
        elif outcome.requeue:
            # a worker process that is going away gives back a job it never started
            del self.inflight[attempt_id]
            if self.held:
                self._unhold(attempt_id)
            self._release(job)
            self._requeue(job, now)
        else:
            del self.inflight[attempt_id]
            group = self._unhold(attempt_id) if self.held else None
            owner = self._finish(job, now)
            if outcome.failed:  # failed, timed out, lost: one count, only then
                if job.manager is not None:
                    failed = self.failed_by_manager
                    failed[job.manager] = failed.get(job.manager, 0) + 1
                elif owner is not None:  # EventMQ's: one connection, counted on it
                    owner.jobs_failed += 1
            if outcome.lost is not None:
                self.counters["worker_lost"] += 1
            final = self.life.settle(job, outcome, now)
            if outcome.lost is not None:
                # its job manager says the process is gone and this was the job it
                # ran, after the answers of the jobs it had finished: its other jobs
                # never started, and go back to their queue without counting
                if group is not None:
                    self._release_held(group, now)
                elif owner is not None and owner is not peer and owner.role == ROLE_SLOT:
                    self._drop_peer(owner, now, "lost its worker process", verdict=True)
            if final:
                self._answer(job, body, outcome, more, now=now)
            if job.headers.max_concurrency:  # its key is free: a job it blocked may go
                self.flow.released()
                self._pump(self.queues[job.queue], now)
            if owner is peer and peer.credit > 0 and not peer.inflight and not peer.draining:
                self._serve_gated(peer, now)  # idle again: a gated queue may go on
        if outcome.ready:
            self._credit(peer, now)

    def _restored_outcome(
        self,
        attempt_id: bytes,
        outcome: Outcome,
        body: bytes,
        more: tuple[bytes, ...],
        now: float,
    ) -> bool:
        """The outcome of an attempt this broker did not dispatch, for a job it
        restored from the journal: the previous broker's (it died, or a standby took
        over), which a job manager that connected here hands over. The job ran, so
        it completes with it, once. One waiting in its queue leaves it; one that this
        broker dispatched meanwhile is a duplicate in flight, whose own outcome is
        then stale (dropped): only a success completes it then (a failure leaves the
        attempt running here to decide). Returns whether the outcome was taken."""
        if outcome.requeue or outcome.lost is not None:
            return False  # never started, or a lost process's verdict: not an outcome
        job_id, sep, number = attempt_id.rpartition(b"#")
        had = self.restored.get(job_id) if sep else None
        job = self.life.jobs.get(job_id) if had is not None else None
        if job is None or had is None or job.cancelled:
            return False
        if not number.isdigit() or int(number) <= had:
            # an attempt the journal had the outcome of (the previous broker counted
            # its failure and scheduled the retry that waits here): not a second
            # time. Its number, not the count of failures: an attempt given back
            # unstarted took a number without counting (issue 32, fault scenario a)
            return False
        queue = self.queues[job.queue]
        if self.inflight.get(job.attempt_id) is job:
            if outcome.failed:
                return False
            del self.inflight[job.attempt_id]
            if self.held:
                self._unhold(job.attempt_id)
            self._finish(job, now)
        elif job in queue.pending:
            queue.pending.remove(job)
            queue.pending_bytes -= len(job.body)
            # had now: its retry is journaled under it, and this broker's attempts
            # are numbered after it
            attempt = int(number)
            self.restored[job_id] = attempt
            job.attempt = max(job.attempt, attempt)
        else:
            return False  # delayed (a retry), dead: that attempt's outcome was had
        self.counters["restored_outcomes"] += 1
        log.info(
            "job %s: took the outcome of attempt %s, which the previous broker dispatched",
            show_identity(job_id),
            show_identity(attempt_id),
        )
        if self.life.settle(job, outcome, now):
            self._answer(job, body, outcome, more, now=now)
        return True

    def _claim(self, client: ClientRef, job_id: bytes) -> None:
        """A client sent a known job again with a reply requested: after a failover
        it says so that it waits for a job restored from the journal (whose client
        the journal does not keep). It gets the outcome when the job ends, or now if
        it ended unclaimed."""
        job = self.life.jobs.get(job_id)
        if job is not None:
            if job.client is None and job_id in self.restored:
                job.client = client
            return
        kept = self.unclaimed.pop(job_id, None)
        if kept is not None:
            job, body, outcome, more = kept
            self.out.append(Answer(client, job, body, outcome, more))

    def worker_partial(
        self,
        peer: Peer,
        attempt_id: bytes,
        body: bytes,
        now: float,
        more: tuple[bytes, ...] = (),
        seq: int = 0,
    ) -> None:
        """A partial result of a running attempt (number ``seq`` of it, when the
        worker counts them): counted on the job (its trace line says how many), and
        on to its client at once if that client asked for partials (eMQP: header
        ``stream``, which only our client sends) or its protocol has them."""
        job = self.inflight.get(attempt_id)
        if job is None or not self._may_answer(peer, job):
            self.counters["stale_partials"] += 1
            return
        job.partials += 1
        self.counters["partials"] += 1
        client = job.client
        if client is not None and (job.headers.stream or client.port.always_streams):
            self.counters["partials_forwarded"] += 1
            self.out.append(
                Answer(client, job, body, _PARTIAL, more, final=False, seq=seq or job.partials)
            )

    def worker_unsent(self, peer: Peer, attempt_id: bytes, now: float) -> None:
        """The delivery of ``attempt_id`` could not leave for ``peer`` (nobody
        connected to take it, or all full): it goes back to the front of its queue,
        uncounted, and ``peer`` gets no more until ``worker_credit`` says so."""
        job = self.inflight.pop(attempt_id, None)
        if job is None:
            return
        self._set_credit(peer, 0)
        self._release(job)
        self._requeue(job, now, lost_from=peer)

    def worker_credit(self, peer: Peer, credit: int, now: float) -> None:
        """``peer`` may have ``credit`` jobs more than it has now (at once; waiting
        ones are dispatched)."""
        for _ in range(credit):
            if peer.draining or self.stopping:
                return
            self._credit(peer, now)

    def set_max_age(self, queue_name: str, seconds: float) -> None:
        """Jobs of this queue older than ``seconds`` when their turn comes are
        dropped (counted ``expired``); 0: never."""
        if seconds or queue_name in self.queues:
            self._queue(queue_name).max_age = seconds

    def worker_disconnect(self, peer: Peer, now: float) -> None:
        """``peer`` wants no more jobs; the ones it has still count."""
        peer.draining = True
        self._set_credit(peer, 0)
        self.out.append(Goodbye(peer))
        if not peer.inflight:
            self._drop_peer(peer, now, "said goodbye")

    def worker_goodbye(self, peer: Peer, now: float) -> None:
        """``peer`` said KBYE: the jobs it holds are what it can promise. Ours say
        goodbye once they have finished, so what is still in flight at it never
        started: back to its queue, uncounted. EventMQ's job manager says it at
        once on SIGTERM, then lets its running jobs finish and REPLYs: it gets no
        more jobs, its attempts stay in flight and their late REPLYs count; if it
        goes without them (unreachable), each counts as an attempt."""
        if peer.role != ROLE_PLAIN:
            self._drop_peer(peer, now, "said KBYE", verdict=True)
            return
        peer.draining = True
        self._set_credit(peer, 0)
        if not peer.inflight:
            self._drop_peer(peer, now, "said KBYE")
        else:
            log.info(
                "job manager %s said KBYE; its %d jobs in flight may still finish",
                show_identity(peer.identity),
                len(peer.inflight),
            )

    def worker_ended(self, peer: Peer, pid: int, how: str, now: float) -> None:
        """Our job manager (``peer``: its control connection) says its worker process
        ``pid`` ended (``how``: ``exit code 1``), after every answer of that process
        it had to send: those the process held or sent last, and the ``lost`` one
        of the job it was running, if any. The process's other attempts in flight
        never started: back to their queue, uncounted."""
        if peer.role != ROLE_MANAGER or not peer.manager:
            return
        for slot in [
            p
            for p in self.peers
            if p.role == ROLE_SLOT and p.manager == peer.manager and p.meta.get("pid") == pid
        ]:
            self._drop_peer(slot, now, f"ended ({how})", verdict=True)
        for group in [
            g
            for g in self.held_slots.values()
            if g.slot.manager == peer.manager and g.slot.meta.get("pid") == pid
        ]:
            self._release_held(group, now)

    def worker_gone(self, peer: Peer, now: float, why: str, verdict: bool = False) -> None:
        """``peer`` is gone (its goodbye, its socket, its silence). ``verdict``: its
        in-flight jobs never started, and go back to their queue uncounted."""
        self._drop_peer(peer, now, why, verdict=verdict)

    def peer_unreachable(self, peer: Peer, now: float) -> None:
        """The port could not route to ``peer``: it is gone. The control connection
        of our job manager goes at the next expiry check, not at once: with it go
        its worker processes, and after a broker stall the same job manager's new
        connection may be waiting to be read (it replaces the old one then)."""
        self.counters["unroutable"] += 1
        if peer in self.peers:
            if peer.role == ROLE_MANAGER:
                peer.unreachable = True
                return
            log.warning("job manager %s is unreachable; dropping it", show_identity(peer.identity))
            self._drop_peer(peer, now, "unreachable")
        elif self.schedulers.pop(peer, None) is not None:
            peer.gone = True
            self.out.append(Forget(peer))

    def unknown_worker(self, replied: bool) -> None:
        # A job manager from before a broker restart, or one dropped as silent. No
        # answer: it hears no heartbeats from us and joins again.
        self.counters["unknown_peer"] += 1
        if replied:
            self.counters["stale_replies"] += 1

    # ---- dispatch -------------------------------------------------------------------

    def _queue(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name, self.config.priority_aging)
            if name in self.flow.queue_rates:
                self._gate(queue)  # EMQ_RATE_LIMITS
        return queue

    def _gate(self, queue: Queue) -> None:
        """From now on ``queue``'s jobs go out through the flow control's gate."""
        queue.gated = True
        self.gated[queue.name] = queue

    def _pump(self, queue: Queue, now: float, new: Job | None = None, force: bool = False) -> None:
        """A gated queue's waiting jobs that may go now, to its ready workers.
        ``new``: the job just pushed (or given back) to it."""
        flow = self.flow
        if new is not None:
            flow.pushed(queue.name, new)
        while queue.pending and not queue.paused and not self.stopping:
            peer = queue.pick()
            if peer is None:
                return
            job = flow.take(queue, now, self.inflight, force)
            if job is None:
                return
            force = False
            self._dispatch(job, queue, peer, now)

    def _pump_gated(self, now: float, force: bool = False) -> None:
        self.flow.wake = float("inf")  # each queue's take says when next
        for queue in self.gated.values():
            if queue.pending:
                self._pump(queue, now, force=force)

    def _route(self, job: Job, queue: Queue, now: float) -> None:
        """Dispatch ``job`` to the best ready worker, or let it wait."""
        if job.headers.flow and not queue.gated:
            self._gate(queue)
        if queue.gated:
            queue.push(job)
            self._pump(queue, now, job)
            return
        target = None if queue.pending or self.stopping else queue.pick()
        if target is not None:
            self._dispatch(job, queue, target, now)
        else:
            queue.push(job)
            if queue.ranked and job.headers.priority > queue.floor:
                self._overtake(job, queue, now)

    def _overtake(self, job: Job, queue: Queue, now: float) -> None:
        """``job``, just put in the ranked ``queue`` to wait (its priority is above
        the queue's floor), goes, if it is the best waiting and outranks a job that a
        worker process of ours holds unstarted, to such a process beyond its credit
        (nobody has credit): it runs the best-ranked it holds next (worker/ranked.py),
        so ``job`` does not wait behind the lower one. Other peers never get more
        than their credit. The process's credit goes below 0: its answers pay it
        back. (A job that was not the best waiting when it came never needs it: the
        jobs that go meanwhile are better ranked than it.)"""
        if queue.pending[0] is not job or queue.paused or self.stopping:
            return
        peer = holder_of_lower(job, queue, self.inflight)
        if peer is None:
            return
        queue.pop()
        self.counters["overtakes"] += 1
        if peer.credit > 0:
            self._dispatch(job, queue, peer, now)
        else:
            self._dispatch(job, queue, peer, now, returning=True)
            peer.credit -= 1  # (unready already: no queue's tiers change)

    def _credit(self, peer: Peer, now: float) -> None:
        if peer.draining or self.stopping:
            return
        if peer.credit < 0:  # it got jobs beyond its credit (_overtake): this pays one
            peer.credit += 1
            return
        for _weight, name in peer.queues:  # highest weight first
            queue = self.queues[name]
            if queue.max_age:
                self._drop_expired(queue, now)
            if queue.pending and not queue.paused and not (queue.gated and holds_jobs(peer)):
                job = queue.pop() if not queue.gated else self.flow.take(queue, now, self.inflight)
                if job is not None:
                    self._dispatch(job, queue, peer, now, returning=True)
                    if queue.spilled:
                        self._check_spill(queue)
                    return
            if queue.spilled:
                self._check_spill(queue)  # waiting on disk: read some back
        credit = peer.credit
        if credit > 0:
            peer.credit = credit + 1  # ready already: no queue's tiers change
        else:
            self._set_credit(peer, credit + 1)

    def _serve_gated(self, peer: Peer, now: float) -> None:
        """``peer`` is idle with credit left: a gated queue's next job, if one waits
        (it kept them from ``peer`` while it held a job: ``holds_jobs``)."""
        for _weight, name in peer.queues:
            queue = self.queues[name]
            if queue.gated and queue.pending and not queue.paused and not self.stopping:
                job = queue.pop() if not queue.gated else self.flow.take(queue, now, self.inflight)
                if job is not None:
                    self._dispatch(job, queue, peer, now)
                    return

    def _drop_expired(self, queue: Queue, now: float) -> None:
        """Drop the jobs at the front of ``queue`` older than its max_age."""
        limit = now - queue.max_age
        while queue.pending and queue.pending[0].enqueued_at < limit:
            job = queue.pop()
            self.counters["expired"] += 1
            if self.tracer is not None:
                self.tracer.event("failed", job, now, "Expired", final=True)
            self.life.forget(job, now)
            if job.id in self.workflows.steps:
                expired = encode_failure("Expired", f"older than {queue.name}'s max age", "")
                self.workflows.step_ended(job, expired, EXPIRED, (), now)

    def _set_credit(self, peer: Peer, credit: int) -> None:
        was, peer.credit = peer.credit, credit
        if was and not credit:
            for weight, name in peer.queues:
                self.queues[name].unready(peer, weight)
        elif credit and not was:
            for weight, name in peer.queues:
                self.queues[name].ready(peer, weight)

    def _check_spill(self, queue: Queue) -> None:
        self.life.check_spill(queue.name, len(queue.pending), queue.pending_bytes, queue.spilled)

    def _dispatch(
        self, job: Job, queue: Queue, peer: Peer, now: float, returning: bool = False
    ) -> None:
        """Send ``job`` to ``peer``. ``returning``: the peer's credit is being
        given back by this very dispatch, so it is not taken."""
        attempt = job.attempt = job.attempt + 1
        attempt_id = job.attempt_id = b"%s#%d" % (job.id, attempt)
        job.peer = peer
        job.manager = peer.manager
        job.dispatched_at = now
        job.partials = 0  # counted per attempt
        if self.tracer is not None:
            self.tracer.dispatched(job, now, peer)
        if self.spans is not None:
            self.spans.dispatched(job, now + self._wall_offset, self._wall_offset, peer)
        self.inflight[attempt_id] = job
        peer.inflight[attempt_id] = None
        queue.in_flight += 1
        if not returning:
            credit = peer.credit
            if credit > 1:
                peer.credit = credit - 1  # still ready: no queue's tiers change
            else:
                self._set_credit(peer, credit - 1)
        self.counters["dispatched"] += 1
        if peer.lease:
            heapq.heappush(self.leases, (now + peer.lease, job.attempt_id))
        if queue.ranked and peer.role == ROLE_SLOT:  # it orders what it holds by rank
            self.out.append(Deliver(peer, job, held_worst(peer, job, queue, self._wall_offset)))
        else:
            self.out.append(Deliver(peer, job))

    def _may_answer(self, peer: Peer, job: Job) -> bool:
        if job.peer is peer:
            return True
        # our job manager answers for a slot whose process it had to kill, and a
        # slot that connected again answers under its new identity
        return bool(peer.role != ROLE_PLAIN and peer.manager and peer.manager == job.manager)

    def _release(self, job: Job) -> Peer | None:
        """The attempt is no longer in flight at its peer; returns that peer."""
        self.queues[job.queue].in_flight -= 1
        owner = job.peer
        if owner is not None:
            owner.inflight.pop(job.attempt_id, None)
        return owner

    def _finish(self, job: Job, now: float) -> Peer | None:
        """The attempt's peer is done with it; returns that peer."""
        owner = self._release(job)
        if job.manager is not None:  # counted per job manager: slots come and go
            self.done_by_manager[job.manager] = self.done_by_manager.get(job.manager, 0) + 1
        if owner is not None:
            owner.jobs_done += 1
            if owner.draining and not owner.inflight:
                self._drop_peer(owner, now, "said goodbye")
        return owner

    def _requeue(self, job: Job, now: float, lost_from: Peer | None = None) -> None:
        """Back to the front of its queue, not counted as an attempt: it never started.
        The caller has released it (``in_flight``) already. One cancelled meanwhile
        ends here, cancelled."""
        if job.cancelled:
            job.peer = None
            self.life.end_cancelled(job, now)
            # given back unstarted (no peer lost): it never ran
            body = b"" if lost_from else CANCELLED_UNSTARTED
            self._answer(job, body, CANCELLED_OUTCOME, now=now)
            return
        if self.tracer is not None:
            self.tracer.event("requeued", job, now, "PeerLost", peer=lost_from)
        queue = self.queues[job.queue]
        self.counters["requeued"] += 1
        job.peer = None
        if queue.gated:
            queue.push_front(job)
            self._pump(queue, now, job)
            return
        target = None if queue.pending else queue.pick()
        if target is not None and not self.stopping:
            self._dispatch(job, queue, target, now)
        else:
            queue.push_front(job)

    def _answer(
        self, job: Job, body: bytes, outcome: Outcome, more: tuple[bytes, ...] = (), *, now: float
    ) -> None:
        """The job's final outcome, to its client if one waits (a restored job's
        is kept for a client that claims it: ``_claim``); a workflow's step's goes
        to its workflow, which moves on."""
        if job.headers.unique:
            self.unique.release(job.headers.unique, job.id, job.headers.unique_for, now)
        if self.workflows.steps and job.id in self.workflows.steps:
            if outcome.failed and job.cancelled and body is not CANCELLED_UNSTARTED:
                body = encode_failure(CANCELLED, "the job was cancelled while it ran", "")
                outcome, more = CANCELLED_OUTCOME, ()
            if job.headers.guarantee:  # its outcome stays in the journal: never run again
                self._keep_reply(job, body, outcome, more)
            self.workflows.step_ended(job, body, outcome, more, now)
            return
        if job.headers.reply_requested and job.headers.guarantee:
            self._keep_reply(job, body, outcome, more)
        if self.restored and job.id in self.restored:
            del self.restored[job.id]
            if job.client is None:
                self.unclaimed[job.id] = (job, body, outcome, more)
                if len(self.unclaimed) > MAX_UNCLAIMED:
                    del self.unclaimed[next(iter(self.unclaimed))]
                return
        if job.client is None:
            return
        if outcome.failed and job.cancelled and body is not CANCELLED_UNSTARTED:
            body = encode_failure(CANCELLED, "the job was cancelled while it ran", "")
            outcome, more = CANCELLED_OUTCOME, ()
        self.out.append(Answer(job.client, job, body, outcome, more))

    def _keep_reply(self, job: Job, body: bytes, outcome: Outcome, more: tuple[bytes, ...]) -> None:
        """Journal the reply with the job's done row (``broker/kept_replies.py``):
        a broker that takes over before the reply reached the client answers it
        when it sends the job again. The done row was queued just now (``settle``,
        then this): it becomes a ``KeepReply``; a job not ended by a done row
        (dead-lettered) keeps none."""
        ops = self.life.journal_ops
        if not ops:
            return
        last = ops[-1]
        # a done, or a done row kept with an empty reply (a unique key's: ``forget``)
        if (
            isinstance(last, JobDone) or (isinstance(last, KeepReply) and not last.reply)
        ) and last.job_id == job.id:
            status = outcome.raw or status_frame(
                outcome.failed, outcome.error, outcome.lost, outcome.retry
            )
            reply = encode_reply(outcome.failed, status, body, more)
            ops[-1] = KeepReply("reply", job.id, reply, last.updated_at)

    # ---- peers going away -------------------------------------------------------------

    def _drop_peer(
        self, peer: Peer, now: float, why: str, verdict: bool = False, orphaned: bool = False
    ) -> None:
        """Forget ``peer``. Its in-flight attempts: with ``verdict`` (the peer or its
        job manager said so) none started, and they go back to their queue
        uncounted. Else a worker process of ours holds them all until its job
        manager (or the process itself, connected again) says which one ran
        (``_hold``), even when that job manager has not connected here yet (after a
        failover a process may reach the new broker first); a process that
        went with its job manager (``orphaned``), leaves nobody to say (``_unsaid``); EventMQ's
        job manager runs one job per worker, so every one of its attempts counts."""
        if peer not in self.peers:
            return
        del self.peers[peer]
        peer.gone = True
        self.out.append(Forget(peer))
        for weight, name in peer.queues:
            queue = self.queues[name]
            queue.remove_server(peer)
            queue.unready(peer, weight)
        orphans: list[Peer] = []
        if peer.role == ROLE_MANAGER:
            if self.managers.get(peer.manager or "") is peer:
                del self.managers[peer.manager or ""]
                # its worker processes die with it (PDEATHSIG): do not wait for them
                orphans = [p for p in self.peers if p.manager == peer.manager]
                for orphan in orphans:
                    self._set_credit(orphan, 0)  # so that nothing is requeued onto them
            self._rehome_held(peer, now)
        lost = [self.inflight.pop(a) for a in peer.inflight if a in self.inflight]
        peer.inflight.clear()
        manager = self.managers.get(peer.manager or "") if peer.role == ROLE_SLOT else None
        if peer.role != ROLE_SLOT or lost:
            log.info(
                "job manager %s %s; %d jobs in flight %s",
                show_identity(peer.identity),
                why,
                len(lost),
                "go back to their queue"
                if verdict
                else "held until its job manager says which ran"
                if manager is not None or (peer.role == ROLE_SLOT and not orphaned)
                else "end with it",
            )
        if not lost:
            pass
        elif verdict:
            for job in lost:
                self.queues[job.queue].in_flight -= 1
                self._requeue(job, now, lost_from=peer)
        elif manager is not None or (peer.role == ROLE_SLOT and not orphaned):
            self._hold(peer, manager, lost, now)
        elif peer.role == ROLE_SLOT:
            self._unsaid(lost, peer, now, "job manager lost")
        else:
            for job in lost:
                self._lost(job, now, "job manager lost")
        if peer.role == ROLE_MANAGER and peer.manager not in self.managers:
            self.done_by_manager.pop(peer.manager or "", None)
            self.failed_by_manager.pop(peer.manager or "", None)
        for orphan in orphans:
            self._drop_peer(orphan, now, f"went with its job manager {peer.manager}", orphaned=True)

    def _hold(self, slot: Peer, manager: Peer | None, jobs: list[Job], now: float) -> None:
        """The attempts ``jobs`` (in dispatch order) of the worker process ``slot``,
        which is gone, wait under its job manager for its word: a process holds
        several jobs (credit, batched REQUESTs) and may have finished some whose
        answers died with it; which one it ran, the broker cannot tell. ``manager``
        None: it has not connected here yet, and they wait for it (``_adopt_held``)."""
        limit = self.config.heartbeat_interval * self.config.heartbeat_liveness
        group = HeldSlot(slot, manager, now + limit)
        for job in jobs:
            attempt_id = job.attempt_id
            job.peer = manager
            if manager is not None:
                manager.inflight[attempt_id] = None
            self.inflight[attempt_id] = job
            self.held[attempt_id] = group
            group.attempts[attempt_id] = None
        self.held_slots[slot] = group

    def _adopt_held(self, manager: Peer) -> None:
        """The job manager ``manager`` (its control connection) connected: the
        attempts of its processes held with nobody to answer for them wait under it."""
        for group in self.held_slots.values():
            if group.manager is None and group.slot.manager == manager.manager:
                group.manager = manager
                for attempt_id in group.attempts:
                    manager.inflight[attempt_id] = None
                    self.inflight[attempt_id].peer = manager

    def _unhold(self, attempt_id: bytes) -> HeldSlot | None:
        """``attempt_id`` is no longer held; returns the group it was held in."""
        group = self.held.pop(attempt_id, None)
        if group is not None:
            group.attempts.pop(attempt_id, None)
            if not group.attempts:
                self.held_slots.pop(group.slot, None)
        return group

    def _take_held(self, group: HeldSlot) -> list[Job]:
        """The group's attempts still held, out of ``inflight`` (their queue still
        counts them in flight), in dispatch order."""
        self.held_slots.pop(group.slot, None)
        jobs = []
        for attempt_id in group.attempts:
            self.held.pop(attempt_id, None)
            job = self.inflight.pop(attempt_id, None)
            if job is not None:
                if job.peer is not None:
                    job.peer.inflight.pop(attempt_id, None)
                jobs.append(job)
        group.attempts.clear()
        return jobs

    def _release_held(self, group: HeldSlot, now: float) -> None:
        """The job manager has answered for the group's process: the attempts still
        held never started, and go back to their queue uncounted."""
        for job in self._take_held(group):
            self.queues[job.queue].in_flight -= 1
            self._requeue(job, now, lost_from=group.slot)

    def _rehome_held(self, manager: Peer, now: float) -> None:
        """``manager``, a control connection that attempts are held under, is gone:
        they wait under its successor (the same job manager, connected again), or
        nobody is left to say which ran."""
        successor = self.managers.get(manager.manager or "")
        for group in [g for g in self.held_slots.values() if g.manager is manager]:
            if successor is None or successor is manager:
                self._unsaid(self._take_held(group), group.slot, now, "job manager lost")
                continue
            group.manager = successor
            for attempt_id in group.attempts:
                manager.inflight.pop(attempt_id, None)
                successor.inflight[attempt_id] = None
                self.inflight[attempt_id].peer = successor

    def _unsaid(self, jobs: list[Job], slot: Peer, now: float, detail: str) -> None:
        """Nobody can say which of ``jobs`` (the attempts, in dispatch order, that a
        worker process that is gone held; out of ``inflight``) it had started. The
        oldest counts as the one it ran: a failed attempt. Of the others, a job
        that a death would end (at most once, or on its last retry) may have
        started and is never run again: it fails with WorkerLost. The rest go back
        to their queue uncounted."""
        for n, job in enumerate(jobs):
            if n == 0:
                self._lost(job, now, detail)
            elif self.life.last_chance(job):
                self._lost(
                    job,
                    now,
                    f"{detail}; it may have started the job",
                    f"the job's {detail} while it held the job, which it may have "
                    "started: not run again (it runs at most once)",
                )
            else:
                self.queues[job.queue].in_flight -= 1
                self._requeue(job, now, lost_from=slot)

    def _lost(self, job: Job, now: float, detail: str, message: str = "") -> None:
        """The attempt ended with its process, and nobody can say more: a failed
        attempt (``message``: what its client reads, when not the usual)."""
        if self.held:
            self._unhold(job.attempt_id)
        self.queues[job.queue].in_flight -= 1
        if job.manager is not None:
            self.done_by_manager[job.manager] = self.done_by_manager.get(job.manager, 0) + 1
            self.failed_by_manager[job.manager] = self.failed_by_manager.get(job.manager, 0) + 1
        self.counters["worker_lost"] += 1
        log.warning(
            "job %s: %s",
            show_identity(job.id),
            message or f"{detail} mid-job",
            extra=job_fields(job.attempt_id or job.id, job.queue),
        )
        outcome = Outcome(failed=True, error=WORKER_LOST, lost=detail)
        if self.life.settle(job, outcome, now):
            body = encode_failure(WORKER_LOST, message or f"the job's {detail} mid-job", "")
            self._answer(job, body, outcome, now=now)

    def _kill_attempt(self, job: Job) -> bool:
        """Ask the job manager running ``job`` to kill its worker process (an effect
        only our job managers get). False when that cannot be done."""
        if job.attempt_id in self.held:
            return True  # its process is gone already; its job manager will say so
        owner = job.peer
        if owner is None or owner.role == ROLE_PLAIN:
            return False
        control = self.managers.get(owner.manager or "")
        if control is None:
            return False
        self.out.append(Kill(control, job.attempt_id))
        return True

    def _expire_held(self, now: float) -> None:
        for group in [g for g in self.held_slots.values() if now >= g.deadline]:
            detail = "worker process lost (its job manager did not say how)"
            self._unsaid(self._take_held(group), group.slot, now, detail)

    # ---- heartbeats -------------------------------------------------------------------

    def _send_heartbeats(self, now: float) -> None:
        wall = now + self._wall_offset
        for peer in self.peers:
            self.out.append(Beat(peer, wall))
        for peer in self.schedulers:
            self.out.append(Beat(peer, wall))

    def _expire_peers(self, now: float) -> None:
        liveness = self.config.heartbeat_liveness
        limit = self.config.heartbeat_interval * liveness
        # a peer that beats less often whatever we ask (its traits): its own limit
        expired = [
            p
            for p in self.peers
            if p.unreachable
            or now - p.last_seen
            > (
                max(limit, p.traits.heartbeat_floor * liveness + 1)
                if p.traits.heartbeat_floor
                else limit
            )
        ]
        expired.sort(key=lambda p: p.role == ROLE_SLOT)  # managers first: they vouch for slots
        for peer in expired:
            if peer not in self.peers:
                continue  # went with its job manager
            if peer.unreachable:
                log.warning("job manager %s is unreachable; dropping it", peer.manager)
                self._drop_peer(peer, now, "unreachable")
                continue
            if (
                peer.role == ROLE_SLOT
                and peer.inflight
                and not peer.draining
                and peer.manager in self.managers
            ):
                continue  # busy running a job; its job manager vouches for it
            traits = peer.traits
            if peer.inflight and (
                traits.silent_when_busy or (peer.draining and traits.silent_when_draining)
            ):
                # silent while it works (or finishes, saying goodbye: EventMQ's job
                # manager beats no more then); a dead one is unroutable to heartbeats
                continue
            if traits.bound:
                continue  # the broker's own socket (PZQ's send socket): never silent
            self.counters["peers_expired"] += 1
            self._drop_peer(peer, now, f"missed {self.config.heartbeat_liveness} heartbeats")
        for peer in [p for p in self.schedulers if now - p.last_seen > limit]:
            log.info("scheduler %s missed heartbeats; dropping it", show_identity(peer.identity))
            del self.schedulers[peer]
            peer.gone = True
            self.out.append(Forget(peer))

    # ---- answers ----------------------------------------------------------------------

    def _ack(self, client: ClientRef, msgid: bytes) -> None:
        self.counters["acked"] += 1
        if client.port.acknowledges:  # not Majordomo's
            self.out.append(Acknowledge(client, msgid))

    def refuse(
        self, client: ClientRef, msgid: bytes, code: str, reason: str, quiet: bool = False
    ) -> None:
        """Refuse the command ``msgid``: an answer with the reason, counted by code.
        ``quiet``: the caller logs it (malformed messages, within a budget)."""
        self.count_refusal(code)
        if not quiet:
            log.warning("refused %s: %s", show_identity(msgid), reason, extra=job_fields(msgid))
        self.out.append(Refuse(client, msgid, code, reason))

    def count_refusal(self, code: str, n: int = 1) -> None:
        """Count ``n`` refusals with code ``code`` (also those the server makes)."""
        self.counters["refused"] += n
        name = refusal_counter(code)
        self.counters[name] = self.counters.get(name, 0) + n

    # ---- the journal ------------------------------------------------------------------

    def restore(self, stored: list[Any], now: float) -> dict[str, int]:
        """Reload the journal at start-up. Returns counts by state."""
        counts, ready, spilled = self.life.restore(stored, now)
        self.restored.update(
            (j, job.attempt) for j, job in self.life.jobs.items() if job.client is None
        )
        self.unique.restore_ended(stored, now, now + self._wall_offset)
        for j, job in self.life.jobs.items():  # a guaranteed unique job holds its key again
            if job.headers.unique and j not in self.life.dead.items:
                self.unique.hold(job.headers.unique, j, job.queue)
        self._restore_replies(stored, now)
        flows = []
        for job in ready:
            if job.queue == WORKFLOW_QUEUE:
                flows.append(job)
            else:
                queue = self._queue(job.queue)
                if job.headers.flow and not queue.gated:
                    self._gate(queue)
                queue.push(job)
        for name, n in spilled.items():
            self._queue(name).spilled += n
        for queue in self.queues.values():
            self._check_spill(queue)
        for job in flows:  # after their steps' jobs and kept replies are back
            self._resume_workflow(job, now)
        return counts

    def _restore_replies(self, stored: list[Any], now: float) -> None:
        """The replies kept with done rows (``_keep_reply``) still within the
        de-duplication window, for a client that sends its job again."""
        known = self.life.recent
        for row in stored:
            if row.state != "done" or not row.body or row.id not in known:
                continue
            kept = decode_reply(row.body)
            if kept is not None:
                failed, status, body, more = kept
                outcome = Outcome(failed, raw=status)
                job = Job(row.id, row.queue, parse_stored_headers(row.headers), b"", None, now)
                self.unclaimed[row.id] = (job, body, outcome, more)
        while len(self.unclaimed) > MAX_UNCLAIMED:
            del self.unclaimed[next(iter(self.unclaimed))]

    def restore_spilled(self, queue_name: str, stored: list[Any], now: float) -> None:
        queue = self.queues[queue_name]
        jobs = self.life.restore_spilled(stored, now)
        queue.spilled -= len(jobs)
        for job in jobs:
            self._route(job, queue, now)
        self._check_spill(queue)  # more on disk, and nothing waiting in memory: go on

    def unsave(self, job_ids: set[bytes], now: float) -> None:
        """The journal could not save these new jobs: forget them entirely, as if
        never received. What this turn queued for them changes too: their ACK
        becomes a refusal, their delivery is taken back (the server passes the
        reason with ``refuse_unsaved``)."""
        if len(self.unique):
            self.unique.forget(job_ids)  # their unique keys are free again
        for job_id in job_ids:
            job = self.life.jobs.get(job_id)
            spilled_to = self.life.forget_unsaved(job_id)
            if spilled_to is not None:
                self.queues[spilled_to].spilled -= 1
                continue
            if job is None:
                continue
            queue = self.queues[job.queue]
            if job.attempt_id in self.inflight:  # dispatched in this very turn: take it back
                del self.inflight[job.attempt_id]
                queue.in_flight -= 1
                peer = job.peer
                if peer is not None:
                    peer.inflight.pop(job.attempt_id, None)
                    self._credit(peer, now)
            elif job in queue.pending:
                queue.pending.remove(job)
                queue.pending_bytes -= len(job.body)
        self.life.unsave_ops(job_ids)

    def refuse_unsaved(self, job_ids: set[bytes], reason: str, code: str) -> int:
        """Turn this turn's ACKs of ``job_ids`` into refusals and drop their
        deliveries; returns how many were refused."""
        refused = 0
        kept: list[Effect] = []
        for effect in self.out:
            if type(effect) is Deliver and effect.job.id in job_ids:
                continue
            if type(effect) is Acknowledge and effect.msgid in job_ids:
                effect = Refuse(effect.client, effect.msgid, code, f"not saved: {reason}")
                refused += 1
            kept.append(effect)
        self.out = kept
        if refused:
            self.count_refusal(code, refused)
        return refused

    # ---- cancelling (the monitor's CANCEL command) -------------------------------------

    def cancel(self, job_id: bytes, now: float) -> str:
        """Cancel a job. One that has not started (waiting, delayed, dead): gone,
        ``cancelled``. One running on our job manager: its worker process is killed
        and the job ends as cancelled, ``stopping``. One running on an EventMQ job
        manager cannot be stopped but will not be retried: ``running``. Else
        ``unknown``."""
        if job_id in self.workflows.workflows:
            return self.workflows.cancel(job_id, now)
        # (a unique job waiting on disk: its key ends as any unique job's)
        spilled_to = self.life.cancel_spilled(job_id, now, self.unique.end_spilled(job_id, now))
        if spilled_to is not None:
            self.queues[spilled_to].spilled -= 1
            return "cancelled"
        job = self.life.jobs.get(job_id)
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
        else:
            waiting = self.life.take_held(job_id)
        job.cancelled = True
        self.life.end_cancelled(job, now)
        if waiting:
            # get() raises Cancelled
            self._answer(job, CANCELLED_UNSTARTED, CANCELLED_OUTCOME, now=now)
        return "cancelled"

    # ---- dead letters (the monitor's commands) -----------------------------------------

    def dead_letters(self, limit: int = 1000) -> list[dict[str, Any]]:
        return self.life.dead_letters(limit)

    def requeue_dead(self, job_ids: list[bytes] | None, now: float) -> int:
        """Run these dead letters again (all when None), with their retries reset."""
        jobs = self.life.requeue_dead(job_ids, now)
        for job in jobs:
            self._route(job, self._queue(job.queue), now)
        return len(jobs)

    def purge_dead(self, job_ids: list[bytes] | None, now: float) -> int:
        return self.life.purge_dead(job_ids, now)


_PARTIAL = Outcome(failed=False)


def _same_process(a: Peer, b: Peer) -> bool:
    """Two connections of one worker process of ours (one run of its job manager)."""
    return (
        a.role == ROLE_SLOT
        and b.role == ROLE_SLOT
        and a.manager == b.manager
        and a.meta.get("pid") == b.meta.get("pid")
    )


def _attempt_ids(value: object) -> set[bytes]:
    """The attempt ids a peer's INFORM lists (``answered``), as bytes."""
    if not isinstance(value, list):
        return set()
    return {a.encode("utf-8", "surrogateescape") for a in value if isinstance(a, str)}


def _describe(meta: dict[str, object]) -> str:
    return " ".join(f"{k}={meta[k]}" for k in ("host", "pid", "concurrency") if k in meta)
