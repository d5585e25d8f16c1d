"""PZQ (``EMQ_PZQ_RECEIVE_BIND``, ``EMQ_PZQ_SEND_BIND``, ``EMQ_PZQ_MONITOR_BIND``):
a durable queue that plain ZeroMQ programs use, as a port of the broker.

Three sockets, as the reference binds them: a ROUTER for producers (``receive``),
a DEALER consumers connect their ROUTERs to (``send``), and a ROUTER answering
``MONITOR`` (``monitor``). The wire is ``protocol/pzq.py``.

- A producer's message is a guaranteed job on the emq queue ``EMQ_PZQ_QUEUE``
  (default ``pzq``): the journal has it on disk before the producer's ``'1'``
  leaves (the core's Acknowledge effect, sent after the turn's commit; a failed
  commit turns it into a Refuse, the producer's ``'0'`` with the reason). Its
  job id is ours, not the producer's (two producers may count alike); the
  producer's id comes back in the answer. A multipart body is stored packed
  (header ``pzq-parts``) and delivered as the parts it came as.
- The send socket is one peer of the core: a DEALER cannot address a consumer,
  so libzmq spreads deliveries over the connected consumers and the core sees a
  single worker whose credit is ``EMQ_PZQ_MAX_INFLIGHT`` deliveries not yet
  acked. Each delivery has a lease of ``EMQ_PZQ_ACK_TIMEOUT`` seconds: a ``'1'``
  ends the job, a ``'0'`` or no answer in time is a failed attempt, delivered
  again at once; after ``EMQ_PZQ_MAX_DELIVERIES`` deliveries the message is a
  dead letter (``emq_deadletters``). The message id a consumer sees is the
  job's, the same on every delivery.
- When the DEALER would block (no consumer connected, or all of them full), the
  delivery goes back to the front of the queue and the peer gets no credit
  until the next heartbeat tick, which probes with one message, then refills.
- Messages waiting longer than ``EMQ_PZQ_MAX_AGE`` seconds (0: no limit) when
  their turn comes are dropped and counted (``expired_messages``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import zmq

from emq_django.broker.effects import (
    Acknowledge,
    Beat,
    ClientRef,
    Deliver,
    Effect,
    Outcome,
    Refuse,
)
from emq_django.broker.ports.base import Handler, Port, SocketSpec
from emq_django.broker.state import PLAIN_TRAITS, Peer
from emq_django.exceptions import ProtocolError
from emq_django.ids import IdGenerator
from emq_django.protocol import pzq
from emq_django.protocol.headers import Headers, format_headers, parse_headers
from emq_django.security.roles import ADMIN, CLIENT, WORKER
from emq_django.security.roles import MONITOR as MONITOR_ROLE
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

RECEIVE, SEND, MONITOR = "pzq-receive", "pzq-send", "pzq-monitor"
PEER_PZQ = "pzq"
ACKED = Outcome(failed=False, ready=True)
NACKED = Outcome(failed=True, ready=True, error="Nack", retry=0.0)
PACKED = ("pzq-parts", "packed")
UNKNOWN = b"ERROR unknown command; send MONITOR"


# the send socket is the broker's own (never silent) and says nothing while its
# consumers work; as a one-connection peer it keeps the plain peers' other traits
PZQ_TRAITS = replace(PLAIN_TRAITS, bound=True, silent_when_busy=True)


class PzqPort(Port):
    name = "pzq"
    post = Port.post_routed  # several sockets: ``encode_routed`` names the one

    def __init__(self, core: Any, address: str = "", ids: IdGenerator | None = None) -> None:
        super().__init__(core, address)
        self.new_id = ids or IdGenerator()
        self.send_address = "tcp://127.0.0.1:11132"
        self.monitor_address = "tcp://127.0.0.1:11133"
        self.queue = "pzq"
        self.ack_timeout = 5.0
        self.max_inflight = 1000
        self.paused = False
        self.peer: Peer | None = None
        self._headers: Headers = Headers()
        self._packed: Headers = Headers()

    def configure(self, settings: Any) -> None:
        self.send_address = settings.PZQ_SEND_BIND
        self.monitor_address = settings.PZQ_MONITOR_BIND
        self.configure_values(
            settings.PZQ_QUEUE,
            settings.PZQ_ACK_TIMEOUT,
            settings.PZQ_MAX_DELIVERIES,
            settings.PZQ_MAX_INFLIGHT,
            settings.PZQ_MAX_AGE,
        )

    def configure_values(
        self, queue: str, ack_timeout: float, max_deliveries: int, max_inflight: int, max_age: float
    ) -> None:
        """Set the port up and join its send socket to the core as a peer
        (``configure`` reads these from the settings)."""
        self.queue = queue
        self.ack_timeout = ack_timeout
        self.max_inflight = max_inflight
        retries = max(max_deliveries - 1, 0)
        self._headers = parse_headers(format_headers(guarantee=True, retry_count=retries))
        self._packed = parse_headers(
            format_headers(guarantee=True, retry_count=retries, extra=(PACKED,))
        )
        self.core.set_max_age(queue, max_age)
        self.peer = None
        restored = self.core.queues.get(queue)
        if restored is not None and (restored.pending or restored.spilled):
            self._join(self.core.started_at)  # messages from the journal wait

    def _join(self, now: float) -> Peer:
        """The send socket becomes a peer of the core when there is something for it
        (the first message, or messages reloaded from the journal), so a broker that
        nobody uses PZQ on shows no PZQ job manager."""
        peer = self.peer = Peer(
            b"pzq",
            PEER_PZQ,
            ((10, self.queue),),
            now,
            {"protocol": "pzq"},
            connected_at=now,
            port=self,
            lease=self.ack_timeout,
            traits=PZQ_TRAITS,
        )
        self.core.worker_join(peer, now)
        self.core.worker_credit(peer, self.max_inflight, now)
        return peer

    def socket_specs(self) -> list[SocketSpec]:
        specs = [
            # answers wait here for producers with thousands in flight: at libzmq's
            # default HWM (1000) a full pipe dropped confirmations (EAGAIN)
            SocketSpec(
                RECEIVE,
                zmq.ROUTER,
                self.address,
                SocketOptions(sndhwm=100_000, router_mandatory=True),
                (CLIENT,),
            ),
            SocketSpec(
                SEND, zmq.DEALER, self.send_address, SocketOptions(identity=b"pzq"), (WORKER,)
            ),
        ]
        if self.monitor_address:
            specs.append(
                SocketSpec(
                    MONITOR,
                    zmq.ROUTER,
                    self.monitor_address,
                    SocketOptions(),
                    (MONITOR_ROLE, ADMIN),
                )
            )
        return specs

    def handler_for(self, socket: str) -> Handler:
        return {RECEIVE: self.handle, SEND: self.handle_ack, MONITOR: self.handle_monitor}[socket]

    # ---- in -------------------------------------------------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        """A producer's message."""
        try:
            message = pzq.decode_produce(frames)
        except ProtocolError as exc:
            msg_id = frames[0] if frames and 0 < len(frames[0]) <= pzq.MAX_MSG_ID else b""
            self.count_malformed(identity, exc, answered=bool(msg_id))
            return pzq.answer(msg_id, False, exc.reason.encode()) if msg_id else None
        if self.peer is None:
            self._join(now)
        client = ClientRef(self, identity, message.msg_id)
        body = message.body
        if len(body) == 1:
            self.core.client_request(client, self.new_id(), self.queue, self._headers, body[0], now)
        else:
            packed = pzq.pack_parts(body)
            self.core.client_request(client, self.new_id(), self.queue, self._packed, packed, now)
        return None

    def handle_ack(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """A consumer's ack, through the send DEALER."""
        try:
            ack = pzq.decode_ack(frames)
        except ProtocolError as exc:
            self.count_malformed(identity, exc, answered=False)
            return None
        core = self.core
        job = core.life.jobs.get(ack.msg_id)
        peer = self.peer
        if job is None or peer is None or job.peer is not peer:
            core.counters["stale_replies"] += 1  # acked already, timed out, or from before
            return None
        self.paused = False  # a consumer is there
        core.worker_result(peer, job.attempt_id, ACKED if ack.ok else NACKED, b"", now)
        return None

    def handle_monitor(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """A REQ's ``MONITOR`` (its envelope kept)."""
        if not frames:
            self.core.counters["protocol_errors"] += 1
            return None
        envelope, request = list(frames[:-1]), frames[-1].strip().upper()
        if request != pzq.MONITOR:
            self.core.counters["protocol_errors"] += 1
            return [*envelope, UNKNOWN]
        return [*envelope, pzq.monitor_lines(self.figures())]

    def figures(self) -> dict[str, int]:
        """The MONITOR keys, the reference's and the document's spellings."""
        core = self.core
        queue = core.queues.get(self.queue)
        life = core.life
        live = sum(1 for job in life.jobs.values() if job.queue == self.queue)
        dead = sum(1 for letter in life.dead.items.values() if letter.job.queue == self.queue)
        inflight = queue.in_flight if queue is not None else 0
        inflight_bytes = sum(
            len(job.body) for job in core.inflight.values() if job.queue == self.queue
        )
        journal = (self.status() if self.status is not None else {}).get("journal", {})
        return {
            "messages": live - dead + (queue.spilled if queue is not None else 0),
            "messages_inflight": inflight,
            "messages_in_flight": inflight,
            "db_size": int(journal.get("size_bytes", 0)),
            "inflight_db_size": inflight_bytes,
            "in_flightdb_size": inflight_bytes,
            "syncs": int(journal.get("commits", 0)),
            "expired_messages": core.counters["expired"],
        }

    def unsent(self, effect: Effect, now: float) -> None:
        if type(effect) is Deliver and self.peer is not None:
            if not self.paused:
                log.info("PZQ: no consumer takes messages now; holding them")
            self.paused = True
            self.core.worker_unsent(self.peer, effect.job.attempt_id, now)
        else:
            self.core.counters["unroutable"] += 1  # a producer not reading its answers

    # ---- out ------------------------------------------------------------------------

    def encode(self, effect: Effect) -> list[bytes] | None:
        routed = self.encode_routed(effect)
        return routed[1] if routed is not None else None

    def encode_routed(self, effect: Effect) -> tuple[str, list[bytes]] | None:
        kind = type(effect)
        e: Any = effect
        if kind is Deliver:
            job = e.job
            sent_us = int((job.dispatched_at + self.core.wall_offset) * 1_000_000)
            body = pzq.unpack_parts(job.body) if job.headers.extra else [job.body]
            return SEND, pzq.delivery(job.id, sent_us, int(self.ack_timeout * 1e6), body)
        if kind is Acknowledge:
            return RECEIVE, [e.client.identity, *pzq.answer(e.client.tag, True)]
        if kind is Refuse:
            reason = f"{e.code}: {e.reason}".encode()
            return RECEIVE, [e.client.identity, *pzq.answer(e.client.tag, False, reason)]
        if kind is Beat:
            self._tick(e.wall - self.core.wall_offset)
        return None

    def _tick(self, now: float) -> None:
        """Each heartbeat: credit back up to the in-flight limit; only one message to
        probe with while no consumer took the last one."""
        peer = self.peer
        if peer is None or peer.gone:
            return
        if self.paused:
            if not peer.credit:
                self.paused = False  # set again if this one does not leave either
                self.core.worker_credit(peer, 1, now)
            return
        missing = self.max_inflight - len(peer.inflight) - peer.credit
        if missing > 0:
            self.core.worker_credit(peer, missing, now)
