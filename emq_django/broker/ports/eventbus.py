"""Event BUS (``EMQ_BUS_SNAPSHOT_BIND``, ``EMQ_BUS_PUBLISH_BIND``,
``EMQ_BUS_COLLECT_BIND``): the topic space for micro-toolkit's Event BUS clients.

Three sockets, as the released bus binds them (loopback 5556, 5557, 5558 by
default); the wire is ``protocol/eventbus.py``:

- snapshot (ROUTER): ``SYNCSTART`` gets one ``SYNC`` per kept event above the
  sequence asked for, on the subtrees asked for, up to the broker's sequence when
  it asked, then ``SYNCEND`` with that sequence (the Clone pattern's state
  request). The replay is paced by its client: it goes out a bounded part per
  loop turn (``REPLAY_TURN`` SYNCs over all replays), only while the client's
  pipe (``SNAPSHOT_HWM`` messages) has room, and it ends as soon as the client
  is found gone. So a snapshot of any length never holds the loop (the jobs'
  round trips go on meanwhile) and never costs more memory than the pipes;
- publisher (XPUB, which a PUB's subscribers cannot tell apart): every event of
  the topic space, from whichever port it came in by, as it is numbered. Its
  subscription messages are how the port counts subscriptions; anything else a
  peer sends there is counted as malformed. A subscriber whose pipe is full
  (``EMQ_BUS_PUBLISH_HWM``) misses events: it sees the gap by the sequence and
  fills it from the snapshot;
- collector (ROUTER): a producer's ``PUB`` is numbered and kept
  (``BrokerCore.topic_publish``); the bus never answers it. emq's publish batches
  (``protocol/eventbus.py``) are taken here too: the confirmed ones
  (``emq.publish``, ``emq.publish_many``) are answered once per loop turn and
  producer, after the turn's journal commit: ``PUBOK`` up to the last batch id
  taken, or ``PUBNO`` with the reason (a malformed batch, a failed commit);
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
from dataclasses import dataclass
from typing import Any

import zmq

from emq_django.broker.effects import Effect, Send
from emq_django.broker.ports.base import GONE, SENT, Handler, PacedSend, Port, SocketSpec
from emq_django.broker.topics import Event, check_topic
from emq_django.exceptions import ProtocolError
from emq_django.protocol import eventbus
from emq_django.security.roles import PUBLISHER, SUBSCRIBER
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

SNAPSHOT, PUBLISH, COLLECT = "bus-snapshot", "bus-publish", "bus-collect"
BATCH = "bus-batch"
# SYNCs waiting in one client's pipe: past it the client's replay waits for it to
# read (the memory a replay costs the broker is its pipe, not the snapshot)
SNAPSHOT_HWM = 1_000
REPLAY_TURN = 300  # SYNCs made per loop turn over all replays (a few ms of the loop)
REPLAY_SHARE = 50  # at least this many per replay served in a turn
REPLAY_RETRY = 0.02  # seconds before a replay whose client's pipe was full is tried again


@dataclass(slots=True)
class Replay:
    """One client's snapshot under way: the SYNCs above ``after`` up to ``upto``."""

    identity: bytes
    spec: bytes  # as received: SYNCEND sends it back
    subtrees: tuple[str, ...]
    after: int  # the last sequence sent (or asked from)
    upto: int  # the broker's sequence at the request: SYNCEND's
    resume_at: float = 0.0  # a full pipe: not tried again before
    notify_expired: bool = False  # emq's client: told when events it asks for expired


class EventBusPort(Port):
    name = "eventbus"
    post = Port.post_routed  # several sockets: ``encode_routed`` names the one
    # under CURVE: the collector admits ``publisher`` keys, the snapshot and the
    # publishers ``subscriber`` keys (each socket's ZAP domain, in socket_specs)
    roles = (PUBLISHER, SUBSCRIBER)
    event_sockets = (COLLECT,)

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
        self.replays: dict[bytes, Replay] = {}  # by client identity, oldest first
        # confirmed publish batches taken this turn: per producer, the first and last
        # batch id; the refused ones with their reasons; the topic space's count of
        # events the journal lost, when last looked at
        self._taken: dict[bytes, tuple[int, int]] = {}
        self._refusals: list[tuple[bytes, int, str]] = []
        self._lost_seen = 0
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
            "confirmations": 0,  # PUBOK/PUBNO answers after a turn's commit
            "refused_batches": 0,  # confirmed publish batches refused as malformed
            "expired_notices": 0,  # SYNCEXPIRED sent (events a client asked for were gone)
            "replays_done": 0,  # snapshots sent to the end (SYNCEND)
            "replays_abandoned": 0,  # snapshots stopped: their client was gone
            "replays_waiting": 0,  # times a replay met its client's full pipe
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
        if frames and frames[0] == eventbus.PUBC:
            self._handle_confirmed(identity, frames, now)
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

    def _handle_confirmed(self, identity: bytes, frames: Sequence[bytes], now: float) -> None:
        """A publish batch to confirm: numbered and kept as ``_handle_pubs`` does;
        its id joins this turn's confirmation to the producer (``flush_published``),
        or its refusal does, with the reason."""
        batch_id: int | None = None
        try:
            if len(frames) > 1:
                batch_id = eventbus.decode_batch_id(frames[1])
            batch_id, batch = eventbus.decode_confirmed_pubs(frames)
            check_topic(batch.topic)
        except (ProtocolError, ValueError) as exc:
            error = exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc))
            self._malformed(identity, error)
            if batch_id is not None:
                self._refusals.append((identity, batch_id, error.reason))
            return
        publish = self.core.topic_publish
        topic, producer, ctype = batch.topic, batch.producer, batch.content_type
        for ts, uuid, data in batch.events:
            publish(topic, data, producer=producer, content_type=ctype, uuid=uuid, ts=ts, now=now)
        self.figures["collected"] += len(batch.events)
        self.figures["collected_batches"] += 1
        taken = self._taken.get(identity)
        self._taken[identity] = (batch_id, batch_id) if taken is None else (taken[0], batch_id)

    def _confirmations(self) -> list[tuple[str, list[bytes]]]:
        """This turn's answers to confirmed publish batches, once its events are
        committed: PUBOK up to each producer's last batch, or PUBNO when the
        journal failed to keep the turn's events."""
        lost = self.core.topics.lost
        failed = lost != self._lost_seen
        self._lost_seen = lost
        out = [
            (COLLECT, [identity, *eventbus.pub_refused(batch_id, batch_id, reason)])
            for identity, batch_id, reason in self._refusals
        ]
        for identity, (first, last) in self._taken.items():
            if failed:
                reason = "the broker's journal failed to keep them (see its log); publish again"
                out.append((COLLECT, [identity, *eventbus.pub_refused(first, last, reason)]))
            else:
                out.append((COLLECT, [identity, *eventbus.pub_confirmed(last)]))
        self.figures["confirmations"] += len(self._taken)
        self.figures["refused_batches"] += len(self._refusals)
        self._taken.clear()
        self._refusals.clear()
        return out

    def handle_snapshot(
        self, identity: bytes, frames: Sequence[bytes], now: float
    ) -> list[bytes] | None:
        """SYNCSTART: a replay of the kept events above its sequence, then SYNCEND,
        sent by ``pump`` as the client reads (a new request replaces one under way)."""
        try:
            request = eventbus.decode_syncstart(frames)
        except ProtocolError as exc:
            self._malformed(identity, exc)
            return None
        self.replays.pop(identity, None)
        upto = self.core.topics.last_seq
        self.replays[identity] = Replay(
            identity,
            request.spec,
            request.subtrees,
            min(request.seq, upto),
            upto,
            notify_expired=request.notify_expired,
        )
        self.figures["syncs"] += 1
        return None

    def next_timer(self) -> float | None:
        """When a replay can go on: now, or when a full pipe is tried again."""
        if not self.replays:
            return None
        return min(r.resume_at for r in self.replays.values())

    def pump(self, now: float, send: PacedSend) -> None:
        """Each replay that can go on gets its share of ``REPLAY_TURN`` SYNCs; one
        served goes to the back, so many replays take turns."""
        ready = [r for r in self.replays.values() if r.resume_at <= now]
        if not ready:
            return
        share = max(REPLAY_TURN // len(ready), REPLAY_SHARE)
        budget = REPLAY_TURN
        for replay in ready:
            if budget <= 0:
                break
            budget -= self._replay(replay, min(share, budget), now, send)
            if self.replays.get(replay.identity) is replay:  # to the back
                del self.replays[replay.identity]
                self.replays[replay.identity] = replay

    def _replay(self, replay: Replay, limit: int, now: float, send: PacedSend) -> int:
        """Up to ``limit`` SYNCs of ``replay``, then its SYNCEND when it is through;
        the SYNCs sent."""
        if replay.notify_expired and not self._tell_expired(replay, now, send):
            return 0
        n, outcome, through = self._send_syncs(replay, limit, send)
        self.figures["synced_events"] += n
        if outcome == SENT and through:
            outcome = send(SNAPSHOT, [replay.identity, *eventbus.syncend(replay.spec, replay.upto)])
            if outcome == SENT:
                del self.replays[replay.identity]
                self.figures["replays_done"] += 1
                return n
            replay.after = replay.upto  # only the SYNCEND is left to send
        if outcome != SENT:
            self._stalled(replay, outcome, now)
        return n

    def _send_syncs(self, replay: Replay, limit: int, send: PacedSend) -> tuple[int, int, bool]:
        """The next SYNCs of ``replay``: how many left, the last send's outcome, and
        whether the replay is through (every SYNC up to ``upto`` sent)."""
        events = list(self.core.topics.since(replay.subtrees, replay.after, limit))
        n = 0
        for event in events:
            if event.seq > replay.upto:
                return n, SENT, True
            data = eventbus.as_msgpack(event)
            outcome = send(SNAPSHOT, [replay.identity, *eventbus.sync(event, data)])
            if outcome != SENT:
                return n, outcome, False
            replay.after = event.seq
            n += 1
        return n, SENT, len(events) < limit or replay.after >= replay.upto

    def _tell_expired(self, replay: Replay, now: float, send: PacedSend) -> bool:
        """Retention deleted events the replay would have sent (before it started,
        or ahead of it since): SYNCEXPIRED with their range, and the replay goes on
        after it. False: the client's pipe was full or the client is gone."""
        expired = min(self.core.topics.expired_above(replay.subtrees, replay.after), replay.upto)
        if expired <= replay.after:
            return True
        frames = eventbus.syncexpired(replay.spec, replay.after + 1, expired)
        outcome = send(SNAPSHOT, [replay.identity, *frames])
        if outcome != SENT:
            self._stalled(replay, outcome, now)
            return False
        replay.after = expired
        self.figures["expired_notices"] += 1
        return True

    def _stalled(self, replay: Replay, outcome: int, now: float) -> None:
        """The client's pipe is full (try again after ``REPLAY_RETRY``) or the client
        is gone (its replay ends here)."""
        if outcome == GONE:
            del self.replays[replay.identity]
            self.figures["replays_abandoned"] += 1
        else:
            replay.resume_at = now + REPLAY_RETRY
            self.figures["replays_waiting"] += 1

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
        if self._taken or self._refusals:
            batches += self._confirmations()
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
            "replays": len(self.replays),  # snapshots under way
            "subscriptions": {
                k.decode("utf-8", "replace"): v for k, v in sorted(self.subscriptions.items())
            },
        }
