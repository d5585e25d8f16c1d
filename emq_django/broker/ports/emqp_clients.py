"""eMQP/1.0 clients and schedulers (the frontend, EventMQ's port 47291).

Clients send REQUEST, SCHEDULE, UNSCHEDULE and PUBLISH and get ACK, ERROR and
REPLY; schedulers INFORM here and get the schedules forwarded to them. The
frames are EventMQ 0.3.13's (specs/WIRE-NOTES.md, docs/eventmq-wire.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from emq_django.broker.effects import (
    Acknowledge,
    Answer,
    Beat,
    ClientRef,
    Effect,
    Forget,
    Forward,
    Goodbye,
    Refuse,
)
from emq_django.broker.ports.base import NEVER, Port
from emq_django.broker.state import Peer
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import frames as F
from emq_django.protocol.batch import REQUESTS, ack_id, decode_jobs, encode_packed_ack
from emq_django.protocol.limits import REFUSED_WRONG_PORT
from emq_django.security.roles import CLIENT, SCHEDULER
from emq_django.transport import SocketOptions

FRONTEND_HWM = 100_000  # ACKs and REPLYs waiting for a slow client
MAX_CLIENTS_KEPT = 100_000  # ClientRefs cached by identity
_encode_ack = F.encode_ack  # frames are built in protocol/ only
# How long a lazy ACK (``Acknowledge.lazy``) may wait for its job's reply, to go in
# the same turn: a client waiting on a quick job then wakes once, not once for the
# ACK and again for the REPLY (on 2 cores the ACK's wake-up competed with the worker
# running the job). A job that takes longer is acknowledged after this (1-2 ms: the
# loop's poll counts whole milliseconds). Not longer: while its ACK is out, our
# client holds its next sends to go together (REQUESTS, up to 2 ms), as it does
# when the broker is behind.
ACK_DELAY = 0.001  # seconds


class EmqpClientPort(Port):
    name = "frontend"
    roles = (CLIENT, SCHEDULER)

    def __init__(self, core: Any, address: str = "", ids: IdGenerator | None = None) -> None:
        super().__init__(core, address)
        self.new_id = ids or IdGenerator()
        self.clients: dict[bytes, ClientRef] = {}
        self.schedulers: dict[bytes, Peer] = {}
        # the outbox: ACKs for clients that read several msgids per ACK
        # (``ClientRef.acks``), one message per client per batch instead of one per
        # job; lazy ones wait in ``_late`` across turns, until a message to that
        # client goes or ACK_DELAY after the first (``_late_due``)
        self._acks: dict[ClientRef, list[bytes]] = {}
        self._late: dict[ClientRef, list[bytes]] = {}
        self._late_due = NEVER

    def socket_options(self) -> SocketOptions:
        return SocketOptions(sndhwm=FRONTEND_HWM, router_mandatory=True)

    def client(self, identity: bytes) -> ClientRef:
        ref = self.clients.get(identity)
        if ref is None:
            if len(self.clients) >= MAX_CLIENTS_KEPT:
                self.clients.clear()  # refs are cheap to make again
            ref = self.clients[identity] = ClientRef(self, identity)
        return ref

    # ---- in -------------------------------------------------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        try:
            if len(frames) == 7:  # a REQUEST, most likely: straight to the core
                fields = F.request_fields(frames)
                if fields is not None:
                    if self.schedulers:
                        scheduler = self.schedulers.get(identity)
                        if scheduler is not None:
                            scheduler.last_seen = now
                    ref = self.clients.get(identity) or self.client(identity)
                    if fields[1].acks:
                        ref.acks = True
                    msgid = frames[3]
                    self.core.client_request(ref, msgid, fields[0], fields[1], frames[6], now)
                    return None
            if len(frames) > 2 and frames[2] == REQUESTS:  # decode_jobs checks the rest
                self._requests(identity, frames, now)
                return None
            cmd = F.decode(frames)
            handler = _HANDLERS.get(type(cmd))
            if handler is None:
                raise ProtocolError(
                    f"{type(cmd).__name__} is not valid from a client", frames, REFUSED_WRONG_PORT
                )
            if self.schedulers:
                scheduler = self.schedulers.get(identity)
                if scheduler is not None:  # any command from a scheduler shows it is alive
                    scheduler.last_seen = now
            return handler(self, identity, cmd, now)
        except ProtocolError as exc:
            self.malformed(identity, exc, frames)
        return None

    def authorize(self, socket: str, roles: frozenset[str], frames: Sequence[bytes]) -> str | None:
        """Only a scheduler key INFORMs (joins as a scheduler); clients and
        schedulers both send jobs."""
        command = frames[2] if len(frames) > 2 else b""
        if command == F.INFORM:
            return None if SCHEDULER in roles else "INFORM needs the scheduler role"
        return None if roles & {CLIENT, SCHEDULER} else "needs the client role"

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None:
        msgid = F.answerable_msgid(frames, "frontend")
        if msgid is not None:
            self.core.refuse(self.client(identity), msgid, "forbidden", reason, quiet=True)
        return None

    def malformed(self, identity: bytes, exc: ProtocolError, frames: Sequence[bytes]) -> None:
        """Answer it with an ERROR when it names a msgid its sender waits on, else
        drop it; counted and logged either way."""
        msgid = F.answerable_msgid(frames, "frontend")
        if msgid is not None:
            self.core.refuse(self.client(identity), msgid, exc.code, exc.reason[:1024], quiet=True)
        self.count_malformed(identity, exc, answered=msgid is not None)

    def _request(self, identity: bytes, cmd: F.Request, now: float) -> None:
        ref = self.client(identity)
        if cmd.headers.acks:
            ref.acks = True
        self.core.client_request(ref, cmd.msgid, cmd.queue, cmd.headers, cmd.body, now)

    def _requests(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        """Several REQUESTs in one message (our client's, protocol/batch.py): each
        job as if it came alone, in order. A malformed message raises
        ``ProtocolError`` before any of its jobs is taken; a job whose queue name
        or headers are bad is refused on its own (an ERROR naming its msgid)."""
        jobs = decode_jobs(frames)
        if self.schedulers:
            scheduler = self.schedulers.get(identity)
            if scheduler is not None:
                scheduler.last_seen = now
        ref = self.clients.get(identity) or self.client(identity)
        ref.acks = ref.packed = True  # only our client sends REQUESTS
        request = self.core.client_request
        self.carried += len(jobs) - 1
        for msgid, queue, headers, body in jobs:
            try:
                name, parsed = F.job_fields(queue, headers, frames)
            except ProtocolError as exc:
                self.core.refuse(ref, msgid, exc.code, exc.reason[:1024], quiet=True)
                self.count_malformed(identity, exc, answered=True)
                continue
            request(ref, msgid, name, parsed, body, now)

    def _schedule(self, identity: bytes, cmd: F.Schedule, now: float) -> None:
        self.core.client_schedule(self.client(identity), cmd.msgid, cmd, now)

    def _publish(self, identity: bytes, cmd: F.Publish, now: float) -> None:
        self.core.client_publish(self.client(identity), cmd.msgid, now)

    def _inform(self, identity: bytes, cmd: F.Inform, now: float) -> None:
        if cmd.peer_type != F.PEER_SCHEDULER:
            raise ProtocolError(
                "only schedulers INFORM on the client port; job managers use the worker port",
                [],
                REFUSED_WRONG_PORT,
            )
        peer = Peer(identity, cmd.peer_type, (), now, cmd.meta, connected_at=now, port=self)
        self.schedulers[identity] = peer
        self.core.scheduler_join(peer, self.client(identity), cmd.msgid, now)

    def _heartbeat(self, identity: bytes, cmd: F.Heartbeat, now: float) -> list[bytes] | None:
        """A scheduler's last_seen is updated for every command. A client's HEARTBEAT
        (our client sends one on each new connection) is answered with this broker's
        incarnation: a new one has lost the plain jobs the one before had."""
        if identity in self.schedulers:
            return None
        return F.encode_incarnation(self.core.incarnation, now + self.core.wall_offset)

    def _goodbye(self, identity: bytes, cmd: F.Command, now: float) -> None:
        peer = self.schedulers.get(identity)
        if peer is not None:
            self.core.scheduler_leave(peer, now, answer=isinstance(cmd, F.Disconnect))

    def _ignore(self, identity: bytes, cmd: F.Command, now: float) -> None:
        pass

    def known_peers(self) -> dict[bytes, Peer]:
        return self.schedulers

    # ---- out ------------------------------------------------------------------------

    def post(self, to: Any, effect: Effect) -> None:
        late = self._late
        if type(effect) is Acknowledge and to.acks:  # it goes in an ACK of several
            if effect.lazy:
                held = late.get(to)
                if held is None:
                    if not late:
                        self._late_due = self.outlet.clock() + ACK_DELAY
                    late[to] = [effect.msgid]
                else:
                    held.append(effect.msgid)
                return
            if late and to in late:  # what this client gets keeps its order
                self._take_late(to)
            held = self._acks.get(to)
            if held is None:
                self._acks[to] = [effect.msgid]
            else:
                held.append(effect.msgid)
            return
        if late and to in late:
            self._take_late(to)
        if self._acks and to in self._acks:
            self._send_acks(to, self._acks.pop(to))
        frames = self.encode(effect)
        if frames is not None:
            self.to_peer(to.identity, frames)

    def _take_late(self, to: ClientRef) -> None:
        earlier = self._late.pop(to)
        held = self._acks.get(to)
        if held is None:
            self._acks[to] = earlier
        else:
            held += earlier

    def flush(self, last: bool = False) -> float:
        """The batch's ACKs, one per client; the lazy ones too once due."""
        if self._late and (last or self.outlet.clock() >= self._late_due):
            for ref in list(self._late):
                self._take_late(ref)
            self._late_due = NEVER
        if self._acks:
            acks, self._acks = self._acks, {}
            for ref, msgids in acks.items():
                self._send_acks(ref, msgids)
        return self._late_due if self._late else NEVER

    def _send_acks(self, ref: ClientRef, msgids: list[bytes]) -> None:
        """One ACK naming ``msgids`` to a client that reads several per ACK."""
        self.to_peer(ref.identity, self.encode_acks(msgids, ref.packed))

    def encode(self, effect: Effect) -> list[bytes] | None:
        kind = type(effect)
        e: Any = effect  # one of the effect types, told apart by ``kind``
        if kind is Acknowledge:
            return _encode_ack(self.new_id(), e.msgid)
        if kind is Answer:
            return self._answer(e)
        if kind is Refuse:
            return F.Error(self.new_id(), e.msgid, e.reason, e.code).encode()
        if kind is Beat:
            return F.encode_heartbeat(self.new_id(), e.wall)
        if kind is Forward:
            payload: F.Schedule = e.payload
            return payload.encode()
        if kind is Goodbye:
            return F.Kbye(self.new_id()).encode()
        if kind is Forget:
            self.forget(e.peer)
        return None

    def encode_acks(self, msgids: list[bytes], packed: bool = False) -> list[bytes]:
        """One ACK for ``msgids``, to a client that reads several per ACK (``acks``);
        ``packed``: one that sent REQUESTS, which reads them in one frame."""
        # MARK: this broker reads REQUESTS (several jobs a message) from such a client;
        # then its incarnation: the client finds a restarted broker (protocol/batch.py)
        ack = ack_id(self.core.incarnation, self.new_id())
        if len(msgids) == 1:
            return _encode_ack(ack, msgids[0])
        if packed:
            frames = encode_packed_ack(ack, msgids)
            if frames is not None:
                return frames
        return F.encode_acks(ack, msgids)

    def _answer(self, effect: Answer) -> list[bytes] | None:
        if not effect.final:  # the core sends these only to clients that asked (``stream``)
            return F.Partial(self.new_id(), effect.body, effect.job.attempt_id, effect.seq).encode()
        outcome = effect.outcome
        status = outcome.raw or F.status_frame(
            outcome.failed, outcome.error, outcome.lost, outcome.retry
        )
        return F.encode_reply(self.new_id(), effect.body, effect.job.id, status)


_Handler = Callable[[EmqpClientPort, bytes, Any, float], list[bytes] | None]
_HANDLERS: dict[type, _Handler] = {
    F.Request: EmqpClientPort._request,
    F.Schedule: EmqpClientPort._schedule,
    F.Unschedule: EmqpClientPort._schedule,
    F.Publish: EmqpClientPort._publish,
    F.Inform: EmqpClientPort._inform,
    F.Heartbeat: EmqpClientPort._heartbeat,
    F.Disconnect: EmqpClientPort._goodbye,
    F.Kbye: EmqpClientPort._goodbye,
    F.Ack: EmqpClientPort._ignore,
}
