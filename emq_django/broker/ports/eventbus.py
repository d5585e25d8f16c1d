"""Event BUS (``EMQ_BUS_SNAPSHOT_BIND``, ``EMQ_BUS_PUBLISH_BIND``,
``EMQ_BUS_COLLECT_BIND``): the topic space for micro-toolkit's Event BUS clients.

Three sockets, as the released bus binds them (loopback 5556, 5557, 5558 by
default); the wire is ``protocol/eventbus.py``:

- snapshot (ROUTER): ``SYNCSTART`` gets one ``SYNC`` per kept event above the
  sequence asked for, on the subtrees asked for, then ``SYNCEND`` with the
  broker's current sequence (the Clone pattern's state request);
- publisher (XPUB, which a PUB's subscribers cannot tell apart): every event of
  the topic space, from whichever port it came in by, as it is numbered. Its
  subscription messages are how the port counts subscriptions; anything else a
  peer sends there is counted as malformed. A subscriber whose pipe is full
  (``EMQ_BUS_PUBLISH_HWM``) misses events: it sees the gap by the sequence and
  fills it from the snapshot;
- collector (ROUTER): a producer's ``PUB`` is numbered and kept
  (``BrokerCore.topic_publish``); the bus never answers it.

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
from emq_django.broker.topics import Event
from emq_django.exceptions import ProtocolError
from emq_django.protocol import eventbus
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

SNAPSHOT, PUBLISH, COLLECT = "bus-snapshot", "bus-publish", "bus-collect"
SNAPSHOT_HWM = 1_000_000  # a snapshot's SYNCs wait here for a slow client


class EventBusPort(Port):
    name = "eventbus"
    multi_socket = True

    def __init__(self, core: Any, address: str = "") -> None:
        super().__init__(core, address)
        self.publish_address = "tcp://127.0.0.1:5557"
        self.collect_address = "tcp://127.0.0.1:5558"
        self.publish_hwm = 10_000
        self.subscriptions: dict[bytes, int] = {}  # topic filter -> subscriptions
        self.figures = {
            "syncs": 0,  # SYNCSTARTs answered
            "synced_events": 0,  # SYNCs sent
            "collected": 0,  # PUBs taken in
            "broadcast": 0,  # events sent on the publisher socket
            "malformed": 0,
            "unsent": 0,  # snapshot messages a client's full pipe refused
        }

    def configure(self, settings: Any) -> None:
        self.publish_address = settings.BUS_PUBLISH_BIND
        self.collect_address = settings.BUS_COLLECT_BIND
        self.publish_hwm = settings.BUS_PUBLISH_HWM

    def socket_specs(self) -> list[SocketSpec]:
        return [
            SocketSpec(
                SNAPSHOT,
                zmq.ROUTER,
                self.address,
                SocketOptions(sndhwm=SNAPSHOT_HWM, router_mandatory=True),
            ),
            SocketSpec(
                PUBLISH,
                zmq.XPUB,
                self.publish_address,
                SocketOptions(sndhwm=self.publish_hwm, xpub_verboser=True),
            ),
            SocketSpec(COLLECT, zmq.ROUTER, self.collect_address, SocketOptions()),
        ]

    def handler_for(self, socket: str) -> Handler:
        return {
            SNAPSHOT: self.handle_snapshot,
            PUBLISH: self.handle_subscription,
            COLLECT: self.handle,
        }[socket]

    # ---- in -------------------------------------------------------------------------

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        """A producer's PUB on the collector."""
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
        for event in self.core.topics.since(request.subtrees, request.seq):
            out.append(Send(client, eventbus.sync(event, eventbus.as_msgpack(event))))
            n += 1
        out.append(Send(client, eventbus.syncend(request.spec, self.core.topics.last_seq)))
        self.figures["syncs"] += 1
        self.figures["synced_events"] += n
        return None

    def handle_subscription(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """The XPUB's subscription messages (\\x01 filter / \\x00 filter)."""
        if len(frames) == 1 and frames[0][:1] in (b"\x01", b"\x00"):
            prefix = frames[0][1:]
            if frames[0][0] == 1:
                self.subscriptions[prefix] = self.subscriptions.get(prefix, 0) + 1
            elif prefix in self.subscriptions:
                left = self.subscriptions[prefix] - 1
                if left > 0:
                    self.subscriptions[prefix] = left
                else:
                    del self.subscriptions[prefix]
            return None
        self._malformed(identity, ProtocolError("the publisher socket takes only subscriptions"))
        return None

    def _malformed(self, identity: bytes, exc: ProtocolError) -> None:
        self.figures["malformed"] += 1
        self.count_malformed(identity, exc, answered=False)

    # ---- out ------------------------------------------------------------------------

    def on_published(self, event: Event) -> list[tuple[str, list[bytes]]]:
        self.figures["broadcast"] += 1
        return [(PUBLISH, eventbus.broadcast(event, eventbus.as_msgpack(event)))]

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
