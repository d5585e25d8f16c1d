"""eMQP/1.0 job managers (the backend, EventMQ's port 47290).

EventMQ's job managers (one connection each) and ours (a control connection plus
one per worker process) INFORM here, give credit with READY (or with a REPLY
flagged ``ready``), run REQUESTs and answer with REPLY. Only our job managers'
control connections ever receive KILL, and only our worker processes, which
ask for it, get several jobs per REQUEST and answer several per REPLY
(extensions, docs/eventmq-wire.md §7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from emq_django.broker.effects import (
    Acknowledge,
    Beat,
    ClientRef,
    Deliver,
    Effect,
    Forget,
    Goodbye,
    Kill,
    Outcome,
    Refuse,
    Resize,
    Stop,
)
from emq_django.broker.ports.base import NEVER, Port
from emq_django.broker.state import Peer
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import frames as F
from emq_django.protocol.batch import REPLIES, decode_replies, requests_frames
from emq_django.protocol.batch import job_record as _job_record
from emq_django.protocol.limits import REFUSED_WRONG_PORT
from emq_django.security.roles import WORKER

DEFAULT_QUEUES = ((10, "default"),)
_encode_request = F.encode_request  # frames are built in protocol/ only


@lru_cache(maxsize=4096)
def outcome_of(status: bytes) -> Outcome:
    """A REPLY's status frame as an ``Outcome`` (cached: a few statuses repeat)."""
    failed, ready = F.reply_flags(status)
    if not failed:
        return Outcome(False, ready, raw=status)
    tokens = status.split(b",")
    return Outcome(
        True,
        ready,
        error=F.reply_error(status),
        retry=F.reply_retry(status),
        lost=F.reply_lost(status),
        requeue=F.FLAG_REQUEUE in tokens,
        raw=status,
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


def _headers(e: Deliver) -> bytes:
    """A delivery's headers: ``reply-requested`` always, and a ranked queue's job's
    rank (to a worker process of ours)."""
    headers = _reply_always(e.job.headers.raw)
    return headers if e.rank is None else b"%s,rank:%d" % (headers, e.rank)


class EmqpWorkerPort(Port):
    name = "backend"
    roles = (WORKER,)

    def __init__(self, core: Any, address: str = "", ids: IdGenerator | None = None) -> None:
        super().__init__(core, address)
        self.new_id = ids or IdGenerator()
        self.peers: dict[bytes, Peer] = {}
        # the outbox: jobs for workers that take several per REQUEST (``Peer.batch``),
        # one message per worker per batch instead of one per job
        self._deliveries: dict[Peer, list[Deliver]] = {}

    # ---- in -------------------------------------------------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        # the hot path: a well-formed REPLY or READY from a known peer goes straight
        # to the core, with no command object; ``decode`` handles everything else
        n = len(frames)
        if (
            (n == 7 or n == 4)
            and not frames[0]
            and frames[1] == F.PROTOCOL
            and 0 < len(frames[3]) <= F.MAX_ID_LENGTH
        ):
            peer = self.peers.get(identity)
            if peer is not None and not peer.gone:
                command = frames[2]
                if n == 7 and command == F.REPLY and len(frames[6]) <= F.MAX_STATUS_LENGTH:
                    peer.last_seen = now
                    outcome = outcome_of(frames[6])
                    self.core.worker_result(peer, frames[5], outcome, frames[4], now)
                    return None
                if n == 4 and command == F.READY:
                    peer.last_seen = now
                    self.core.worker_ready(peer, now)
                    return None
        elif n == 5 and frames[2] == F.READY and not frames[0] and frames[1] == F.PROTOCOL:
            # a READY giving several credits (the "batch" extension), from a peer
            # that announced it; from anybody else it is malformed (decode says so)
            peer = self.peers.get(identity)
            if peer is not None and peer.batch > 1 and not peer.gone:
                count = F.ready_count(frames[4])
                if count and 0 < len(frames[3]) <= F.MAX_ID_LENGTH:
                    peer.last_seen = now
                    self.core.worker_credit(peer, count, now)
                    return None
        elif n > 7 and frames[2] == F.REPLY:
            # several answers in one REPLY (the "batch" extension), from a peer that
            # announced it: each one as if it came alone
            peer = self.peers.get(identity)
            answers = F.split_batch(frames) if peer is not None and peer.batch > 1 else None
            if answers is not None and all(
                len(a[6]) <= F.MAX_STATUS_LENGTH and 0 < len(a[5]) <= F.MAX_ID_LENGTH
                for a in answers
            ):
                for answer in answers:
                    self.handle(identity, answer, now)
                return None
        try:
            if n == 5 and frames[2] == REPLIES:  # answers packed (from anybody else: malformed)
                peer = self.peers.get(identity)
                if peer is not None and peer.packed_replies and not peer.gone:
                    self._replies(peer, frames, now)
                    return None
            cmd = F.decode(frames)
            handler = _HANDLERS.get(type(cmd))
            if handler is None:
                raise ProtocolError(
                    f"{type(cmd).__name__} is not valid from a worker", frames, REFUSED_WRONG_PORT
                )
            peer = self.peers.get(identity)
            if peer is not None and not peer.gone:
                peer.last_seen = now
                handler(self, peer, cmd, now)
            elif type(cmd) is F.Inform:
                self._inform(identity, cmd, now)
            else:
                self.core.unknown_worker(replied=type(cmd) is F.Reply)
        except ProtocolError as exc:
            msgid = F.answerable_msgid(frames, "backend")
            if msgid is not None:
                ref = ClientRef(self, identity)
                self.core.refuse(ref, msgid, exc.code, exc.reason[:1024], quiet=True)
            self.count_malformed(identity, exc, answered=msgid is not None)
        return None

    def _replies(self, peer: Peer, frames: Sequence[bytes], now: float) -> None:
        """A REPLIES: each answer as if it came in a REPLY of its own; ``ProtocolError``
        (none taken) when it is malformed anywhere, as for a REPLY of several."""
        answers = decode_replies(frames)
        peer.last_seen = now
        result = self.core.worker_result
        for ref, status, body in answers:
            if peer.gone:  # (an answer made the broker drop it: the rest are not its)
                break
            result(peer, ref, outcome_of(status), body, now)

    def _inform(self, identity: bytes, cmd: F.Inform, now: float) -> None:
        if cmd.peer_type != F.PEER_WORKER:
            raise ProtocolError(
                "schedulers INFORM on the client port, not the worker port", [], REFUSED_WRONG_PORT
            )
        old = self.peers.get(identity)
        if old is not None:
            self.core.worker_gone(old, now, "sent INFORM again")
        queues = cmd.queues or DEFAULT_QUEUES
        peer = Peer(identity, cmd.peer_type, queues, now, cmd.meta, connected_at=now, port=self)
        peer.batch = F.batch_of(cmd.meta)  # several jobs per REQUEST, answers per REPLY
        peer.packed = F.packs(cmd.meta)  # ... as one REQUESTS
        peer.packed_replies = F.packs_replies(cmd.meta)  # its answers as one REPLIES
        self.peers[identity] = peer
        self.core.worker_join(peer, now, ClientRef(self, identity), cmd.msgid)

    def _inform_again(self, peer: Peer, cmd: F.Inform, now: float) -> None:
        self._inform(peer.identity, cmd, now)

    def _ready(self, peer: Peer, cmd: F.Ready, now: float) -> None:
        self.core.worker_ready(peer, now)

    def _reply(self, peer: Peer, cmd: F.Reply, now: float) -> None:
        self.core.worker_result(peer, cmd.request_msgid, outcome_of(cmd.status), cmd.body, now)

    def _partial(self, peer: Peer, cmd: F.Partial, now: float) -> None:
        self.core.worker_partial(peer, cmd.attempt_id, cmd.body, now, seq=cmd.seq)

    def _ended(self, peer: Peer, cmd: F.Ended, now: float) -> None:
        self.core.worker_ended(peer, cmd.pid, cmd.how, now)

    def _heartbeat(self, peer: Peer, cmd: F.Heartbeat, now: float) -> None:
        # last_seen is updated for every command; our job manager's memory, now
        # and then (protocol/memory_report.py): the last one is kept for the monitor
        if cmd.memory is not None:
            peer.memory = cmd.memory

    def _disconnect(self, peer: Peer, cmd: F.Disconnect, now: float) -> None:
        self.core.worker_disconnect(peer, now)

    def _kbye(self, peer: Peer, cmd: F.Kbye, now: float) -> None:
        self.core.worker_goodbye(peer, now)

    def _ignore(self, peer: Peer, cmd: F.Command, now: float) -> None:
        pass

    def known_peers(self) -> dict[bytes, Peer]:
        return self.peers

    # ---- out ------------------------------------------------------------------------

    def post(self, to: Any, effect: Effect) -> None:
        deliveries = self._deliveries
        if type(effect) is Deliver and to.batch > 1:  # it goes in a REQUEST of several
            held = deliveries.get(to)
            if held is None:
                deliveries[to] = [effect]
            else:
                held.append(effect)
            return
        if deliveries and to in deliveries:  # what this worker gets keeps its order
            self._send_deliveries(to, deliveries.pop(to))
        frames = self.encode(effect)
        if frames is not None:
            self.to_peer(to.identity, frames)

    def flush(self, last: bool = False) -> float:
        """The batch's jobs for workers that take several per REQUEST."""
        if self._deliveries:
            deliveries, self._deliveries = self._deliveries, {}
            for peer, effects in deliveries.items():
                self._send_deliveries(peer, effects)
        return NEVER

    def _send_deliveries(self, peer: Peer, effects: list[Deliver]) -> None:
        """The jobs of ``effects`` to a worker that takes several per REQUEST,
        ``peer.batch`` at most per message (eMQP's "batch" extension)."""
        size = peer.batch
        for start in range(0, len(effects), size):
            chunk = effects[start : start + size]
            frames: Any = self._packed(chunk) if peer.packed and len(chunk) > 1 else None
            if frames is None:
                requests: Any = [self.encode(e) for e in chunk]
                frames = (
                    F.join_requests(requests[0], requests[1:]) if len(requests) > 1 else requests[0]
                )
            if not self.to_peer(peer.identity, frames):
                return

    def _packed(self, chunk: list[Deliver]) -> list[bytes] | None:
        """``chunk``'s jobs as one REQUESTS (protocol/batch.py: a record per job, in one
        frame), for a worker that announced it; None when a field is too long for a
        record (the jobs go as a REQUEST of four frames each)."""
        parts: list[bytes] = []
        try:
            for e in chunk:
                job = e.job
                parts += _job_record(job.attempt_id, job.queue.encode(), _headers(e), job.body)
        except ValueError:
            return None
        return requests_frames(self.new_id(), b"".join(parts))

    def encode(self, effect: Effect) -> list[bytes] | None:
        kind = type(effect)
        e: Any = effect  # one of the effect types, told apart by ``kind``
        if kind is Deliver:
            job = e.job
            return _encode_request(job.attempt_id, job.queue.encode(), _headers(e), job.body)
        if kind is Beat:
            return F.encode_heartbeat(self.new_id(), e.wall)
        if kind is Acknowledge:
            frames = F.encode_ack(self.new_id(), e.msgid)
            peer = self.peers.get(e.client.identity)
            if peer is not None and peer.batch > 1:
                frames.append(F.batch_ack_frame(peer.batch))  # its INFORM's: batches welcome
                if peer.packed_replies:
                    frames.append(F.PACKED_REPLIES_ACK)  # ... and its REPLIES read
            return frames
        if kind is Goodbye:
            return F.Kbye(self.new_id()).encode()
        if kind is Kill:
            return F.Kill(self.new_id(), e.attempt_id).encode()
        if kind is Stop:
            return F.Stop(self.new_id()).encode()
        if kind is Resize:
            return F.Resize(self.new_id(), e.concurrency).encode()
        if kind is Refuse:
            return F.Error(self.new_id(), e.msgid, e.reason, e.code).encode()
        if kind is Forget:
            self.forget(e.peer)
        return None


_Handler = Callable[[EmqpWorkerPort, Peer, Any, float], None]
_HANDLERS: dict[type, _Handler] = {
    F.Inform: EmqpWorkerPort._inform_again,
    F.Ready: EmqpWorkerPort._ready,
    F.Reply: EmqpWorkerPort._reply,
    F.Partial: EmqpWorkerPort._partial,
    F.Ended: EmqpWorkerPort._ended,
    F.Heartbeat: EmqpWorkerPort._heartbeat,
    F.Disconnect: EmqpWorkerPort._disconnect,
    F.Kbye: EmqpWorkerPort._kbye,
    F.Ack: EmqpWorkerPort._ignore,
}
