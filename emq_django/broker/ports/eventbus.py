"""Event BUS (``EMQ_BUS_SNAPSHOT_BIND``, ``EMQ_BUS_PUBLISH_BIND``,
``EMQ_BUS_COLLECT_BIND``): the topic space for micro-toolkit's Event BUS clients.

Three sockets, as the released bus binds them (loopback 5556, 5557, 5558 by
default); the wire is ``protocol/eventbus.py``:

- snapshot (ROUTER): ``SYNCSTART`` gets one ``SYNC`` per kept event above the
  sequence asked for, on the subtrees asked for, then ``SYNCEND`` with the
  broker's current sequence (the Clone pattern's state request); at most
  ``MAX_SYNC`` SYNCs, after which SYNCEND carries the last one's sequence;
- publisher (XPUB, which a PUB's subscribers cannot tell apart): every event of
  the topic space, from whichever port it came in by, as it is numbered. Its
  subscription messages are how the port counts subscriptions; anything else a
  peer sends there is counted as malformed. A subscriber whose pipe is full
  (``EMQ_BUS_PUBLISH_HWM``) misses events: it sees the gap by the sequence and
  fills it from the snapshot;
- collector (ROUTER): a producer's ``PUB`` is numbered and kept
  (``BrokerCore.topic_publish``); the bus never answers it. emq's publish batch
  (``emq.publish_many``: ``protocol/eventbus.py``) is taken here too;
- batch publisher (XPUB, ``EMQ_BUS_BATCH_BIND``, off when empty): emq's own
  delivery channel, every event again but as runs of consecutive events on one
  topic, one message per run and per loop turn (``MAX_BATCH_EVENTS``), so a burst
  costs one send, one fan-out and one recv per batch instead of per event; an
  event alone in its turn leaves at once, alone. ``emq.subscribe`` reads it when
  it is configured. Its queue per subscriber is ``EMQ_BUS_PUBLISH_HWM / 4``
  batches; a subscriber past it fills the gap from the snapshot.

Malformed messages are dropped, logged within a budget and counted
(``protocol_errors``, ``dropped_malformed`` and this port's ``malformed`` figure).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import zmq

from emq_django.broker.effects import ClientRef, Effect, Send
from emq_django.broker.ports.base import Handler, Port, SocketSpec
from emq_django.broker.topics import Event, check_topic
from emq_django.exceptions import ProtocolError
from emq_django.protocol import eventbus
from emq_django.security.roles import PUBLISHER, SUBSCRIBER
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

SNAPSHOT, PUBLISH, COLLECT = "bus-snapshot", "bus-publish", "bus-collect"
BATCH = "bus-batch"
SNAPSHOT_HWM = 1_000_000  # a snapshot's SYNCs wait here for a slow client
# SYNCs in one answer: a longer replay is answered in pages (the SYNCEND then
# carries the page's last sequence, and the client asks again from there), so one
# request cannot make the broker build millions of messages in a loop turn
MAX_SYNC = 100_000


class EventBusPort(Port):
    name = "eventbus"
    multi_socket = True
    # under CURVE: the collector admits ``publisher`` keys, the snapshot and the
    # publishers ``subscriber`` keys (each socket's ZAP domain, in socket_specs)
    roles = (PUBLISHER, SUBSCRIBER)

    def __init__(self, core: Any, address: str = "") -> None:
        super().__init__(core, address)
        self.publish_address = "tcp://127.0.0.1:5557"
        self.collect_address = "tcp://127.0.0.1:5558"
        self.publish_hwm = 10_000
        self.batch_address = ""
        # the delivery batch being built this turn: its topic, flat fields, data bytes
        self._run_topic = ""
        self._run: list[Any] = []
        self._run_bytes = 0
        self._batches: list[tuple[str, list[bytes]]] = []
        self.max_sync = MAX_SYNC
        self.subscriptions: dict[bytes, int] = {}  # topic filter -> subscriptions
        # subscriptions per publisher socket: one that has none is sent nothing (an
        # event built and fanned out to nobody cost the loop a few µs each, at
        # 1,000 events/s a turn of their own). A subscription not read yet when
        # an event is numbered is a late joiner's: the snapshot has the event.
        self._subscribed = {PUBLISH: 0, BATCH: 0}
        self.figures = {
            "syncs": 0,  # SYNCSTARTs answered
            "synced_events": 0,  # SYNCs sent
            "collected": 0,  # PUBs taken in
            "broadcast": 0,  # events sent on the publisher socket
            "batches": 0,  # delivery batches sent on the batch publisher
            "batched_events": 0,  # events in them
            "collected_batches": 0,  # publish batches taken in
            "malformed": 0,
            "unsent": 0,  # snapshot messages a client's full pipe refused
        }

    def configure(self, settings: Any) -> None:
        self.publish_address = settings.BUS_PUBLISH_BIND
        self.collect_address = settings.BUS_COLLECT_BIND
        self.publish_hwm = settings.BUS_PUBLISH_HWM
        self.batch_address = settings.BUS_BATCH_BIND

    def socket_specs(self) -> list[SocketSpec]:
        specs = [
            SocketSpec(
                SNAPSHOT,
                zmq.ROUTER,
                self.address,
                SocketOptions(sndhwm=SNAPSHOT_HWM, router_mandatory=True),
                (SUBSCRIBER,),
            ),
            SocketSpec(
                PUBLISH,
                zmq.XPUB,
                self.publish_address,
                SocketOptions(sndhwm=self.publish_hwm, xpub_verboser=True),
                (SUBSCRIBER,),
            ),
            SocketSpec(COLLECT, zmq.ROUTER, self.collect_address, SocketOptions(), (PUBLISHER,)),
        ]
        if self.batch_address:
            specs.append(
                SocketSpec(
                    BATCH,
                    zmq.XPUB,
                    self.batch_address,
                    SocketOptions(sndhwm=max(self.publish_hwm // 4, 1), xpub_verboser=True),
                    (SUBSCRIBER,),
                )
            )
        return specs

    def handler_for(self, socket: str) -> Handler:
        return {
            SNAPSHOT: self.handle_snapshot,
            PUBLISH: self.handle_subscription,
            COLLECT: self.handle,
            BATCH: self.handle_batch_subscription,
        }[socket]

    # ---- in -------------------------------------------------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        """A producer's PUB on the collector (or emq's publish batch)."""
        if len(frames) == 5 and frames[0] == eventbus.PUBS:
            self._handle_pubs(identity, frames, now)
            return None
        try:
            message = eventbus.decode_pub(frames)
            self.core.topic_publish(
                message.topic,
                message.data,
                producer=message.producer,
                content_type=message.content_type,
                uuid=message.uuid,
                ts=message.ts,
                now=now,
            )
        except ProtocolError as exc:
            self._malformed(identity, exc)
        except ValueError as exc:  # a topic the topic space refuses
            self._malformed(identity, ProtocolError(str(exc)))
        else:
            self.figures["collected"] += 1
        return None

    def _handle_pubs(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        """A publish batch: every event is numbered and kept, in order. The batch is
        checked whole first, so a malformed one publishes nothing."""
        try:
            batch = eventbus.decode_pubs(frames)
            check_topic(batch.topic)
        except ProtocolError as exc:
            self._malformed(identity, exc)
            return
        except ValueError as exc:  # a topic the topic space refuses
            self._malformed(identity, ProtocolError(str(exc)))
            return
        publish = self.core.topic_publish
        topic, producer, ctype = batch.topic, batch.producer, batch.content_type
        for ts, uuid, data in batch.events:
            publish(topic, data, producer=producer, content_type=ctype, uuid=uuid, ts=ts, now=now)
        self.figures["collected"] += len(batch.events)
        self.figures["collected_batches"] += 1

    def handle_snapshot(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """SYNCSTART: the kept events above its sequence, then SYNCEND."""
        try:
            request = eventbus.decode_syncstart(frames)
        except ProtocolError as exc:
            self._malformed(identity, exc)
            return None
        client = ClientRef(self, identity)
        out = self.core.out
        n = 0
        upto = self.core.topics.last_seq
        for event in self.core.topics.since(request.subtrees, request.seq, self.max_sync):
            out.append(Send(client, eventbus.sync(event, eventbus.as_msgpack(event))))
            n += 1
            if n >= self.max_sync:
                upto = event.seq  # a page: the client asks again from here
        out.append(Send(client, eventbus.syncend(request.spec, upto)))
        self.figures["syncs"] += 1
        self.figures["synced_events"] += n
        return None

    def handle_subscription(
        self, identity: bytes, frames: Sequence[bytes], now: float, socket: str = PUBLISH
    ) -> list[bytes] | None:
        """The XPUB's subscription messages (\\x01 filter / \\x00 filter)."""
        if len(frames) == 1 and frames[0][:1] in (b"\x01", b"\x00"):
            prefix = frames[0][1:]
            if frames[0][0] == 1:
                self.subscriptions[prefix] = self.subscriptions.get(prefix, 0) + 1
                self._subscribed[socket] += 1
            elif prefix in self.subscriptions:
                left = self.subscriptions[prefix] - 1
                if left > 0:
                    self.subscriptions[prefix] = left
                else:
                    del self.subscriptions[prefix]
                self._subscribed[socket] = max(self._subscribed[socket] - 1, 0)
            return None
        self._malformed(identity, ProtocolError("the publisher socket takes only subscriptions"))
        return None

    def harmless(self, socket: str, frames: Sequence[bytes]) -> bool:
        """An unsubscription on a publisher: libzmq's own when a peer goes (it
        carries no key), so the counts stay right after a revocation."""
        return socket in (PUBLISH, BATCH) and len(frames) == 1 and frames[0][:1] == b"\x00"

    def handle_batch_subscription(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """The batch XPUB's subscription messages: counted with the publisher's."""
        return self.handle_subscription(identity, frames, now, BATCH)

    def _malformed(self, identity: bytes, exc: ProtocolError) -> None:
        self.figures["malformed"] += 1
        self.count_malformed(identity, exc, answered=False)

    # ---- out ------------------------------------------------------------------------

    def on_published(self, event: Event) -> list[tuple[str, list[bytes]]]:
        subscribed = self._subscribed
        if not subscribed[PUBLISH] and not subscribed[BATCH]:
            return []
        data = eventbus.as_msgpack(event)
        if self.batch_address and subscribed[BATCH]:
            topic = event.topic
            if (
                topic != self._run_topic
                or len(self._run) >= self._run_cap
                or (self._run_bytes >= eventbus.MAX_BATCH_BYTES)
            ):
                self._close_run()
                self._run_topic = topic
            self._run += (event.seq, event.producer, event.ts, event.uuid, data)
            self._run_bytes += len(data)
        if not subscribed[PUBLISH]:
            return []
        self.figures["broadcast"] += 1
        return [(PUBLISH, eventbus.broadcast(event, data))]

    _run_cap = eventbus.MAX_BATCH_EVENTS * eventbus.BATCH_FIELDS

    def _close_run(self) -> None:
        if self._run:
            self._batches.append(
                (BATCH, eventbus.delivery_batch(self._run_topic.encode(), self._run))
            )
            self.figures["batches"] += 1
            self.figures["batched_events"] += len(self._run) // eventbus.BATCH_FIELDS
            self._run = []
            self._run_bytes = 0

    def flush_published(self) -> list[tuple[str, list[bytes]]]:
        """The delivery batches of the events published since the last call (the
        server asks once it has sent the turn's other messages)."""
        self._close_run()
        batches, self._batches = self._batches, []
        return batches

    def encode(self, effect: Effect) -> list[bytes] | None:
        routed = self.encode_routed(effect)
        return routed[1] if routed is not None else None

    def encode_routed(self, effect: Effect) -> tuple[str, list[bytes]] | None:
        if type(effect) is Send:
            return SNAPSHOT, [effect.client.identity, *effect.frames]
        return None

    def unsent(self, effect: Effect, now: float) -> None:
        self.figures["unsent"] += 1
        self.core.counters["unroutable"] += 1

    def unroutable(self, identity: bytes, now: float) -> None:
        self.figures["unsent"] += 1
        self.core.counters["unroutable"] += 1

    # ---- figures --------------------------------------------------------------------

    def subscriber_count(self) -> int:
        """Subscriptions on the publisher socket now (a client with two subtrees
        counts twice)."""
        return sum(self.subscriptions.values())

    def topic_stats(self) -> dict[str, Any]:
        return {
            **self.figures,
            "subscriptions": {
                k.decode("utf-8", "replace"): v for k, v in sorted(self.subscriptions.items())
            },
        }
