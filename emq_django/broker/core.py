"""The broker as a pure state machine.

It takes decoded commands with ``now`` (monotonic seconds) and appends the
messages to send to ``self.out`` as ``(socket, identity, frames)``. No sockets,
no clock, no Django: unit-testable and fuzzable on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from emq_django.broker.lifecycle import JobLifecycle
from emq_django.broker.state import (
    ROLE_MANAGER,
    ROLE_PLAIN,
    ROLE_SLOT,
    Job,
    Peer,
    Queue,
)
from emq_django.broker.trace import (
    dispatched_line,
    enqueued_line,
    format_line,
    job_json,
    succeeded_line,
    where_fields,
)
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_failure
from emq_django.protocol.frames import PROTOCOL, answerable_msgid, decode, reply_flags
from emq_django.protocol.limits import (
    MAX_DELAY,
    REFUSAL_CODES,
    REFUSED_BAD_RUN_AFTER,
    REFUSED_BODY_TOO_BIG,
    REFUSED_WRONG_PORT,
    refusal_counter,
)

log = logging.getLogger(__name__)

FRONTEND = 0
BACKEND = 1
MAX_QUEUES = 10_000
EVENTMQ_HEARTBEAT = 3.0  # seconds between the released EventMQ peers' heartbeats
MAX_HELD_SCHEDULES = 10_000

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
    "dropped_malformed",  # too broken to answer: no msgid, or a command nobody awaits
    "partials",  # PARTIALs from workers for attempts in flight
    "partials_forwarded",  # ... sent on to their client (it asked: header ``stream``)
    "stale_partials",  # PARTIALs for no attempt in flight at that peer: dropped
    *(refusal_counter(code) for code in REFUSAL_CODES),  # refused, by the ERROR's code
)
WORKER_LOST = "emq_django.exceptions.WorkerLost"


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


class BrokerCore(JobLifecycle):
    def __init__(
        self,
        config: BrokerConfig,
        now: float,
        id_prefix: bytes | None = None,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.queues: dict[str, Queue] = {}
        self.peers: dict[bytes, Peer] = {}  # backend: job managers and their slots
        self.schedulers: dict[bytes, Peer] = {}  # frontend peers that sent INFORM
        self.managers: dict[str, bytes] = {}  # our job managers: name -> control identity
        self.inflight: dict[bytes, Job] = {}  # attempt id -> job
        # attempts whose worker process is gone, held under its job manager until
        # it says how the process ended (or until this deadline)
        self.held: dict[bytes, float] = {}
        self.done_by_manager: dict[str, int] = {}  # Peer.manager -> attempts finished
        self.held_schedules: list[list[bytes]] = []  # waiting for a scheduler
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.out: list[tuple[int, bytes, list[bytes]]] = []
        # job state changes for the trace log (formatted lines), or None when
        # tracing is off; the server hands them to the writer (server.py)
        self.trace: list[str] | None = None
        self.new_id = IdGenerator(id_prefix)
        self.started_at = now
        self.wall_offset = 0.0  # wall clock minus ``now``, for HEARTBEAT timestamps
        self.next_heartbeat = now + config.heartbeat_interval
        self.next_expiry_check = now + config.heartbeat_interval / 4
        self.stopping = False
        self._error_log_budget = 100
        self.next_housekeeping = now + 60.0
        self._init_lifecycle(seed)

    # ---- entry points -------------------------------------------------------

    def on_frontend(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        try:
            cmd = decode(frames)
            handler = _FRONTEND_HANDLERS.get(type(cmd))
            if handler is None:
                raise ProtocolError(
                    f"{type(cmd).__name__} is not valid from a client", frames, REFUSED_WRONG_PORT
                )
            if self.schedulers:
                scheduler = self.schedulers.get(identity)
                if scheduler is not None:  # any command from a scheduler shows it is alive
                    scheduler.last_seen = now
            handler(self, identity, cmd, now)
        except ProtocolError as exc:
            self._protocol_error("frontend", identity, exc, frames)

    def on_backend(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        try:
            cmd = decode(frames)
            handler = _BACKEND_HANDLERS.get(type(cmd))
            if handler is None:
                raise ProtocolError(
                    f"{type(cmd).__name__} is not valid from a worker", frames, REFUSED_WRONG_PORT
                )
            peer = self.peers.get(identity)
            if peer is not None:
                peer.last_seen = now
            elif type(cmd) is not F.Inform:
                self._unknown_peer(identity, cmd)
                return
            handler(self, identity, cmd, now)
        except ProtocolError as exc:
            self._protocol_error("backend", identity, exc, frames)

    def on_timer(self, now: float) -> None:
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.config.heartbeat_interval
            self._send_heartbeats(now)
        if now >= self.next_expiry_check:
            # a quarter interval: a dead peer is noticed within liveness + 1/4 intervals
            self.next_expiry_check = now + self.config.heartbeat_interval / 4
            self._expire_peers(now)
            if self.held:
                self._expire_held(now)
        if now >= self.delayed.next_due():
            self._release_due(now)
        if now >= self.next_housekeeping:
            self.next_housekeeping = now + 60.0
            self._housekeeping(now)

    def next_deadline(self) -> float:
        return min(
            self.next_heartbeat,
            self.next_expiry_check,
            self.delayed.next_due(),
            self.next_housekeeping,
        )

    def peer_unreachable(self, socket: int, identity: bytes, now: float) -> None:
        """The socket refused to route to ``identity``: that peer is gone."""
        self.counters["unroutable"] += 1
        if socket == BACKEND and identity in self.peers:
            log.warning("job manager %s is unreachable; dropping it", _show(identity))
            self._drop_peer(self.peers[identity], now, "unreachable")
        elif socket == FRONTEND:
            self.schedulers.pop(identity, None)

    def begin_shutdown(self) -> None:
        """DISCONNECT: KBYE to every peer; in-flight work may still finish."""
        if self.stopping:
            return
        self.stopping = True
        for identity in self.peers:
            self.out.append((BACKEND, identity, F.Kbye(self.new_id()).encode()))
        for identity in self.schedulers:
            self.out.append((FRONTEND, identity, F.Kbye(self.new_id()).encode()))

    @property
    def drained(self) -> bool:
        return not self.inflight

    # ---- frontend handlers --------------------------------------------------

    def _client_request(self, identity: bytes, cmd: F.Request, now: float) -> None:
        self.counters["received"] += 1
        queue = self.queues.get(cmd.queue)
        if queue is None:
            queue = self._new_queue(identity, cmd)
            if queue is None:
                return
        if self.stopping:
            self._refuse(identity, cmd.msgid, "shutting-down", "the broker is shutting down")
            return
        refusal = self._check_request(cmd, now)
        if refusal is not None:
            self._refuse(identity, cmd.msgid, *refusal)
            return
        # the ACK goes out after the job: the worker can start a little sooner
        self._accept(identity, cmd, queue, now)

    def _check_request(self, cmd: F.Request, now: float) -> tuple[str, str] | None:
        """(code, reason) if the broker refuses this REQUEST outright, else None."""
        if len(cmd.body) > self.config.max_body_bytes:
            return (
                REFUSED_BODY_TOO_BIG,
                f"the body is {len(cmd.body)} bytes; the most is {self.config.max_body_bytes} "
                "(EMQ_MAX_BODY_BYTES): pass large data by reference (a path, a key)",
            )
        run_after = cmd.headers.run_after
        if run_after and run_after - (now + self.wall_offset) > MAX_DELAY:
            return (
                REFUSED_BAD_RUN_AFTER,
                f"run-after {run_after:.0f} is more than {MAX_DELAY:.0f} s ahead; "
                "use the scheduler for jobs that far out",
            )
        return None

    def _new_queue(self, identity: bytes, cmd: F.Request) -> Queue | None:
        if len(self.queues) >= MAX_QUEUES:
            self._refuse(
                identity,
                cmd.msgid,
                "too-many-queues",
                f"the broker already has {MAX_QUEUES} queues",
            )
            return None
        queue = self.queues[cmd.queue] = Queue(cmd.queue)
        return queue

    def _client_schedule(self, identity: bytes, cmd: F.Schedule, now: float) -> None:
        self._ack(FRONTEND, identity, cmd.msgid)
        frames = cmd.encode()
        if not self.schedulers:
            if len(self.held_schedules) < MAX_HELD_SCHEDULES:
                self.held_schedules.append(frames)
            else:
                log.warning(
                    "no scheduler connected and %d schedules held; dropping %s",
                    MAX_HELD_SCHEDULES,
                    _show(cmd.msgid),
                )
            return
        for sched in self.schedulers:
            self.out.append((FRONTEND, sched, frames))
        self.counters["schedules_forwarded"] += 1

    def _client_publish(self, identity: bytes, cmd: F.Publish, now: float) -> None:
        self._ack(FRONTEND, identity, cmd.msgid)
        self.counters["published"] += 1

    def _frontend_inform(self, identity: bytes, cmd: F.Inform, now: float) -> None:
        if cmd.peer_type != F.PEER_SCHEDULER:
            raise ProtocolError(
                "only schedulers INFORM on the client port; job managers use the worker port",
                [],
                REFUSED_WRONG_PORT,
            )
        self.schedulers[identity] = Peer(
            identity, cmd.peer_type, (), now, cmd.meta, connected_at=now
        )
        log.info("scheduler %s connected", _show(identity))
        self._ack(FRONTEND, identity, cmd.msgid)
        self.out.append((FRONTEND, identity, self._heartbeat(now)))
        held, self.held_schedules = self.held_schedules, []
        for frames in held:
            self.out.append((FRONTEND, identity, frames))

    def _frontend_heartbeat(self, identity: bytes, cmd: F.Heartbeat, now: float) -> None:
        peer = self.schedulers.get(identity)
        if peer is not None:
            peer.last_seen = now

    def _frontend_disconnect(self, identity: bytes, cmd: F.Command, now: float) -> None:
        if self.schedulers.pop(identity, None) is not None:
            log.info("scheduler %s said goodbye", _show(identity))
            if isinstance(cmd, F.Disconnect):
                self.out.append((FRONTEND, identity, F.Kbye(self.new_id()).encode()))

    def _frontend_ignore(self, identity: bytes, cmd: F.Command, now: float) -> None:
        pass

    # ---- backend handlers ---------------------------------------------------

    def _backend_inform(self, identity: bytes, cmd: F.Inform, now: float) -> None:
        if cmd.peer_type != F.PEER_WORKER:
            raise ProtocolError(
                "schedulers INFORM on the client port, not the worker port", [], REFUSED_WRONG_PORT
            )
        old = self.peers.get(identity)
        if old is not None:
            self._drop_peer(old, now, "sent INFORM again")
        queues = cmd.queues or ((10, "default"),)
        peer = Peer(identity, cmd.peer_type, queues, now, cmd.meta, connected_at=now)
        self.peers[identity] = peer
        if peer.role == ROLE_MANAGER and peer.manager:
            self.managers[peer.manager] = identity
        for weight, name in queues:
            queue = self.queues.get(name) or self.queues.setdefault(name, Queue(name))
            queue.add_server(identity, weight)
        if peer.role != ROLE_SLOT:
            log.info(
                "job manager %s connected: queues %s, %s",
                _show(identity),
                ",".join(f"{n}:{w}" for w, n in queues),
                _describe(cmd.meta),
            )
        self._ack(BACKEND, identity, cmd.msgid)
        self.out.append((BACKEND, identity, self._heartbeat(now)))

    def _backend_ready(self, identity: bytes, cmd: F.Ready, now: float) -> None:
        self._credit(self.peers[identity], now)

    def _backend_reply(self, identity: bytes, cmd: F.Reply, now: float) -> None:
        peer = self.peers[identity]
        failed, ready = reply_flags(cmd.status)
        job = self.inflight.get(cmd.request_msgid)
        if job is None or not self._may_answer(peer, job):
            self.counters["stale_replies"] += 1
        elif failed and F.FLAG_REQUEUE in cmd.status.split(b","):
            # a worker process that is going away gives back a job it never started
            del self.inflight[cmd.request_msgid]
            self._release(job)
            self._requeue(job, now)
        else:
            del self.inflight[cmd.request_msgid]
            self.held.pop(cmd.request_msgid, None)
            owner = self._finish(job, now)
            lost = F.reply_lost(cmd.status) if failed else None
            if lost is not None:
                self.counters["worker_lost"] += 1
            final = self._settle(job, failed, cmd.status, now)
            if (
                lost is not None
                and owner is not None
                and owner.identity != identity
                and owner.role == ROLE_SLOT
            ):
                # its job manager says the process is gone: the slot's other jobs
                # never started, and go back to their queue without counting
                self._drop_peer(owner, now, "lost its worker process", verdict=True)
            if final:
                self._answer_client(job, cmd.body, cmd.status, failed)
        if ready:
            self._credit(peer, now)

    def _backend_partial(self, identity: bytes, cmd: F.Partial, now: float) -> None:
        """A partial result of an attempt in flight: counted on the job (its trace
        line says how many), and forwarded to its client only when the client asked
        for partials (header ``stream``, which only our client sends: an EventMQ
        client never receives a PARTIAL). No ACK: the worker does not wait."""
        job = self.inflight.get(cmd.attempt_id)
        if job is None or not self._may_answer(self.peers[identity], job):
            self.counters["stale_partials"] += 1
            return
        job.partials += 1
        self.counters["partials"] += 1
        if job.client is not None and job.headers.stream:
            self.counters["partials_forwarded"] += 1
            forward = F.Partial(self.new_id(), cmd.body, cmd.attempt_id, cmd.seq)
            self.out.append((FRONTEND, job.client, forward.encode()))

    def _answer_client(self, job: Job, body: bytes, status: bytes, failed: bool) -> None:
        if job.client is None:
            return
        if failed and job.cancelled:
            body = encode_failure(CANCELLED, "the job was cancelled while it ran", "")
            status = b"failed,error:" + CANCELLED.encode()
        self.out.append(
            (FRONTEND, job.client, [b"", PROTOCOL, F.REPLY, self.new_id(), body, job.id, status])
        )

    def _backend_heartbeat(self, identity: bytes, cmd: F.Heartbeat, now: float) -> None:
        pass  # last_seen is updated for every command

    def _backend_disconnect(self, identity: bytes, cmd: F.Disconnect, now: float) -> None:
        peer = self.peers[identity]
        peer.draining = True
        self._set_credit(peer, 0)
        self.out.append((BACKEND, identity, F.Kbye(self.new_id()).encode()))
        if not peer.inflight:
            self._drop_peer(peer, now, "said goodbye")

    def _backend_kbye(self, identity: bytes, cmd: F.Kbye, now: float) -> None:
        # a goodbye with jobs in flight gives them back: they go to their queue uncounted
        self._drop_peer(self.peers[identity], now, "said KBYE", verdict=True)

    # ---- dispatch -----------------------------------------------------------

    def _credit(self, peer: Peer, now: float) -> None:
        if peer.draining or self.stopping:
            return
        for _weight, name in peer.queues:  # highest weight first
            queue = self.queues[name]
            if queue.pending:
                self._dispatch(queue.pop(), queue, peer, now, returning=True)
                if queue.spilled:
                    self._check_spill(queue)
                return
            if queue.spilled:
                self._check_spill(queue)  # waiting on disk: read some back
        self._set_credit(peer, peer.credit + 1)

    def _set_credit(self, peer: Peer, credit: int) -> None:
        was, peer.credit = peer.credit, credit
        if was and not credit:
            for weight, name in peer.queues:
                self.queues[name].unready(peer.identity, weight)
        elif credit and not was:
            for weight, name in peer.queues:
                self.queues[name].ready(peer.identity, weight)

    def _dispatch(
        self, job: Job, queue: Queue, peer: Peer, now: float, returning: bool = False
    ) -> None:
        """Send ``job`` to ``peer``. ``returning``: the peer's credit is being
        given back by this very dispatch, so it is not taken."""
        job.attempt += 1
        job.attempt_id = job.id + b"#%d" % job.attempt
        job.peer = peer.identity
        job.manager = peer.manager
        job.dispatched_at = now
        job.partials = 0
        if self.trace is not None:
            self._trace_dispatched(job, now, peer)
        self.inflight[job.attempt_id] = job
        peer.inflight[job.attempt_id] = None
        queue.in_flight += 1
        if not returning:
            self._set_credit(peer, peer.credit - 1)
        self.counters["dispatched"] += 1
        self.out.append(
            (
                BACKEND,
                peer.identity,
                [
                    b"",
                    PROTOCOL,
                    F.REQUEST,
                    job.attempt_id,
                    queue.name.encode(),
                    _reply_always(job.headers.raw),
                    job.body,
                ],
            )
        )

    def _may_answer(self, peer: Peer, job: Job) -> bool:
        if job.peer == peer.identity:
            return True
        # our job manager answers for a slot whose process it had to kill, and a
        # slot that connected again answers under its new identity
        return bool(peer.role != ROLE_PLAIN and peer.manager and peer.manager == job.manager)

    def _release(self, job: Job) -> Peer | None:
        """The attempt is no longer in flight at its peer; returns that peer."""
        self.queues[job.queue].in_flight -= 1
        owner = self.peers.get(job.peer) if job.peer else None
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
        The caller has released it (``in_flight``) already."""
        if self.trace is not None:
            self._trace("requeued", job, now, "PeerLost", peer=lost_from)
        queue = self.queues[job.queue]
        self.counters["requeued"] += 1
        job.peer = None
        target = None if queue.pending else queue.pick()
        if target is not None and not self.stopping:
            self._dispatch(job, queue, self.peers[target], now)
        else:
            queue.push_front(job)

    def _drop_peer(self, peer: Peer, now: float, why: str, verdict: bool = False) -> None:
        """Forget ``peer``. Its in-flight attempts: a slot runs the first and has not
        started the others, which go back to their queue uncounted; the running one
        ended with its process (an attempt that failed: ``_lost``), or waits for its
        job manager's word on how (``verdict``: it came already)."""
        if self.peers.pop(peer.identity, None) is None:
            return
        for weight, name in peer.queues:
            queue = self.queues[name]
            queue.remove_server(peer.identity)
            queue.unready(peer.identity, weight)
        orphans: list[Peer] = []
        if peer.role == ROLE_MANAGER and self.managers.get(peer.manager or "") == peer.identity:
            del self.managers[peer.manager or ""]
            # its worker processes die with it (PDEATHSIG): do not wait for them to expire
            orphans = [p for p in self.peers.values() if p.manager == peer.manager]
            for orphan in orphans:
                self._set_credit(orphan, 0)  # so that nothing is requeued onto them
        lost = [self.inflight.pop(a) for a in peer.inflight if a in self.inflight]
        peer.inflight.clear()
        running: list[Job] = []
        if lost and not verdict:
            # a slot runs one job at a time; our job manager's control connection
            # holds attempts whose processes died; EventMQ's runs one per worker
            running = lost[:1] if peer.role == ROLE_SLOT else lost
        unstarted = lost[len(running) :]
        if peer.role != ROLE_SLOT or lost:
            log.info(
                "job manager %s %s; %d jobs were running, %d go back to their queue",
                _show(peer.identity),
                why,
                len(running),
                len(unstarted),
            )
        for job in unstarted:
            self.queues[job.queue].in_flight -= 1
            self._requeue(job, now, lost_from=peer)
        for job in running:
            self._lost_or_hold(job, peer, now)
        if peer.role == ROLE_MANAGER and peer.manager not in self.managers:
            self.done_by_manager.pop(peer.manager or "", None)
        for orphan in orphans:
            self._drop_peer(orphan, now, f"went with its job manager {peer.manager}")

    def _lost_or_hold(self, job: Job, peer: Peer, now: float) -> None:
        """``job`` was running on ``peer``, which is gone. While its job manager
        lives, the attempt waits for its word (the exit code, the signal); else it
        ends now as a failed attempt."""
        manager = self.peers.get(self.managers.get(peer.manager or "", b""))
        if peer.role == ROLE_SLOT and manager is not None and manager is not peer:
            job.peer = manager.identity
            manager.inflight[job.attempt_id] = None
            self.inflight[job.attempt_id] = job
            self.held[job.attempt_id] = now + self.config.heartbeat_interval * (
                self.config.heartbeat_liveness
            )
            return
        if peer.role == ROLE_SLOT and peer.manager in self.managers:
            detail = "worker process lost"
        else:
            detail = "job manager lost"
        self._lost(job, now, detail)

    def _lost(self, job: Job, now: float, detail: str) -> None:
        """The attempt ended with its process, and nobody can say more: a failed attempt."""
        self.held.pop(job.attempt_id, None)
        self.queues[job.queue].in_flight -= 1
        if job.manager is not None:
            self.done_by_manager[job.manager] = self.done_by_manager.get(job.manager, 0) + 1
        self.counters["worker_lost"] += 1
        log.warning("job %s: %s mid-job", _show(job.id), detail)
        status = F.lost_status(WORKER_LOST, detail)
        if self._settle(job, True, status, now):
            body = encode_failure(WORKER_LOST, f"the job's {detail} mid-job", "")
            self._answer_client(job, body, status, True)

    def _kill_attempt(self, job: Job) -> bool:
        """Ask the job manager running ``job`` to kill its worker process (KILL, an
        extension only our job managers get). False when that cannot be done."""
        owner = self.peers.get(job.peer) if job.peer else None
        if owner is None or owner.role == ROLE_PLAIN:
            return False
        if job.attempt_id in self.held:
            return True  # its process is gone already; its job manager will say so
        control = self.managers.get(owner.manager or "")
        if control is None:
            return False
        self.out.append((BACKEND, control, F.Kill(self.new_id(), job.attempt_id).encode()))
        return True

    def _expire_held(self, now: float) -> None:
        for attempt_id in [a for a, due in self.held.items() if now >= due]:
            del self.held[attempt_id]
            job = self.inflight.pop(attempt_id, None)
            if job is None:
                continue
            owner = self.peers.get(job.peer) if job.peer else None
            if owner is not None:
                owner.inflight.pop(attempt_id, None)
            self._lost(job, now, "worker process lost (its job manager did not say how)")

    # ---- heartbeats ---------------------------------------------------------

    def _send_heartbeats(self, now: float) -> None:
        for identity in self.peers:
            self.out.append((BACKEND, identity, self._heartbeat(now)))
        for identity in self.schedulers:
            self.out.append((FRONTEND, identity, self._heartbeat(now)))

    def _expire_peers(self, now: float) -> None:
        limit = self.config.heartbeat_interval * self.config.heartbeat_liveness
        # EventMQ's peers beat every 3 s whatever we ask: give them their own limit
        plain_limit = max(limit, EVENTMQ_HEARTBEAT * self.config.heartbeat_liveness + 1)
        expired = [
            p
            for p in self.peers.values()
            if now - p.last_seen > (plain_limit if p.role == ROLE_PLAIN else limit)
        ]
        expired.sort(key=lambda p: p.role == ROLE_SLOT)  # managers first: they vouch for slots
        for peer in expired:
            if peer.identity not in self.peers:
                continue  # went with its job manager
            if (
                peer.role == ROLE_SLOT
                and peer.inflight
                and not peer.draining
                and peer.manager in self.managers
            ):
                continue  # busy running a job; its job manager vouches for it
            self.counters["peers_expired"] += 1
            self._drop_peer(peer, now, f"missed {self.config.heartbeat_liveness} heartbeats")
        for identity in [i for i, p in self.schedulers.items() if now - p.last_seen > limit]:
            log.info("scheduler %s missed heartbeats; dropping it", _show(identity))
            del self.schedulers[identity]

    # ---- helpers ------------------------------------------------------------

    def _trace(
        self,
        event: str,
        job: Job,
        now: float,
        error: str = "",
        peer: Peer | None = None,
        extra: float = 0.0,
    ) -> None:
        """Any trace line. The three every job has go through the faster
        ``_trace_enqueued``, ``_trace_dispatched`` and ``_trace_succeeded``.
        Lines are formatted now, not when written: a loop turn that writes
        thousands of events at once would keep the broker from its sockets."""
        assert self.trace is not None
        if peer is None and job.peer is not None:
            peer = self.peers.get(job.peer)
        where = where_fields(job.headers.task, job.queue, self._trace_name(peer))
        self.trace.append(
            format_line(
                event,
                now,
                self.wall_offset,
                job.trace_id or self._trace_id(job),
                job.attempt,
                where,
                error,
                job.enqueued_at,
                job.dispatched_at,
                extra,
                job.partials,
            )
        )

    def _trace_enqueued(self, job: Job, now: float) -> None:
        assert self.trace is not None
        self.trace.append(
            enqueued_line(
                now + self.wall_offset,
                self._trace_id(job),
                job.attempt,
                where_fields(job.headers.task, job.queue, ""),
            )
        )

    def _trace_dispatched(self, job: Job, now: float, peer: Peer) -> None:
        assert self.trace is not None
        job.trace_where = where_fields(job.headers.task, job.queue, self._trace_name(peer))
        self.trace.append(
            dispatched_line(
                now + self.wall_offset,
                job.trace_id or self._trace_id(job),
                job.attempt,
                job.trace_where,
                now - job.enqueued_at,
            )
        )

    def _trace_succeeded(self, job: Job, now: float) -> None:
        """Its job manager is the one it was dispatched to (``trace_where``)."""
        assert self.trace is not None
        if not job.trace_where:  # never dispatched here (no such job yet)
            self._trace("succeeded", job, now)
            return
        self.trace.append(
            succeeded_line(
                now + self.wall_offset,
                job.trace_id or self._trace_id(job),
                job.attempt,
                job.trace_where,
                now - job.dispatched_at,
                now - job.enqueued_at,
                job.partials,
            )
        )

    @staticmethod
    def _trace_id(job: Job) -> str:
        job.trace_id = job_json(job.id)
        return job.trace_id

    @staticmethod
    def _trace_name(peer: Peer | None) -> str:
        """A peer's ``jm`` in the trace: its job manager's name, or its identity."""
        if peer is None:
            return ""
        if peer.trace_name is None:
            peer.trace_name = peer.manager_name or _show(peer.identity)
        return peer.trace_name

    def _heartbeat(self, now: float) -> list[bytes]:
        return [b"", PROTOCOL, F.HEARTBEAT, self.new_id(), b"%.6f" % (now + self.wall_offset)]

    def _ack(self, socket: int, identity: bytes, msgid: bytes) -> None:
        self.counters["acked"] += 1
        self.out.append((socket, identity, [b"", PROTOCOL, F.ACK, self.new_id(), msgid]))

    def _refuse(
        self, identity: bytes, msgid: bytes, code: str, reason: str, socket: int = FRONTEND
    ) -> None:
        self.count_refusal(code)
        log.warning("refused %s: %s", _show(msgid), reason)
        self.out.append((socket, identity, F.Error(self.new_id(), msgid, reason, code).encode()))

    def count_refusal(self, code: str, n: int = 1) -> None:
        """Count ``n`` refusals with ERROR code ``code`` (also those the server makes)."""
        self.counters["refused"] += n
        name = refusal_counter(code)
        self.counters[name] = self.counters.get(name, 0) + n

    def _unknown_peer(self, identity: bytes, cmd: F.Command) -> None:
        # A job manager from before a broker restart, or one dropped as silent. No
        # answer: it hears no heartbeats from us and INFORMs again (ours after
        # liveness intervals, EventMQ's after 15 s). EventMQ's ignores KBYE, and
        # any message would reset its reconnect timer.
        self.counters["unknown_peer"] += 1
        if isinstance(cmd, F.Reply):
            self.counters["stale_replies"] += 1

    def _protocol_error(
        self, where: str, identity: bytes, exc: ProtocolError, frames: Sequence[bytes] = ()
    ) -> None:
        """A message ``decode()`` or a handler refused: answer it with an ERROR when
        it names a msgid its sender waits on, else drop it. Counted either way, and
        logged (the first 100, then every 10,000th: a flood must not flood the log)."""
        self.counters["protocol_errors"] += 1
        n = self.counters["protocol_errors"]
        msgid = answerable_msgid(frames, where)
        if msgid is not None:
            reason = exc.reason[:1024]
            self.count_refusal(exc.code)
            socket = FRONTEND if where == "frontend" else BACKEND
            self.out.append(
                (socket, identity, F.Error(self.new_id(), msgid, reason, exc.code).encode())
            )
        else:
            self.counters["dropped_malformed"] += 1
        if self._error_log_budget > 0 or n % 10_000 == 0:
            self._error_log_budget -= 1
            log.warning(
                "%s a malformed message on the %s port from %s: %s (%d so far)",
                "refused" if msgid is not None else "dropped",
                where,
                _show(identity),
                exc,
                n,
            )


@lru_cache(maxsize=1024)
def _reply_always(raw: bytes) -> bytes:
    """Headers as sent to a job manager: always ask for the REPLY.

    EventMQ's job manager sends no REPLY without ``reply-requested``, and the
    broker needs one to know the job finished; it forwards the REPLY to the
    client only when the client asked for it.
    """
    flags = raw.split(b",") if raw else []
    return raw if b"reply-requested" in flags else b",".join([b"reply-requested", *flags])


CANCELLED = "emq_django.exceptions.Cancelled"


def _show(identity: bytes) -> str:
    if identity.isascii() and identity.isalnum() or identity[:1].isalpha():
        return identity.decode("ascii", "replace")
    return identity.hex()


def _describe(meta: dict[str, object]) -> str:
    return " ".join(f"{k}={meta[k]}" for k in ("host", "pid", "concurrency") if k in meta)


_Handler = Callable[[BrokerCore, bytes, Any, float], None]
_FRONTEND_HANDLERS: dict[type, _Handler] = {
    F.Request: BrokerCore._client_request,
    F.Schedule: BrokerCore._client_schedule,
    F.Unschedule: BrokerCore._client_schedule,
    F.Publish: BrokerCore._client_publish,
    F.Inform: BrokerCore._frontend_inform,
    F.Heartbeat: BrokerCore._frontend_heartbeat,
    F.Disconnect: BrokerCore._frontend_disconnect,
    F.Kbye: BrokerCore._frontend_disconnect,
    F.Ack: BrokerCore._frontend_ignore,
}
_BACKEND_HANDLERS: dict[type, _Handler] = {
    F.Inform: BrokerCore._backend_inform,
    F.Ready: BrokerCore._backend_ready,
    F.Reply: BrokerCore._backend_reply,
    F.Partial: BrokerCore._backend_partial,
    F.Heartbeat: BrokerCore._backend_heartbeat,
    F.Disconnect: BrokerCore._backend_disconnect,
    F.Kbye: BrokerCore._backend_kbye,
    F.Ack: BrokerCore._frontend_ignore,
}
