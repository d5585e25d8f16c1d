"""mc0 (``EMQ_MC0_BIND``, default ``tcp://127.0.0.1:61616``): the MCollective 0MQ
connector's middleware, as a port of the broker. The wire is ``protocol/mc0.py``.

Connectors connect a DEALER to our ROUTER. Each identity that sent a valid
``CONNECT`` has a session: its TTL, when it was last heard from and last sent to,
and its topics.

- ``SUB`` / ``UNSUB`` change the session's topics; topics match exactly. A command
  with an ``ID`` is answered ``OK`` (or ``ERROR``) with it.
- ``PUT`` publishes into the broker's one topic space (``core.topic_publish``), so
  it reaches every port's subscribers (Event BUS, ``emq.subscribe``) and events
  published elsewhere reach the mc0 subscribers of their topic, through
  ``on_published``, as ``MESSAGE`` with every PUT header but ``ID`` (bytes and
  text published as MessagePack come as their raw bytes: ``eventbus.as_raw``).
- Heartbeats: a session sent nothing for 0.95 x TTL gets a ``NOOP``; one not heard
  from for 1.05 x TTL is evicted (``mc0_evicted``): no more messages, its topics
  dropped. The timers live in one heap (``next_timer`` / ``on_timer``), entries
  checked again when due, so that traffic costs no heap work.
- With CURVE (``EMQ_CURVE_SECRET_KEY``) the socket is a CURVE server like every
  port's: keys holding the publisher or subscriber role connect (ZAP), PUT needs
  publisher and SUB subscriber (``authorize``; refused ones answered ERROR). A
  revoked key's session ends when the broker reloads its keys (``revoke``): no
  MESSAGE reaches it after that, and the guard drops what it sends; a key that
  lost the subscriber role loses its SUBs (``narrow``).
- Anything malformed (no leading empty frame, an unknown verb, an odd number of
  header frames, a bad value) or a command before ``CONNECT`` is answered
  ``ERROR`` and counted (``protocol_errors``, ``mc0_errors``); nothing of it
  reaches the core. Except a ``NOOP`` or ``PUT`` without an ``ID`` from a
  connector with no session (evicted): not answered, as mc0d does, so that the
  released connector's watchdog reconnects it (``mc0_unanswered``; the PUT is
  dropped).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from emq_django.broker.effects import Effect
from emq_django.broker.ports.base import Port
from emq_django.broker.state import show_identity
from emq_django.broker.topics import Event
from emq_django.protocol import eventbus, mc0
from emq_django.security.roles import PUBLISHER, SUBSCRIBER
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

NOOP_AFTER = 0.95  # x TTL without sending to a session: send it a NOOP
EVICT_AFTER = 1.05  # x TTL without hearing from a session: evict it
MAX_TOPICS = 10_000  # subscriptions per session
CONTENT_TYPE = "application/octet-stream"  # mc0 bodies are opaque bytes
COUNTERS = (
    "mc0_connects",
    "mc0_disconnects",
    "mc0_evicted",
    "mc0_errors",  # commands answered ERROR (malformed, not connected, refused PUT)
    "mc0_puts",
    "mc0_messages_sent",
    "mc0_noops_sent",
    "mc0_unanswered",  # NOOPs and PUTs without an ID from a connector with no session
)
UNANSWERED_LOG_BUDGET = 20  # then every 1,000th


@dataclass(slots=True, eq=False)
class Session:
    """One connected connector."""

    identity: bytes
    version: bytes
    ttl: float  # seconds
    last_in: float  # server clock
    last_out: float
    topics: set[str] = field(default_factory=set)

    def due(self) -> float:
        """When this session next needs a NOOP or an eviction."""
        return min(self.last_out + NOOP_AFTER * self.ttl, self.last_in + EVICT_AFTER * self.ttl)


class Mc0Port(Port):
    name = "mc0"
    event_sockets = ("mc0",)  # PUTs: read after the job sockets in a round
    # with CURVE (EMQ_CURVE_SECRET_KEY): a key with either role may connect; PUT
    # needs publisher, SUB subscriber (``authorize``)
    roles = (PUBLISHER, SUBSCRIBER)

    def __init__(self, core: Any, address: str = "") -> None:
        super().__init__(core, address)
        self.sessions: dict[bytes, Session] = {}
        self.subscribers: dict[str, dict[bytes, Session]] = {}  # topic -> sessions
        self._timers: list[tuple[float, int, Session]] = []
        self._tie = count()
        self._now = 0.0  # the latest server clock seen: on_published gets none
        counters = core.counters
        for key in COUNTERS:
            counters.setdefault(key, 0)

    def socket_options(self) -> SocketOptions:
        # a subscriber that does not read loses messages at the HWM (counted as
        # dropped sends) rather than stalling the broker
        return SocketOptions(router_mandatory=True, sndhwm=100_000)

    # ---- in -------------------------------------------------------------------------

    def authorize(self, socket: str, roles: frozenset[str], frames: Sequence[bytes]) -> str | None:
        """Under CURVE: PUT needs the publisher role, SUB the subscriber role; the
        rest (CONNECT, UNSUB, NOOP, DISCONNECT, malformed) either, which the ZAP
        handler checked at the handshake."""
        verb = frames[1] if len(frames) > 1 and frames[0] == b"" else b""
        if verb == mc0.PUT and PUBLISHER not in roles:
            return "PUT needs the publisher role"
        if verb == mc0.SUB and SUBSCRIBER not in roles:
            return "SUB needs the subscriber role"
        return None

    def forbidden(
        self, identity: bytes, frames: Sequence[bytes], reason: str
    ) -> list[bytes] | None:
        """An ERROR, with the command's ID when it had one."""
        try:
            msg_id = mc0.decode(frames).msg_id
        except mc0.Mc0Error as exc:
            msg_id = exc.msg_id
        self.core.counters["mc0_errors"] += 1
        return mc0.error(f"forbidden: {reason}", msg_id)

    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        self._now = now
        session = self.sessions.get(identity)
        if session is not None:
            session.last_in = now  # even a malformed message says it is there
        try:
            cmd = mc0.decode(frames)
            answer = self._command(identity, session, cmd, frames, now)
        except mc0.Mc0Error as exc:
            self.count_malformed(identity, exc, answered=True)
            self.core.counters["mc0_errors"] += 1
            answer = mc0.error(exc.reason, exc.msg_id)
        if answer is not None:
            live = self.sessions.get(identity)
            if live is not None:
                live.last_out = now
        return answer

    def _command(
        self,
        identity: bytes,
        session: Session | None,
        cmd: mc0.Command,
        frames: Sequence[bytes],
        now: float,
    ) -> list[bytes] | None:
        verb = cmd.verb
        if verb == mc0.CONNECT:
            self._connect(identity, mc0.connect_params(cmd, frames), now)
        elif verb == mc0.DISCONNECT:
            if session is not None:
                self._drop(session)
                self.core.counters["mc0_disconnects"] += 1
        elif session is None and not cmd.msg_id and verb in (mc0.NOOP, mc0.PUT):
            self._unanswered(identity, verb)
        elif session is None:
            raise mc0.Mc0Error(
                f"{verb.decode()} before CONNECT (or after an eviction): CONNECT first",
                frames,
                cmd.msg_id,
            )
        elif verb == mc0.SUB:
            self._subscribe(session, mc0.topics(cmd, frames), cmd, frames)
        elif verb == mc0.UNSUB:
            for topic in mc0.topics(cmd, frames):
                self._unsubscribe(session, topic)
        elif verb == mc0.PUT:
            self._put(identity, cmd, frames, now)
        # NOOP: the session's last_in is all it does
        return mc0.ok(cmd.msg_id) if cmd.msg_id else None

    def _unanswered(self, identity: bytes, verb: bytes) -> None:
        """A NOOP or PUT (no ID: nobody waits for an answer) from a connector with no
        session, evicted or never connected: not answered, as mc0d does with a
        client it forgot. The released connector takes any message as proof of
        life, so an ERROR here would keep its watchdog from ever reconnecting it;
        silence makes it reconnect after 1.05 x its heartbeat. Counted and logged
        (the PUT is dropped)."""
        counters = self.core.counters
        counters["mc0_unanswered"] += 1
        n = counters["mc0_unanswered"]
        if n <= UNANSWERED_LOG_BUDGET or n % 1000 == 0:
            log.warning(
                "mc0: %s from %s, which has no session (evicted?): not answered, so that "
                "its connector reconnects%s (%d so far)",
                verb.decode(),
                show_identity(identity),
                "; the PUT is dropped" if verb == mc0.PUT else "",
                n,
            )

    def _connect(self, identity: bytes, params: mc0.Connect, now: float) -> None:
        """A new session (a CONNECT again starts afresh: the connector re-subscribes
        after it reconnects)."""
        old = self.sessions.get(identity)
        if old is not None:
            self._drop(old)
        session = Session(identity, params.version, params.ttl, now, now)
        self.sessions[identity] = session
        self._schedule(session)
        self.core.counters["mc0_connects"] += 1

    def _subscribe(
        self, session: Session, topics: list[str], cmd: mc0.Command, frames: Sequence[bytes]
    ) -> None:
        new = [t for t in dict.fromkeys(topics) if t not in session.topics]
        if len(session.topics) + len(new) > MAX_TOPICS:
            raise mc0.Mc0Error(f"over {MAX_TOPICS} topics for one connection", frames, cmd.msg_id)
        for topic in new:
            session.topics.add(topic)
            self.subscribers.setdefault(topic, {})[session.identity] = session

    def _unsubscribe(self, session: Session, topic: str) -> None:
        session.topics.discard(topic)
        subs = self.subscribers.get(topic)
        if subs is not None and subs.get(session.identity) is session:
            del subs[session.identity]
            if not subs:
                del self.subscribers[topic]

    def _put(self, identity: bytes, cmd: mc0.Command, frames: Sequence[bytes], now: float) -> None:
        topic, body = mc0.put_topic(cmd, frames)
        try:
            self.core.topic_publish(
                topic,
                body,
                producer=f"mc0:{show_identity(identity)}",
                content_type=CONTENT_TYPE,
                headers=mc0.forwarded_headers(cmd),
                now=now,
            )
        except ValueError as exc:
            raise mc0.Mc0Error(str(exc), frames, cmd.msg_id) from None
        self.core.counters["mc0_puts"] += 1

    def _drop(self, session: Session) -> None:
        """Forget a session: its topics go; its heap entry is skipped when due."""
        for topic in list(session.topics):
            self._unsubscribe(session, topic)
        if self.sessions.get(session.identity) is session:
            del self.sessions[session.identity]

    # ---- timers ---------------------------------------------------------------------

    def _schedule(self, session: Session) -> None:
        heapq.heappush(self._timers, (session.due(), next(self._tie), session))

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def on_timer(self, now: float) -> list[tuple[str, list[bytes]]]:
        """NOOP the sessions we have been silent to for 0.95 x TTL; evict the ones
        silent for 1.05 x TTL. An entry made stale by traffic is put back at its
        session's real due time."""
        self._now = now
        out: list[tuple[str, list[bytes]]] = []
        timers = self._timers
        counters = self.core.counters
        while timers and timers[0][0] <= now:
            _, _, session = heapq.heappop(timers)
            if self.sessions.get(session.identity) is not session:
                continue  # disconnected, evicted or replaced
            if now >= session.last_in + EVICT_AFTER * session.ttl:
                self._drop(session)
                counters["mc0_evicted"] += 1
                log.info(
                    "mc0: evicted %s, not heard from for %.3f s (TTL %.3f s)",
                    show_identity(session.identity),
                    now - session.last_in,
                    session.ttl,
                )
                continue
            if now >= session.last_out + NOOP_AFTER * session.ttl:
                out.append((self.name, [session.identity, *mc0.noop()]))
                session.last_out = now
                counters["mc0_noops_sent"] += 1
            self._schedule(session)
        return out

    # ---- out ------------------------------------------------------------------------

    def on_published(self, event: Event) -> list[tuple[str, list[bytes]]]:
        """An event of the topic space: a MESSAGE to each session subscribed to its
        topic."""
        subs = self.subscribers.get(event.topic)
        if not subs:
            return []
        frames = mc0.message(event.topic, eventbus.as_raw(event), event.headers)
        now = self._now
        out = []
        for identity, session in subs.items():
            session.last_out = now
            out.append((self.name, [identity, *frames]))
        self.core.counters["mc0_messages_sent"] += len(out)
        return out

    def encode(self, effect: Effect) -> list[bytes] | None:
        return None  # no job effects are addressed to mc0 connectors

    def revoke(self, identity: bytes, now: float) -> bool:
        """The connector's key was revoked: its session ends at once (no MESSAGE
        more; what it sends is dropped by the guard)."""
        session = self.sessions.get(identity)
        if session is None:
            return False
        self._drop(session)
        return True

    def narrow(self, identity: bytes, roles: frozenset[str], now: float) -> None:
        """A key that lost the subscriber role keeps its session, not its SUBs."""
        session = self.sessions.get(identity)
        if session is not None and SUBSCRIBER not in roles:
            for topic in list(session.topics):
                self._unsubscribe(session, topic)

    def unroutable(self, identity: bytes, now: float) -> None:
        """The connector's socket is gone: so is its session."""
        self.core.counters["unroutable"] += 1
        session = self.sessions.get(identity)
        if session is not None:
            self._drop(session)

    def subscriber_count(self) -> int:
        """Sessions subscribed to at least one topic."""
        return sum(1 for s in self.sessions.values() if s.topics)

    def topic_stats(self) -> dict[str, int]:
        """Connected sessions, topics with subscribers, subscriptions."""
        return {
            "sessions": len(self.sessions),
            "topics": len(self.subscribers),
            "subscriptions": sum(len(subs) for subs in self.subscribers.values()),
        }
