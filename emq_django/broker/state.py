"""The broker's state: jobs, peers and queues, with weighted credit dispatch.

Pure data structures, no sockets and no clock: callers pass ``now``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from emq_django.broker.priority import RankedPending, on_wire, rank_key
from emq_django.broker.seam import ClientRef, PortRef
from emq_django.protocol.flow import parse_queue_rates
from emq_django.protocol.headers import Headers
from emq_django.protocol.limits import MAX_PRIORITY

ROLE_PLAIN = "plain"  # a job manager with one connection (EventMQ's)
ROLE_MANAGER = "manager"  # our job manager's control connection: no slots of its own
ROLE_SLOT = "slot"  # one worker process of our job manager


@dataclass(frozen=True, slots=True)
class PeerTraits:
    """What a peer's protocol makes it do that the core must allow for, declared by
    the port it came in by, so that the core knows no protocol's quirks."""

    # it may beat this seldom (seconds) whatever heartbeat the broker asks for
    # (EventMQ's peers: every 3 s); 0: it beats as asked
    heartbeat_floor: float = 0.0
    # it sends nothing while it runs a job (Majordomo, PZQ): not expired while busy
    silent_when_busy: bool = False
    # it beats no more once it said goodbye (EventMQ's job manager): not expired
    # while it finishes its jobs
    silent_when_draining: bool = False
    # the broker's own socket, not a remote peer (PZQ's send socket): never expired
    bound: bool = False


EVENTMQ_HEARTBEAT = 3.0  # seconds between the released EventMQ peers' heartbeats
# a job manager with one connection, as EventMQ's: the default of a ``ROLE_PLAIN`` peer
PLAIN_TRAITS = PeerTraits(heartbeat_floor=EVENTMQ_HEARTBEAT, silent_when_draining=True)
OWN_TRAITS = PeerTraits()  # our job manager's connections: beat as asked, always


def show_identity(identity: bytes) -> str:
    """A peer's identity (or an id) as logs, the trace and ``emq_status`` all name
    it: as text when it is printable ASCII, else in hex (libzmq's own identities)."""
    if identity.isascii():
        text = identity.decode("ascii")
        if text.isprintable():
            return text
    return identity.hex()


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    heartbeat_interval: float = 1.0
    heartbeat_liveness: int = 3
    max_pending: int = 100_000
    max_queue_bytes: int = 256 * 1024 * 1024
    retry_base: float = 1.0
    retry_cap: float = 300.0
    dedupe_window: float = 600.0
    max_dead_letters: int = 100_000
    max_body_bytes: int = 64 * 1024 * 1024
    # seconds past a job's time limit (its ``timeout`` header) after which the broker
    # ends a running attempt itself, whoever runs it: our job managers kill the
    # process at the limit and answer (EMQ_KILL_GRACE later at most); EventMQ's never
    time_limit_grace: float = 10.0
    # seconds of waiting that raise a job's priority by one (emq_django/broker/priority.py)
    priority_aging: float = 1.0
    # per-task counters and run-time histograms for Prometheus (broker/task_stats.py);
    # off by default (EMQ_TASK_METRICS): about 1 µs per attempt when on
    task_metrics: bool = False
    # EMQ_RATE_LIMITS: (queue name, jobs per second) (broker/flow.py)
    rate_limits: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_settings(cls, settings: Any) -> BrokerConfig:
        """The core's bounds from ``EmqSettings`` (the server's and the in-memory
        broker's of ``emq_django.testing``)."""
        return cls(
            heartbeat_interval=settings.HEARTBEAT_INTERVAL,
            heartbeat_liveness=settings.HEARTBEAT_LIVENESS,
            max_pending=settings.MAX_PENDING,
            max_queue_bytes=settings.MAX_QUEUE_BYTES,
            retry_base=settings.RETRY_BASE,
            retry_cap=settings.RETRY_CAP,
            dedupe_window=settings.DEDUPE_WINDOW,
            max_dead_letters=settings.MAX_DEAD_LETTERS,
            max_body_bytes=settings.MAX_BODY_BYTES,
            time_limit_grace=settings.TIME_LIMIT_GRACE,
            priority_aging=settings.PRIORITY_AGING,
            task_metrics=settings.TASK_METRICS,
            rate_limits=tuple(parse_queue_rates(settings.RATE_LIMITS).items()),
        )


@dataclass(slots=True, eq=False)
class Job:
    id: bytes  # the client's msgid (eMQP), or one the port made (Majordomo)
    queue: str
    headers: Headers
    body: bytes
    client: ClientRef | None  # where the result goes, if anyone waits for it
    enqueued_at: float  # monotonic; on the wall clock: + the core's wall_offset
    attempt: int = 0
    attempt_id: bytes = b""
    peer: Peer | None = None
    dispatched_at: float = 0.0
    failures: int = 0  # failed attempts so far: failures, time-outs and worker deaths
    cancelled: bool = False  # cancelled while running: its outcome is final, no retry
    manager: str | None = None  # the job manager (Peer.manager) of its current attempt
    # for its trace lines: the id as they give it (trace.job_json), and their task,
    # queue and job manager for this attempt (one slot, not two: with 16 slots a
    # Job takes 160 bytes, with 17 it takes 176)
    trace: tuple[str, str] = ("", "")
    more: tuple[bytes, ...] = ()  # body frames after the first (Majordomo requests)
    partials: int = 0  # partial results its current attempt sent (the trace's "partials")


@dataclass(slots=True, eq=False)
class Peer:
    """A job manager connection, a worker process, a Majordomo worker or a
    scheduler: whoever INFORMed (or said READY) on a port. Compared by identity
    of the object: two ports may well see the same identity bytes."""

    identity: bytes
    peer_type: str
    queues: tuple[tuple[int, str], ...]
    last_seen: float
    meta: dict[str, Any] = field(default_factory=dict)
    credit: int = 0
    # attempt ids in dispatch order: a slot runs them one by one, so the first is the
    # one running and the others have not started
    inflight: dict[bytes, None] = field(default_factory=dict)
    jobs_done: int = 0
    jobs_failed: int = 0  # of ``jobs_done`` (EventMQ's; ours: BrokerCore.failed_by_manager)
    # what our job manager's control connection last said of its memory (its
    # HEARTBEAT's report frame): {"rss": bytes, "processes": {pid: bytes}}
    memory: dict[str, Any] | None = None
    draining: bool = False
    connected_at: float = 0.0
    trace_name: str | None = None  # its "jm" in the trace log, once known
    port: PortRef | None = None  # the port it came in by: what is said to it goes out there
    gone: bool = False  # dropped by the core
    # a control connection of ours found unreachable: dropped at the next expiry
    # check, unless the same job manager's new connection has replaced it by then
    unreachable: bool = False
    # a worker process of ours runs its attempts one by one: the one it runs (the
    # first in ``inflight``) and since when, as the broker's time limits see it
    running: bytes = b""
    running_since: float = 0.0
    running_done: int = 0  # its ``jobs_done`` then: an attempt that ended restarts the clock
    # it got a ranked queue's jobs: it runs the best-ranked it holds first, not
    # necessarily the first in ``inflight`` (BrokerCore._reordering_over)
    reorders: bool = False
    # at least the worst rank (``rank_key``) of the ranked jobs it holds, None when
    # it got none since it was last empty: ``holder_of_lower`` skips it below that
    worst: tuple[float, float] | None = None
    # seconds it has to answer each delivery, else the attempt failed (PZQ's ack
    # time-out); 0: no limit
    lease: float = 0.0
    # the most jobs it takes per message (its port batches deliveries up to this
    # many, eMQP's "batch" extension); 1: one message per job
    batch: int = 1
    # ... and those as one REQUESTS message (records in one frame), not a REQUEST of
    # four frames per job: its INFORM said ``"packed": true`` (protocol/batching.py)
    packed: bool = False
    # it sends its answers as one REPLIES message: its INFORM said
    # ``"packed_replies": true``, and our ACK of it says we read them
    packed_replies: bool = False
    # ``role`` and ``manager``, worked out once from ``meta`` (which a port fills
    # before the peer joins and nothing changes after): every dispatch reads them
    role: str = field(init=False, default=ROLE_PLAIN)
    manager: str | None = field(init=False, default=None)
    # what its protocol makes it do (its port's declaration); by default as its role
    traits: PeerTraits = PLAIN_TRAITS

    def __post_init__(self) -> None:
        role = self.meta.get("role")
        self.role = role if role in (ROLE_MANAGER, ROLE_SLOT) else ROLE_PLAIN
        if self.role != ROLE_PLAIN and self.traits is PLAIN_TRAITS:
            self.traits = OWN_TRAITS
        # Which run of which job manager this peer belongs to (None for plain ones):
        # the name plus its ``incarnation``, as a job manager restarted under the
        # same ``--name`` must not vouch for the dead processes of the one before.
        name = self.manager_name
        incarnation = self.meta.get("incarnation")
        if name is not None:
            self.manager = f"{name}@{incarnation}" if incarnation else name

    @property
    def manager_name(self) -> str | None:
        """The job manager's name, as shown in the monitor and the trace."""
        if self.role == ROLE_PLAIN:
            return None
        name = self.meta.get("manager")
        return str(name) if name else None


@dataclass(slots=True, eq=False)
class HeldSlot:
    """The attempts that were in flight at a worker process of our job manager when
    the broker lost it, held under that job manager (``job.peer`` is its control
    connection) until it says which one the process was running and which it had
    finished: a process holds several jobs at once (credit, batched REQUESTs), and
    the broker cannot tell which it had started."""

    slot: Peer  # the dropped worker process (its ``meta`` names its pid)
    manager: Peer | None  # the control connection they are held under (None: not here yet)
    deadline: float  # monotonic: past it, nobody said; ``BrokerCore._unsaid`` decides
    attempts: dict[bytes, None] = field(default_factory=dict)  # in dispatch order


class Queue:
    """A named queue: waiting jobs, and the ready peers that serve it by weight.

    ``tiers`` maps weight -> ready peers in rotation order (a dict used as an
    ordered set); ``weights`` is kept sorted high to low. A queue only holds
    waiting jobs while none of its servers has credit, or, once it is ``gated``
    (flow control), while none of them is idle: a worker process of ours that
    holds a job gets no more from a gated queue. A ``ranked`` queue (a job with a
    priority waited in it) prefetches as any: its jobs carry their rank, and a
    worker process of ours runs the best-ranked it holds first.
    """

    __slots__ = (
        "name",
        "pending",
        "pending_bytes",
        "spilled",
        "tiers",
        "weights",
        "servers",
        "in_flight",
        "max_age",
        "ranked",
        "aging",
        "floor",
        "paused",
        "gated",
    )

    def __init__(self, name: str, aging: float = 0.0) -> None:
        self.name = name
        self.pending: deque[Job] | RankedPending[Job] = deque()
        self.pending_bytes = 0  # bodies of the waiting jobs: the memory bound
        self.spilled = 0  # guaranteed jobs waiting on disk only (over the memory bound)
        self.tiers: dict[int, dict[Peer, None]] = {}
        self.weights: list[int] = []
        self.servers: dict[Peer, int] = {}
        self.in_flight = 0
        self.max_age = 0.0  # seconds; older waiting jobs are dropped (0: never)
        # ``pending`` is a RankedPending (priority order) since a job with a priority
        # waited here; ``aging``: EMQ_PRIORITY_AGING (emq_django/broker/priority.py)
        self.ranked = False
        self.aging = aging
        # the lowest priority of a ranked job sent to a worker process of ours: a job
        # outranks one that came before only with a higher one (BrokerCore._overtake;
        # the jobs it got before the queue was ranked carry no rank and run first)
        self.floor = MAX_PRIORITY + 1
        self.paused = False  # the admin's pause (broker/live.py): its jobs wait
        # flow control (broker/flow.py): its jobs go out through ``FlowControl.take``,
        # and, as a ranked queue's, not to a worker process that holds one already
        self.gated = False

    def push(self, job: Job) -> None:
        if job.headers.priority and not self.ranked:
            self.rank()
        self.pending.append(job)
        self.pending_bytes += len(job.body)

    def rank(self) -> None:
        """From now on, dispatch in priority order (the jobs waiting keep theirs)."""
        self.pending = RankedPending(self.aging, self.pending)
        self.ranked = True

    def push_front(self, job: Job) -> None:
        self.pending.appendleft(job)
        self.pending_bytes += len(job.body)

    def pop(self) -> Job:
        job = self.pending.popleft()
        self.pending_bytes -= len(job.body)
        return job

    def add_server(self, peer: Peer, weight: int) -> None:
        self.servers[peer] = weight

    def remove_server(self, peer: Peer) -> None:
        weight = self.servers.pop(peer, None)
        if weight is not None:
            self.unready(peer, weight)

    def ready(self, peer: Peer, weight: int) -> None:
        tier = self.tiers.get(weight)
        if tier is None:
            tier = self.tiers[weight] = {}
            self.weights = sorted(self.tiers, reverse=True)
        tier[peer] = None

    def unready(self, peer: Peer, weight: int) -> None:
        tier = self.tiers.get(weight)
        if tier is not None:
            tier.pop(peer, None)

    def pick(self) -> Peer | None:
        """The ready server with the highest weight, rotating among equals; none
        while the queue is paused."""
        if self.paused:
            return None
        for weight in self.weights:
            tier = self.tiers[weight]
            if tier:
                peer = next(iter(tier))
                if self.gated and peer.inflight and peer.role == ROLE_SLOT:
                    found = next((p for p in tier if not holds_jobs(p)), None)
                    if found is None:
                        continue  # all busy: a gated queue's jobs wait (holds_jobs)
                    peer = found
                del tier[peer]
                tier[peer] = None  # to the back: rotation among equals
                return peer
        return None


def holds_jobs(peer: Peer) -> bool:
    """A worker process of ours that has a job already (running, or held unstarted
    by its credit): a gated queue gives it no more until it is idle. Other peers
    (EventMQ's job managers, Majordomo workers) say READY only for a free worker."""
    return peer.role == ROLE_SLOT and bool(peer.inflight)


def held_worst(peer: Peer, job: Job, queue: Queue, wall_offset: float) -> int:
    """``job`` of the ranked ``queue`` went to the worker process ``peer`` (its
    ``inflight`` has it): the bounds ``Peer.worst`` and ``Queue.floor``. Returns the
    job's rank for the wire (``wire_rank``; it and ``rank_key`` inline: per job)."""
    peer.reorders = True
    priority = job.headers.priority
    if priority < queue.floor:
        queue.floor = priority
    aging = queue.aging
    if aging:
        key = (job.enqueued_at - priority * aging, 0.0)
    else:
        key = (-priority, job.enqueued_at)
    worst = peer.worst
    if worst is None or key > worst or len(peer.inflight) == 1:
        peer.worst = key
    return on_wire(key, aging, wall_offset)


def holder_of_lower(job: Job, queue: Queue, inflight: dict[bytes, Job]) -> Peer | None:
    """Of the worker processes of ours that serve ``queue`` (never EventMQ's or
    Majordomo's peers), one that holds, besides the job it may be running, a job of
    ``queue`` that ``job`` outranks: the one that holds the fewest, None if none
    does. (With two or more held, one at least has not started; the lower one
    found may be the one running, and then ``job`` goes there a little early.)"""
    key = rank_key(job, queue.aging)
    best: Peer | None = None
    for peer in queue.servers:
        held = peer.inflight
        if peer.role != ROLE_SLOT or peer.draining or peer.gone or len(held) < 2:
            continue
        if peer.worst is None or peer.worst <= key:
            continue  # nothing it holds is ranked below ``job``
        if best is not None and len(held) >= len(best.inflight):
            continue
        for attempt_id in held:
            other = inflight.get(attempt_id)
            if (
                other is not None
                and other.queue == queue.name
                and rank_key(other, queue.aging) > key
            ):
                best = peer
                break
    return best
