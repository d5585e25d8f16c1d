"""Subscribing: ``subscribe()`` / ``asubscribe()`` and the ``Subscription``
that reads live events and asks the snapshot port for what it missed.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import zmq
import zmq.asyncio
from zmq.backend import Socket as _BackendSocket

from emq_django import transport, wire
from emq_django.conf import cached_settings
from emq_django.pubsub.addresses import _live_url, _url
from emq_django.pubsub.clone import CloneState, Expired, _yielded
from emq_django.pubsub.received import Received, received
from emq_django.security.keys import FROM_SETTINGS, CurveKeys, resolve
from emq_django.transport import HandshakeWatch, SocketOptions

log = logging.getLogger(__name__)


# the backend's getsockopt: ZMQ_EVENTS as a plain int (as the broker's loop asks it)
_get: Callable[[zmq.Socket[Any], int], int] = _BackendSocket.get  # type: ignore[assignment]
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class Subscription:
    """``for event in emq.subscribe(...)``: blocks for the next event; ``close()``
    (or leaving a ``with`` block) ends it. ``last`` is the sequence to resume from."""

    def __init__(
        self,
        prefixes: Sequence[str],
        since: int | None = None,
        *,
        snapshot_url: str | None = None,
        publish_url: str | None = None,
        batch_url: str | None = None,
        idle_check: float = 1.0,
        rcvhwm: int | None = None,
        rcvbuf: int | None = None,
        context: zmq.Context[Any] | None = None,
        curve: CurveKeys | None | str = FROM_SETTINGS,
    ) -> None:
        """``curve``: CURVE keys, by default this process's (``EMQ_CURVE_*``); a
        broker refusing them makes ``next()`` raise ``HandshakeRefused``.
        ``rcvhwm``, ``rcvbuf``: the SUB socket's queue (messages) and kernel buffer
        (bytes); past them a slow subscriber misses live events and fills them in
        from the snapshot. Live events come from the broker's batch publisher
        (``batch_url``, else ``EMQ_BUS_BATCH_URL`` or ``EMQ_BUS_BATCH_BIND`` when
        no ``publish_url`` is given) when there is one, else from the Event BUS
        publisher (``publish_url``, else ``EMQ_BUS_PUBLISH_URL`` or ``_BIND``)."""
        settings = cached_settings()
        self.state = CloneState(prefixes, since)
        self.idle_check = idle_check
        live_url, batched = _live_url(settings, publish_url, batch_url)
        self._on_live = self.state.on_live_batch if batched else self._on_broadcast
        ctx = context or zmq.Context.instance()
        keys = resolve(curve)
        self.sub, sub_watch = _open_sub(ctx, live_url, self.state.prefixes, keys, rcvhwm, rcvbuf)
        try:
            self.snapshot, snap_watch = transport.connect_watched(
                ctx,
                zmq.DEALER,
                snapshot_url or _url(settings, "SNAPSHOT"),
                SocketOptions(curve=keys, identity=snapshot_identity()),
            )
        except BaseException:
            sub_watch.close()  # (first: HandshakeWatch.close)
            self.sub.close()
            raise
        self.watches = {sub_watch.pair: sub_watch, snap_watch.pair: snap_watch}
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(self.snapshot, zmq.POLLIN)
        for pair in self.watches:
            self.poller.register(pair, zmq.POLLIN)
        self._ready: deque[Received | Expired] = deque()
        self._rcvtimeo = -1  # the SUB socket's receive timeout now (ms; see _wait_live)
        self._heard = time.monotonic()
        # the first snapshot request leaves now: with since=None, "live" means the
        # events the broker numbers after it answers this request
        _ask_snapshot(self.snapshot, self.state.syncstart(self._heard))

    @property
    def last(self) -> int:
        return self.state.last

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for watch in self.watches.values():  # first: HandshakeWatch.close
            watch.close()
        self.sub.close()
        self.snapshot.close()

    def __iter__(self) -> Iterator[Received]:
        while True:
            event = self.next(timeout=None)
            if event is not None:
                yield event

    def next(self, timeout: float | None = None) -> Received | None:
        """The next event, or None after ``timeout`` seconds (None: wait for ever).
        Raises ``EventsExpired`` where events it needed had expired (the next call
        goes on after them)."""
        if self._ready:
            return self._pop()
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self.state
        while not self._ready:
            now = time.monotonic()
            if state.needs_sync(now, now - self._heard, self.idle_check) or state.wants_fill:
                if self._only_idle() and _get(self.sub, _EVENTS) & _POLLIN:
                    # not idle: events wait to be read (this process waited for a
                    # CPU); read them rather than ask the snapshot
                    self._heard = now
                else:
                    _ask_snapshot(self.snapshot, state.syncstart(now))
                    self._heard = now
            if deadline is not None and now >= deadline:
                return None
            wait = self.idle_check if deadline is None else min(self.idle_check, deadline - now)
            ms = int(max(wait, 0.0) * 1000) + 1
            if state.syncing_since is None:
                self._wait_live(ms)
                continue
            for sock, _ in self.poller.poll(ms):
                watch = self.watches.get(sock)
                if watch is not None:
                    watch.check()  # raises HandshakeRefused when the broker refused us
                    continue
                self._heard = time.monotonic()
                on = self._on_live if sock is self.sub else self._on_snapshot
                # read until EAGAIN: asking ZMQ_EVENTS before each message costs
                # more than the one failed recv at the end
                while True:
                    try:
                        frames = wire.recv(sock)
                    except zmq.Again:
                        break
                    self._ready += on(frames)
        return self._pop()

    def _pop(self) -> Received:
        item = self._ready.popleft()
        if type(item) is Expired:
            raise item.error()
        return item  # type: ignore[return-value]

    def _only_idle(self) -> bool:
        """A snapshot request is due only because nothing was heard for
        ``idle_check`` (not a first request, a lost one, a page or a gap)."""
        state = self.state
        return state.started and state.syncing_since is None and not state.more and not state.buffer

    def _wait_live(self, ms: int) -> None:
        """No snapshot answer is awaited: wait in a receive on the SUB socket alone,
        up to ``ms``, then take what else is there. At 1,000 events/s every event
        is a wake-up of its own, and a blocking receive costs about half the
        system calls of ``zmq_poll`` of two sockets (which asks each socket for
        ZMQ_EVENTS before and after it sleeps). An answer to an older snapshot
        request (asked again after SYNC_TIMEOUT) waits on the snapshot socket
        until the next request: one below ``last`` covers nothing new anyway."""
        sub = self.sub
        if self._rcvtimeo != ms:
            sub.rcvtimeo = self._rcvtimeo = ms
        try:
            frames = wire.recv(sub, nonblocking=False)
        except zmq.Again:  # the time is up: has the broker refused us meanwhile?
            for watch in self.watches.values():
                watch.check()  # raises HandshakeRefused
            return
        self._heard = time.monotonic()
        ready = self._ready
        on = self._on_live
        ready += on(frames)
        # one message is the usual case at a steady rate: ask once rather than
        # fail a receive (a Python exception); in a burst read until EAGAIN
        if _get(sub, _EVENTS) & _POLLIN:
            while True:
                try:
                    frames = wire.recv(sub)
                except zmq.Again:
                    break
                ready += on(frames)

    def _on_snapshot(self, frames: Sequence[bytes]) -> list[Received | Expired]:
        return [_yielded(e) for e in self.state.on_snapshot(frames)]

    def _on_broadcast(self, frames: Sequence[bytes]) -> list[Received]:
        return [received(e) for e in self.state.on_live(frames)]


def snapshot_identity() -> bytes:
    """A UTF-8 identity for a subscription's snapshot DEALER: the released Event BUS
    (Node) turns the identity into a string and routes its SYNCs back by it, so
    libzmq's automatic binary identity never got an answer."""
    return f"emq-sub-{os.getpid()}-{os.urandom(8).hex()}".encode()


def _ask_snapshot(snapshot: zmq.Socket[Any], frames: list[bytes]) -> None:
    """Send a snapshot request without ever blocking. A DEALER whose handshake the
    broker refused has no pipe left (libzmq does not connect again), and a blocking
    send on it waited for ever: under load the refusal came before the first
    request, and ``subscribe()`` hung instead of raising. A request that cannot
    leave now is asked again after ``SYNC_TIMEOUT``; a refusal is raised by the
    socket's watch, which the reader polls (``HandshakeRefused``)."""
    try:
        wire.send(snapshot, frames)
    except zmq.Again:
        pass


def _open_sub(
    ctx: zmq.Context[Any],
    url: str,
    prefixes: Sequence[str],
    keys: CurveKeys | None,
    rcvhwm: int | None = None,
    rcvbuf: int | None = None,
) -> tuple[zmq.Socket[Any], HandshakeWatch]:
    """A SUB socket to ``url`` subscribed to ``prefixes`` (all: none given), watched."""
    # (a failover list: each broker's publisher; only the active one binds)
    failover = transport.is_failover(url)
    options = SocketOptions(rcvhwm=rcvhwm, curve=keys, failover=failover)
    sub = transport.make_socket(ctx, zmq.SUB, options)
    if rcvbuf is not None:
        sub.rcvbuf = rcvbuf
    for prefix in prefixes or ("",):
        sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    try:
        watch = HandshakeWatch(sub, url, keys)
        for address in transport.addresses(url):
            sub.connect(address)
    except zmq.ZMQError:
        sub.close(linger=0)
        raise
    return sub, watch


def subscribe(
    prefixes: str | Sequence[str] = "", since: int | None = None, **kw: Any
) -> Subscription:
    """Events under ``prefixes`` (a prefix or several; ``""``: all): those above
    ``since`` that the broker keeps, then live ones; ``since=None``: live ones only,
    those numbered after the broker answers the subscription's first snapshot
    request (sent at once; pass a sequence number to be sure of where it starts)."""
    return Subscription([prefixes] if isinstance(prefixes, str) else list(prefixes), since, **kw)


async def asubscribe(
    prefixes: str | Sequence[str] = "",
    since: int | None = None,
    *,
    snapshot_url: str | None = None,
    publish_url: str | None = None,
    batch_url: str | None = None,
    idle_check: float = 1.0,
    curve: CurveKeys | None | str = FROM_SETTINGS,
) -> AsyncIterator[Received]:
    """``subscribe`` for asyncio: ``async for event in emq.asubscribe(...)``. Raises
    ``EventsExpired`` where events it needed had expired, which ends the iteration:
    subscribe again with ``since=exc.last`` to go on after them."""
    settings = cached_settings()
    state = CloneState([prefixes] if isinstance(prefixes, str) else list(prefixes), since)
    ctx = zmq.asyncio.Context.instance()
    keys = resolve(curve)
    live_url, batched = _live_url(settings, publish_url, batch_url)
    sub, sub_watch = _open_sub(ctx, live_url, state.prefixes, keys)
    snapshot: Any  # an asyncio socket (its context's)
    try:
        snapshot, snap_watch = transport.connect_watched(
            ctx,
            zmq.DEALER,
            snapshot_url or _url(settings, "SNAPSHOT"),
            SocketOptions(curve=keys, identity=snapshot_identity()),
        )
    except BaseException:
        sub_watch.close()  # (first: HandshakeWatch.close)
        sub.close()
        raise
    watches = {sub_watch.pair: sub_watch, snap_watch.pair: snap_watch}
    try:

        def on_broadcast(frames: Sequence[bytes]) -> list[Received]:
            return [received(e) for e in state.on_live(frames)]

        on_live = state.on_live_batch if batched else on_broadcast
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(snapshot, zmq.POLLIN)
        for pair in watches:
            poller.register(pair, zmq.POLLIN)
        heard = time.monotonic()
        while True:
            now = time.monotonic()
            if state.needs_sync(now, now - heard, idle_check) or state.wants_fill:
                _ask_snapshot(snapshot, state.syncstart(now))
                heard = now
            for sock, _ in await poller.poll(idle_check * 1000):
                watch = watches.get(sock)
                if watch is not None:
                    watch.check()  # raises HandshakeRefused when the broker refused us
                    continue
                heard = time.monotonic()
                frames = await sock.recv_multipart()
                if sock is sub:
                    for event in on_live(frames):
                        yield event
                else:
                    for item in state.on_snapshot(frames):
                        if type(item) is Expired:
                            raise item.error()
                        yield received(item)  # type: ignore[arg-type]
    finally:
        for watch in watches.values():  # first: HandshakeWatch.close
            watch.close()
        sub.close()
        snapshot.close()
