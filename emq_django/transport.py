"""Every ZeroMQ socket emq opens is made here.

The broker's ports, the client, ``BrokerLink`` (job managers, worker processes,
the scheduler), the monitor client and the job-history forwarder all ask this
module for their sockets, so that a socket option that must hold everywhere
(linger, high-water marks, ROUTER_MANDATORY, CURVE keys and the ZAP domain) is
set in one place and cannot be forgotten by one of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from emq_django import wire
from emq_django.exceptions import HandshakeRefused
from emq_django.security.keys import CurveKeys

Socket = zmq.Socket[Any]
Context = zmq.Context[Any]


@dataclass(frozen=True, slots=True)
class SocketOptions:
    """What a socket needs beyond its kind. ``None`` leaves libzmq's default."""

    linger: int = 0  # ms; 0: a closed socket drops what it had queued
    identity: bytes | None = None
    sndhwm: int | None = None
    rcvhwm: int | None = None
    router_mandatory: bool = False  # EHOSTUNREACH instead of a silent drop
    xpub_verboser: bool = False  # an XPUB passes on every (un)subscription
    # CURVE: a server when ``curve.server`` is None, else a client of that server
    curve: CurveKeys | None = None
    # the ZAP domain (a bound socket's roles, security/zap.py); '' leaves it unset
    zap_domain: str = ""
    # connected to several brokers, of which only the active one binds (failover):
    # messages go to completed connections only (ZMQ_IMMEDIATE), and ZMTP heartbeats
    # drop the connection of a broker that stopped answering (paused, partitioned)
    failover: bool = False


# Failover (a comma-separated list of broker addresses, ``addresses``): a paused or
# partitioned broker's connection is dropped after HEARTBEAT_TIMEOUT_MS without a
# PONG, so that the socket's messages go to the live broker; libzmq tries each
# address again every RECONNECT_IVL_MS. One PING per HEARTBEAT_IVL_MS per idle
# connection: nothing on the hot path (a busy connection carries its own traffic).
HEARTBEAT_IVL_MS = 250
HEARTBEAT_TIMEOUT_MS = 1000
RECONNECT_IVL_MS = 100


def addresses(url: str) -> list[str]:
    """The broker addresses in ``url``: one, or a comma-separated list of brokers of
    which one is active (``tcp://a:47291,tcp://b:47291``). Blanks around each are
    ignored; an empty list is ``[url]`` (the connect then says what is wrong)."""
    found = [part.strip() for part in url.split(",") if part.strip()]
    return found or [url]


def is_failover(url: str) -> bool:
    """Whether ``url`` names several brokers (failover between them)."""
    return "," in url and len(addresses(url)) > 1


def make_socket(context: Context, kind: int, options: SocketOptions | None = None) -> Socket:
    """A new socket of ``kind`` (``zmq.DEALER``, ...) with ``options`` applied."""
    opts = options or SocketOptions()
    sock: Socket = context.socket(kind)
    sock.linger = opts.linger
    if opts.identity is not None:
        sock.identity = opts.identity
    if opts.sndhwm is not None:
        sock.sndhwm = opts.sndhwm
    if opts.rcvhwm is not None:
        sock.rcvhwm = opts.rcvhwm
    if opts.router_mandatory:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if opts.xpub_verboser:
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)
    if opts.curve is not None:
        _set_curve(sock, opts.curve)
    if opts.zap_domain:
        sock.zap_domain = opts.zap_domain.encode()
    if opts.failover:
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    return sock


def _connect_all(sock: Socket, url: str) -> None:
    """Connect ``sock`` to every address in ``url`` (one, or a failover list)."""
    for address in addresses(url):
        sock.connect(address)


def _options_for(url: str, options: SocketOptions | None) -> SocketOptions:
    """``options``, with ``failover`` when ``url`` names several brokers."""
    opts = options or SocketOptions()
    if not opts.failover and is_failover(url):
        opts = dataclasses.replace(opts, failover=True)
    return opts


def _set_curve(sock: Socket, keys: CurveKeys) -> None:
    """Keys go in before bind/connect: libzmq reads them at the handshake."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    if keys.server is None:
        sock.curve_server = True
        # no ZAP handler answering (it died, or was never started): refuse every
        # client, where libzmq would otherwise admit any key
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    else:
        sock.curve_serverkey = keys.server


def connect(context: Context, kind: int, url: str, options: SocketOptions | None = None) -> Socket:
    """A new socket connected to ``url`` (every broker of a failover list)."""
    sock = make_socket(context, kind, _options_for(url, options))
    try:
        _connect_all(sock, url)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


def bind(context: Context, kind: int, address: str, options: SocketOptions | None = None) -> Socket:
    """A new socket bound to ``address``; raises ``zmq.ZMQError`` (e.g. address in use)."""
    sock = make_socket(context, kind, options)
    try:
        sock.bind(address)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


# ---- the handshakes of a connecting socket ------------------------------------------

HANDSHAKE_EVENTS = int(
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_NO_DETAIL = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_AUTH = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# a connection dropped (its peer closed it, or was silent past HEARTBEAT_TIMEOUT_MS):
# watched with several brokers, where the jobs sent on it are then known to be gone
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
# a connection attempt that failed before any handshake (nobody listens there)
CONNECT_RETRIED = int(zmq.EVENT_CONNECT_RETRIED)
_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
# handshakes failed in a row without a reason (the peer closed the connection
# mid-handshake) before it counts as a refusal: a broker that dies mid-handshake
# makes one; one that cannot read our HELLO (a wrong server key) makes one per
# reconnect, about every 0.1 s
NO_DETAIL_LIMIT = 3
_watch_ids = itertools.count()


class HandshakeWatch:
    """What libzmq says of one connecting socket's handshakes, read from the
    socket's monitor events (an inproc PAIR; the caller polls ``pair`` with the
    socket, or calls ``check()`` when it likes).

    libzmq 4.3 does not connect again after a ZAP refusal or a CURVE/plain-text
    mismatch: the socket is dead for good, sends queue for nobody and replies never
    come. ``check()`` raises ``HandshakeRefused`` then, with the reason, so that the
    caller can say so at once rather than after its time-out; the caller closes the
    socket (a fresh one tries again: the key may have been registered since)."""

    __slots__ = (
        "pair",
        "url",
        "public",
        "role",
        "succeeded",
        "handshakes",
        "disconnects",
        "live",
        "quiet_failures",
        "unreached",
        "sock",
        "events",
        "server_from",
        "failover",
    )

    def __init__(
        self,
        sock: Socket,
        url: str,
        curve: CurveKeys | None,
        role: str = "",
        events: int = HANDSHAKE_EVENTS,
    ) -> None:
        self.sock = sock
        if is_failover(url):
            events |= _DISCONNECTED
        self.events = events
        self.pair = self._monitor(events)  # before connect(): no event is missed
        self.url = url
        self.public = curve.public.decode() if curve is not None else ""
        self.server_from = curve.server_from if curve is not None else ""
        self.role = role  # the role the port admits, for the message ('' : any key)
        self.succeeded = False  # a handshake has succeeded (since the last failure)
        self.handshakes = 0  # handshakes that succeeded: one per connection (or again)
        # connections dropped after their handshake succeeded (counted with several
        # brokers only; not the attempts that never completed one, as to a paused
        # broker whose kernel accepts the connection), and the addresses of those
        # completed and not dropped (libzmq's events name the address they are of)
        self.disconnects = 0
        self.live: set[bytes] = set()
        self.quiet_failures = 0  # NO_DETAIL failures in a row
        # a connection attempt failed before any handshake (with CONNECT_RETRIED in
        # ``events``): nobody listens at ``url`` now
        self.unreached = False
        # several brokers (a failover list): one of them paused or cut off may fail
        # handshake after handshake without a reason (its kernel accepts the TCP
        # connection, nobody answers the greeting) while another serves, so such
        # failures are no refusal there; a refusal with a reason still is
        self.failover = is_failover(url)

    def _monitor(self, events: int) -> Socket:
        """Start (or replace) the socket's monitor; returns the PAIR its events come on."""
        address = f"inproc://emq-handshakes-{os.getpid()}-{next(_watch_ids)}"
        self.sock.monitor(address, events)
        pair: Socket = self.sock.context.socket(zmq.PAIR)
        pair.linger = 0
        # no high-water mark on the events' pipe (inproc: the sum of both ends'; 0
        # here makes it unbounded): libzmq sends monitor events blocking, from the
        # I/O thread, so a full pipe would stop that thread, and every socket of the
        # context with it, until someone reads. Events left unread cost memory
        # instead (tens of bytes each; the owner reads them on its next ``check()``)
        pair.rcvhwm = 0
        pair.connect(address)
        return pair

    def _stop_retries(self) -> None:
        """Watch handshakes only, from now on (with a new ``pair``: only for a watch
        whose owner does not poll ``pair`` itself, as the publisher's).
        CONNECT_RETRIED comes every reconnect interval, 100 ms, while nobody
        listens, and a publisher's socket may go unread for long (its thread idle
        or gone, its broker stopped): unread, they would pile up in ``pair``
        (unbounded, see ``_monitor``; with a bound, about 2,000 of them stopped the
        context's I/O thread for good). So once a handshake succeeded or nobody was
        found listening, its watch no longer asks for retries."""
        old = self.pair
        self.events &= ~CONNECT_RETRIED
        self.pair = self._monitor(self.events)  # replaces the old monitor
        old.close(linger=0)

    def check(self) -> None:
        """Read the events waiting (never blocks); raises ``HandshakeRefused`` when
        one says the broker refused this socket."""
        pair = self.pair
        while wire.readable(pair):
            frames = wire.recv(pair)
            if len(frames) != 2 or len(frames[0]) != 6:
                continue
            event, value = struct.unpack("=HI", frames[0])
            if event == _SUCCEEDED:
                self.live.add(frames[1])
                self.succeeded = True
                self.handshakes += 1
                self.quiet_failures = 0
            elif event == _AUTH:
                self.succeeded = False
                raise self.refusal("auth", value)
            elif event == _PROTOCOL:
                self.succeeded = False
                raise self.refusal("protocol", value)
            elif event == _NO_DETAIL:
                self.succeeded = False
                self.quiet_failures += 1
                if self.quiet_failures >= NO_DETAIL_LIMIT and not self.failover:
                    raise self.refusal("no-detail", value)
            elif event == _DISCONNECTED:
                if frames[1] in self.live:
                    self.live.discard(frames[1])
                    self.disconnects += 1
            elif event == CONNECT_RETRIED and not self.quiet_failures:
                self.unreached = True  # (after a failed handshake it says nothing new)
        if self.events & CONNECT_RETRIED and (self.succeeded or self.unreached):
            self._stop_retries()  # the outcome asked for is known

    def wait_outcome(self, timeout: float) -> None:
        """Wait up to ``timeout`` s until a handshake succeeds or nobody is found
        listening (``unreached``); raises ``HandshakeRefused`` when one is refused."""
        deadline = time.monotonic() + timeout
        self.check()
        while not self.succeeded and not self.unreached:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # ``self.pair`` is read each time: ``check()`` may have replaced it
            if _zmq_poll([(self.pair, _POLLIN)], max(int(left * 1000), 1)):
                self.check()

    def send(self, sock: Socket, frames: list[bytes], timeout_ms: int = -1) -> bool:
        """Send ``frames`` on the watched ``sock`` without ever blocking on a socket
        the broker refused: while it cannot take them, wait until it can or until
        the watch reports the refusal (``HandshakeRefused``). False when ``timeout_ms``
        (-1: no limit) passed first."""
        try:
            wire.send(sock, frames)
            return True
        except zmq.Again:
            pass
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            self.check()  # (may replace ``self.pair``)
            wait = -1 if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
            ready = _zmq_poll([(sock, _POLLOUT), (self.pair, _POLLIN)], wait)
            if ready and ready[0][0] is sock:
                try:
                    wire.send(sock, frames)
                    return True
                except zmq.Again:
                    continue
            if deadline is not None and time.monotonic() >= deadline:
                self.check()
                return False

    def refusal(self, kind: str, code: int) -> HandshakeRefused:
        url, key = self.url, self.public
        if kind == "auth":
            if code == 400:
                needs = f"the {self.role} role" if self.role else "to be registered"
                why = (
                    f"refused this process's CURVE key {key} (ZAP: 400 refused): the key is "
                    f"unknown there, revoked, or without a role the port admits (it needs "
                    f"{needs}; see `manage.py emq_keys list` on the broker's database)"
                )
            elif code == 500:
                why = (
                    f"could not check this process's CURVE key {key} (ZAP: 500, its key "
                    "handler failed; see the broker's log)"
                )
            else:
                why = f"refused this process's CURVE key {key} (ZAP: {code})"
            text = f"the broker at {url} {why}"
        elif kind == "protocol" and code == _MISMATCH:
            if key:
                text = (
                    f"the broker at {url} speaks plain text and this process CURVE "
                    "(EMQ_CURVE_SECRET_KEY is set): the handshake failed (mechanism mismatch)"
                )
            else:
                text = (
                    f"the broker at {url} requires CURVE and this process has no key: set "
                    "EMQ_CURVE_SECRET_KEY and EMQ_CURVE_SERVER_KEY (mechanism mismatch)"
                )
        elif kind == "protocol":
            text = (
                f"the handshake with the broker at {url} failed: libzmq protocol error 0x{code:08x}"
            )
        else:
            what = "CURVE handshake" if key else "handshake"
            text = (
                f"the {what} with the broker at {url} failed {self.quiet_failures} times in a "
                f"row, the broker closing the connection without a reason "
                f"({os.strerror(code) if 0 < code < 4096 else code})"
            )
            if key:
                text += (
                    ": is EMQ_CURVE_SERVER_KEY that broker's public key (and does it speak CURVE)?"
                )
                if self.server_from:
                    text += f" ({self.server_from})"
            else:  # a CURVE broker may close on a plain-text greeting before we read its own
                text += (
                    ": does it require CURVE? Then set EMQ_CURVE_SECRET_KEY and "
                    "EMQ_CURVE_SERVER_KEY"
                )
        return HandshakeRefused(text, url, kind, code)

    def close(self) -> None:
        """Stop the socket's monitor, then close the events' pipe; before the socket
        is closed. In this order because libzmq sends monitor events blocking, from
        its I/O thread, and keeps a closed socket's monitor until the socket is reaped
        (later, asynchronously): a handshake event for a pipe whose reader is gone
        stopped that thread, and every socket of the context with it, for good (a
        refused publisher's socket, closed and then retried, did it to a test's
        process: nothing of it connected anywhere again)."""
        sock = self.sock
        if not sock.closed:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self.pair.close(linger=0)


def connect_watched(
    context: Context,
    kind: int,
    url: str,
    options: SocketOptions | None = None,
    role: str = "",
    events: int = HANDSHAKE_EVENTS,
) -> tuple[Socket, HandshakeWatch]:
    """``connect()``, with a ``HandshakeWatch`` on the socket (``role``: the role
    the port admits, named in the refusal's message; ``events``: the monitor events
    it reads, ``HANDSHAKE_EVENTS`` and perhaps ``CONNECT_RETRIED``). ``url`` may
    list several brokers (``addresses``): the socket connects to each, with
    ``SocketOptions.failover``, and the watch counts a handshake per connection
    made (``handshakes``: a new one means another broker, or the same again)."""
    opts = _options_for(url, options)
    sock = make_socket(context, kind, opts)
    try:
        watch = HandshakeWatch(sock, url, opts.curve, role, events)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    try:
        _connect_all(sock, url)
    except zmq.ZMQError:
        watch.close()  # (first: HandshakeWatch.close)
        sock.close(linger=0)
        raise
    return sock, watch
