"""Majordomo with PARTIAL/FINAL (``EMQ_MDP_BIND``): clients and workers on one port.

Both framings of ``protocol/mdp.py`` are accepted, each peer answered in its own:
majortomo 0.2.0's (a leading empty frame; replies carry no request id, so one
request at a time per client) and the draft's (request ids; several requests
outstanding per client; PING/PONG).

A Majordomo service is an emq queue: a Majordomo client's request is a job on the
queue of that name, served by Majordomo workers and by our (and EventMQ's) job
managers alike, and a Majordomo worker serves the jobs of its service whoever
sent them. A job from here is ``reply-requested`` and retried after up to
``GUARANTEED_DEATH_RETRIES`` failures or worker deaths (Majordomo has no retry
setting, and a request whose worker died is resent to another). Its body is the
first request frame; further frames travel with it to Majordomo workers (an eMQP
job manager gets the first frame only).

A Majordomo worker is a peer with one slot: READY gives it credit, each FINAL
gives it back. A busy Majordomo worker sends no heartbeats, so it is not expired
for its silence while it works; a killed one is noticed by the next heartbeat the
broker sends it (every ``EMQ_HEARTBEAT_INTERVAL``), which its socket can no
longer route (ROUTER_MANDATORY). Its request is an attempt that failed and goes
to another worker.

Answers: a result is a FINAL with the body frames; an error (a refusal, a
cancelled or failed job) a FINAL whose one frame is emq's JSON failure body.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from emq_django.broker.effects import (
    OK_READY,
    Answer,
    Beat,
    ClientRef,
    Deliver,
    Effect,
    Forget,
    Goodbye,
    Refuse,
)
from emq_django.broker.ports.base import Port
from emq_django.broker.state import PLAIN_TRAITS, Peer
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import mdp
from emq_django.protocol.body import encode_failure
from emq_django.protocol.headers import Headers, format_headers, parse_headers
from emq_django.protocol.limits import GUARANTEED_DEATH_RETRIES
from emq_django.security.roles import CLIENT, WORKER

log = logging.getLogger(__name__)

PEER_MDP = "mdp"
WORKER_WEIGHT = 10
JOB_REFUSED = "emq_django.exceptions.JobRefused"
MAX_CLIENTS_KEPT = 100_000
_HEADERS: Headers = parse_headers(
    format_headers(reply_requested=True, retry_count=GUARANTEED_DEATH_RETRIES)
)


# a Majordomo worker says nothing while it works; as a one-connection peer it
# keeps the plain peers' other traits
MDP_TRAITS = replace(PLAIN_TRAITS, silent_when_busy=True)


class MajordomoPort(Port):
    name = "majordomo"
    roles = (CLIENT, WORKER)
    always_streams = True  # PARTIAL/FINAL: every client takes partials
    acknowledges = False  # Majordomo has no ACK

    def __init__(self, core: Any, address: str = "", ids: IdGenerator | None = None) -> None:
        super().__init__(core, address)
        self.new_id = ids or IdGenerator()
        self.workers: dict[bytes, Peer] = {}

    # ---- in -------------------------------------------------------------------------

    def authorize(self, socket: str, roles: frozenset[str], frames: Sequence[bytes]) -> str | None:
        """Worker commands need the worker role, client requests the client role."""
        header = (frames[0] or (frames[1] if len(frames) > 1 else b"")) if frames else b""
        if header == mdp.WORKER and WORKER not in roles:
            return "Majordomo worker commands need the worker role"
        if header == mdp.CLIENT and CLIENT not in roles:
            return "Majordomo requests need the client role"
        return None

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None:
        """A client request the key's roles do not allow: a FINAL with the reason
        (a worker command: nothing, as before)."""
        try:
            message = mdp.decode(frames)
        except mdp.BadRequest as exc:
            framing, service, request_id = exc.framing, exc.service, exc.request_id
        except ProtocolError:
            return None
        else:
            if type(message) is not mdp.ClientRequest:
                return None
            framing, request_id = message.framing, message.request_id
            service = message.service.encode()
        refused = mdp.BadRequest(reason, frames, "forbidden", framing, service, request_id)
        return self._refusal(refused, reason, counted=True)  # (the guard counted it)

    def _refusal(self, exc: mdp.BadRequest, reason: str, counted: bool = False) -> list[bytes]:
        """A refused REQUEST's FINAL: emq's failure body, as for any refused job."""
        if not counted:
            self.core.count_refusal(exc.code)
        body = encode_failure(JOB_REFUSED, f"{exc.code}: {reason}", "")
        return mdp.client_refusal(exc, body)

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        try:
            message = mdp.decode(frames)
        except mdp.BadRequest as exc:
            self.count_malformed(identity, exc, answered=True)
            return self._refusal(exc, exc.reason)
        except ProtocolError as exc:
            self.count_malformed(identity, exc, answered=False)
            return None
        kind = type(message)
        if kind is mdp.ClientRequest:
            self._request(identity, message, now)  # type: ignore[arg-type]
            return None
        worker = self.workers.get(identity)
        if worker is not None and worker.gone:
            worker = None
        if kind is mdp.WorkerReady:
            if worker is not None:  # "the worker MUST NOT send a further READY"
                self._bad_worker(worker, "sent READY again", now)
                return None
            self._ready(identity, message, now)  # type: ignore[arg-type]
            return None
        if worker is None:
            # not (or no longer) a worker here: tell it to start again
            self.core.unknown_worker(replied=kind is mdp.WorkerReply)
            return mdp.worker_disconnect(message.framing)
        worker.last_seen = now
        if kind is mdp.WorkerReply:
            reply: mdp.WorkerReply = message  # type: ignore[assignment]
            body = reply.body[0] if reply.body else b""
            if reply.final:
                self.core.worker_result(worker, reply.address, OK_READY, body, now, reply.body[1:])
            else:
                self.core.worker_partial(worker, reply.address, body, now, reply.body[1:])
        elif kind is mdp.WorkerHeartbeat:
            if message.framing == mdp.DRAFT:
                return mdp.worker_heartbeat(mdp.DRAFT)  # the PONG
        elif kind is mdp.WorkerDisconnect:
            self.core.worker_gone(worker, now, "said DISCONNECT")
        return None

    def _request(self, identity: bytes, message: mdp.ClientRequest, now: float) -> None:
        job_id = self.new_id()
        client = ClientRef(self, identity, message.request_id, (message.framing, message.service))
        body = message.body[0] if message.body else b""
        self.core.client_request(
            client, job_id, message.service, _HEADERS, body, now, message.body[1:], fresh=True
        )

    def _ready(self, identity: bytes, message: mdp.WorkerReady, now: float) -> None:
        meta = {"protocol": "majordomo", "framing": message.framing}
        peer = Peer(
            identity,
            PEER_MDP,
            ((WORKER_WEIGHT, message.service),),
            now,
            meta,
            connected_at=now,
            port=self,
            traits=MDP_TRAITS,
        )
        self.workers[identity] = peer
        self.core.worker_join(peer, now)
        self.core.worker_ready(peer, now)

    def _bad_worker(self, worker: Peer, why: str, now: float) -> None:
        log.warning("Majordomo worker %s %s: disconnecting it", worker.identity.hex(), why)
        self.core.out.append(Goodbye(worker))
        self.core.worker_gone(worker, now, why)

    def known_peers(self) -> dict[bytes, Peer]:
        return self.workers

    # ---- out ------------------------------------------------------------------------

    def encode(self, effect: Effect) -> list[bytes] | None:
        kind = type(effect)
        e: Any = effect  # one of the effect types, told apart by ``kind``
        if kind is Deliver:
            job = e.job
            framing = e.peer.meta["framing"]
            return mdp.worker_request(
                framing, job.attempt_id, job.attempt_id, (job.body, *job.more)
            )
        if kind is Answer:
            return self._answer(e)
        if kind is Refuse:
            body = encode_failure(JOB_REFUSED, f"{e.code}: {e.reason}", "")
            framing, service = e.client.extra
            return mdp.client_reply(framing, True, service, e.client.tag, [body])
        if kind is Beat:
            framing = e.peer.meta["framing"]
            # a draft worker PINGs and is answered; majortomo's expects our HEARTBEATs
            return mdp.worker_heartbeat(framing) if framing == mdp.MAJORTOMO else None
        if kind is Goodbye:
            return mdp.worker_disconnect(e.peer.meta["framing"])
        if kind is Forget:
            self.forget(e.peer)
        return None

    def _answer(self, effect: Answer) -> list[bytes]:
        framing, service = effect.client.extra
        return mdp.client_reply(
            framing, effect.final, service, effect.client.tag, (effect.body, *effect.more)
        )
